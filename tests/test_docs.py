"""The README stays a screen and the docs site stays whole (issue 41).

The README holds what kvldp is, the two set-up commands, one example per
command and links; everything else is a page of the docs site
(``mkdocs.yml``, built strictly in CI). These checks need no mkdocs: the
README's length, every page the nav names exists, and every relative link
of the README resolves to a file of the checkout.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
VERBS = ("simulate", "perturb", "collect", "publish", "stream", "query", "evaluate", "advise", "bench", "seed")


def nav_pages() -> list[str]:
    """Every page ``mkdocs.yml``'s nav names (read as text: the file has no YAML tags to resolve)."""
    text = (ROOT / "mkdocs.yml").read_text()
    nav = text[text.index("\nnav:"):]
    return re.findall(r"^\s+-\s+(?:[^:\n]+:\s+)?([\w./-]+\.md)\s*$", nav, flags=re.M)


def relative_links(text: str) -> list[str]:
    """The relative targets of the markdown links and images of a text, outside code blocks and spans."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    targets = re.findall(r"\]\(([^)\s]+)\)", text)
    return [t for t in targets if not re.match(r"^([a-z][a-z0-9+.-]*:|#|/)", t)]


def test_the_readme_fits_a_screen():
    lines = README.read_text().splitlines()
    assert len(lines) <= 100, f"README.md has {len(lines)} lines: move the detail into docs/"


def test_the_readme_has_one_example_per_command():
    text = README.read_text()
    blocks = "\n".join(re.findall(r"```bash\n(.*?)```", text, flags=re.S))
    missing = [verb for verb in VERBS if not re.search(rf"^kvldp {verb}\b", blocks, flags=re.M)]
    assert not missing, f"no README example of: {missing}"


def test_the_nav_names_pages_and_every_one_exists():
    pages = nav_pages()
    assert {"index.md", "commands.md", "streaming.md", "longitudinal.md", "deployment.md", "performance.md",
            "layout.md", "threat-model.md", "postprocess.md"} <= set(pages), pages
    missing = [page for page in pages if not (ROOT / "docs" / page).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"


@pytest.mark.parametrize("link", relative_links(README.read_text()))
def test_every_relative_link_of_the_readme_resolves(link):
    path = link.split("#")[0]
    assert (ROOT / path).exists(), f"README.md links {link!r}: {path} does not exist"


def test_the_readme_links_the_docs_pages():
    links = {link.split("#")[0] for link in relative_links(README.read_text())}
    for page in ("docs/commands.md", "docs/streaming.md", "docs/longitudinal.md", "docs/deployment.md",
                 "docs/performance.md", "docs/layout.md"):
        assert page in links, f"README.md does not link {page}"


def test_the_performance_page_copies_no_number_by_hand():
    """Its tables are generated from docs/figures/bench/*.csv by docs/hooks.py."""
    text = (ROOT / "docs" / "performance.md").read_text()
    assert "<!-- bench:ratios -->" in text and "<!-- bench:stream -->" in text
    assert not re.search(r"^\|\s*[-\w ()/`]+\|\s*[\d.,–]+\s*\|", text, flags=re.M), "a hand-copied table"
