"""mkdocs hooks of the kvldp docs site (``mkdocs.yml``: ``hooks: [docs/hooks.py]``).

Three things are made at build time, so nothing here is edited by hand:

* **API reference**: one page per module of the ``kvldp`` package, found by
  walking ``kvldp/`` (a moved or added module needs no edit), rendered by
  mkdocstrings from the docstrings, and added to the nav.
* **Performance tables**: ``docs/performance.md`` holds the prose; every
  ``<!-- bench:NAME -->`` marker becomes a table read with the csv module
  from the bench CSVs in ``docs/figures/bench/``, and every ``[[NAME]]`` a
  number computed from them. A CSV there that no marker names is shown
  whole at ``<!-- bench:others -->``.
* **Links to the repository**: the pages are written for GitHub (relative
  links such as ``../deploy/flink/README.md``). The deploy READMEs become
  pages of the site (``deploy/…``); any other repository file a page links
  is copied beside the site (``repo/…``). A link to a file that does not
  exist is a warning, so ``mkdocs build --strict`` fails on it.
"""
from __future__ import annotations

import ast
import csv
import json
import logging
import posixpath
import re
from pathlib import Path

from mkdocs.structure.files import File, InclusionLevel

log = logging.getLogger("mkdocs.hooks.kvldp")

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
BENCH = DOCS / "figures" / "bench"
RELIABILITY = DOCS / "figures" / "reliability"
PACKAGE = "kvldp"
REFERENCE = "reference"
REPO_COPY = "repo"
MIRRORED = ("deploy/README.md", "deploy/flink/README.md", "deploy/dataflow/README.md", "deploy/kafka/README.md")

_LINK = re.compile(r"(?<!!)(\]\()([^)\s]+)(\))|(!\[[^\]]*\]\()([^)\s]+)(\))")
_FENCE = re.compile(r"^(```|~~~)")


# --- API reference -------------------------------------------------------------------------------------------


def _modules() -> list[str]:
    """Every importable module of the package, by walking its directory (``__main__`` excluded)."""
    found = []
    for path in sorted((ROOT / PACKAGE).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__main__" or any(p.startswith((".", "_")) and p != "__init__" for p in parts):
            continue
        if any(not (ROOT.joinpath(*parts[:i]) / "__init__.py").exists() for i in range(1, len(parts))):
            continue                                   # a directory that is not a package
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found.append(".".join(parts))
    return sorted(set(found), key=lambda m: m.split("."))


def _reference_uri(module: str) -> str:
    return f"{REFERENCE}/{module.replace('.', '/')}/index.md" if _is_package(module) \
        else f"{REFERENCE}/{module.replace('.', '/')}.md"


def _is_package(module: str) -> bool:
    return (ROOT.joinpath(*module.split(".")) / "__init__.py").exists()


def _reference_nav(modules: list[str]) -> list:
    """Nested nav entries: a package's page first, then its modules and subpackages."""
    def children(parent: str) -> list:
        depth = parent.count(".") + 1
        entries: list = []
        for module in modules:
            if module.startswith(parent + ".") and module.count(".") == depth:
                name = module.rsplit(".", 1)[1]
                if _is_package(module):
                    entries.append({name: [{"Overview": _reference_uri(module)}, *children(module)]})
                else:
                    entries.append({name: _reference_uri(module)})
        return entries

    return [{"Overview": f"{REFERENCE}/index.md"}, {PACKAGE: _reference_uri(PACKAGE)}, *children(PACKAGE)]


def on_config(config):
    nav = config.get("nav")
    if nav is not None:
        nav.append({"API reference": _reference_nav(_modules())})
        mirrored = [{title: uri} for title, uri in (("Overview (deploy/)", "deploy/README.md"),
                                                     ("Flink", "deploy/flink/README.md"),
                                                     ("Dataflow", "deploy/dataflow/README.md"),
                                                     ("Kafka", "deploy/kafka/README.md"))]
        for entry in nav:
            if isinstance(entry, dict) and "Deployment" in entry and isinstance(entry["Deployment"], list):
                entry["Deployment"].extend(mirrored)
    return config


def on_files(files, config):
    modules = _modules()
    listing = ["# API reference", "",
               "Generated from the docstrings of every module of the `kvldp` package at build time",
               "(`docs/hooks.py` walks `kvldp/`; the package's rooms are described in [Layout](../layout.md)).", ""]
    for module in modules:
        uri = _reference_uri(module)
        body = f"# `{module}`\n\n::: {module}\n"
        files.append(File.generated(config, uri, content=body))
        indent = "    " * (module.count("."))
        listing.append(f"{indent}* [`{module}`]({posixpath.relpath(uri, REFERENCE)})")
    files.append(File.generated(config, f"{REFERENCE}/index.md", content="\n".join(listing) + "\n"))
    for rel in MIRRORED:
        source = ROOT / rel
        if source.exists():
            files.append(File.generated(config, rel, content=source.read_text()))
        else:
            log.warning("%s is gone: update MIRRORED in docs/hooks.py", rel)
    return files


def _summary(module: str) -> str:
    """The first sentence-ish line of a module's docstring, read without importing it."""
    parts = module.split(".")
    path = ROOT.joinpath(*parts, "__init__.py") if _is_package(module) else ROOT.joinpath(*parts[:-1], parts[-1] + ".py")
    try:
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    except SyntaxError:
        log.warning("%s does not parse", path.relative_to(ROOT))
        return ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    return first.replace("|", "\\|")


def render_modules(page_uri: str) -> str:
    """A table of every module of the package with its docstring's first paragraph."""
    rows = []
    for module in _modules():
        link = posixpath.relpath(_reference_uri(module), posixpath.dirname(page_uri) or ".")
        rows.append([f"[`{module}`]({link})", _summary(module)])
    return _table(["module", "what it is"], rows)


# --- links -------------------------------------------------------------------------------------------------


def _repo_path_of(page_uri: str) -> str:
    """The repository path of a page's source (docs/… or a mirrored deploy/…/README.md)."""
    return page_uri if page_uri in MIRRORED else f"docs/{page_uri}"


def _site_uri(repo_path: str) -> str | None:
    if repo_path in MIRRORED:
        return repo_path
    if repo_path.startswith("docs/"):
        return repo_path[len("docs/"):]
    return None


def _rewrite_target(target: str, page, files, config) -> str:
    if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith(("#", "/")):
        return target
    path, sep, anchor = target.partition("#")
    page_repo = _repo_path_of(page.file.src_uri)
    repo_path = posixpath.normpath(posixpath.join(posixpath.dirname(page_repo), path))
    if repo_path.startswith(".."):
        log.warning("%s links %r, outside the repository", page.file.src_uri, target)
        return target
    on_disk = ROOT / repo_path
    site = _site_uri(repo_path)
    if site is not None and (files.get_file_from_path(site) is not None or (DOCS / site).is_dir()):
        if (DOCS / site).is_dir() and files.get_file_from_path(posixpath.join(site, "README.md")) is not None:
            site = posixpath.join(site, "README.md")
        elif (DOCS / site).is_dir() and files.get_file_from_path(posixpath.join(site, "index.md")) is not None:
            site = posixpath.join(site, "index.md")
        new = posixpath.relpath(site, posixpath.dirname(page.file.src_uri) or ".")
        return new + sep + anchor
    if not on_disk.exists():
        log.warning("%s links %r: %s does not exist", page.file.src_uri, target, repo_path)
        return target
    if on_disk.is_dir():
        readme = posixpath.join(repo_path, "README.md")
        if (ROOT / readme).exists():
            return _rewrite_target(posixpath.relpath(readme, posixpath.dirname(page_repo)) + sep + anchor,
                                   page, files, config)
        log.warning("%s links the directory %r, which has no README.md", page.file.src_uri, target)
        return target
    if on_disk.suffix == ".md":
        log.warning("%s links %r: a page outside docs/ (add it to MIRRORED in docs/hooks.py)",
                    page.file.src_uri, target)
        return target
    copy = f"{REPO_COPY}/{repo_path}"
    if files.get_file_from_path(copy) is None:
        files.append(File.generated(config, copy, abs_src_path=str(on_disk), inclusion=InclusionLevel.NOT_IN_NAV))
    return posixpath.relpath(copy, posixpath.dirname(page.file.src_uri) or ".") + sep + anchor


def _rewrite_links(markdown: str, page, files, config) -> str:
    out, fenced = [], False
    for line in markdown.split("\n"):
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
        if not fenced and "](" in line:
            def sub(m):
                if m.group(1):
                    return m.group(1) + _rewrite_target(m.group(2), page, files, config) + m.group(3)
                return m.group(4) + _rewrite_target(m.group(5), page, files, config) + m.group(6)
            line = _LINK.sub(sub, line)
        out.append(line)
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):
    if page.file.src_uri.startswith(REFERENCE + "/"):
        return markdown
    if page.file.src_uri == "performance.md":
        markdown = render_performance(markdown)
    if page.file.src_uri == "reliability.md":
        markdown = render_reliability(markdown)
    if "<!-- layout:modules -->" in markdown:
        markdown = markdown.replace("<!-- layout:modules -->", render_modules(page.file.src_uri))
    return _rewrite_links(markdown, page, files, config)


# --- performance ------------------------------------------------------------------------------------------


def _read(path: Path) -> list[dict]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def _num(text: str) -> float:
    return float(text)


def _fmt(x: float, digits: int = 2) -> str:
    if x == 0:
        return "0"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    if abs(x) >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}f}" if abs(x) >= 10 ** -digits else f"{x:.{digits}g}"


def _span(values: list[float], digits: int = 2) -> str:
    lo, hi = min(values), max(values)
    return _fmt(lo, digits) if _fmt(lo, digits) == _fmt(hi, digits) else f"{_fmt(lo, digits)}–{_fmt(hi, digits)}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def _power(n: str) -> str:
    value = int(n)
    exponent = len(str(value)) - 1
    return f"10^{exponent}" if value == 10 ** exponent else f"{value:,}"


def _bench_rows(path: Path) -> list[dict]:
    return [r for r in _read(path) if not r.get("error")]


def _ratios(rows: list[dict]) -> str:
    sizes = sorted({r["users"] for r in rows}, key=int)
    out = []
    for label, path in (("tuned local runner (`beam`)", "beam"), ("stock Beam (`beam-stock`)", "beam-stock")):
        cells = [label]
        for n in sizes:
            picked = [r for r in rows if r["path"] == path and r["users"] == n]
            if not picked:
                cells.append("–")
                continue
            ratios = {r["mechanism"]: _num(r["ratio_beam_numpy"]) for r in picked}
            lo = min(ratios, key=ratios.get)
            hi = max(ratios, key=ratios.get)
            cells.append(f"{_span(list(ratios.values()))} (lowest {lo}, highest {hi})")
        out.append(cells)
    return _table(["Beam / NumPy"] + [_power(n) for n in sizes], out)


def _bench_full(rows: list[dict]) -> str:
    by = {(r["mechanism"], r["users"], r["path"]): r for r in rows}
    mechanisms = sorted({r["mechanism"] for r in rows})
    sizes = sorted({r["users"] for r in rows}, key=int)
    table = []
    for m in mechanisms:
        for n in sizes:
            numpy, beam, stock = (by.get((m, n, p)) for p in ("numpy", "beam", "beam-stock"))
            if not (numpy or beam or stock):
                continue

            def get(r, column, digits=3):
                return _fmt(_num(r[column]), digits) if r and r.get(column) not in (None, "") else "–"
            table.append([m, _power(n), get(numpy, "seconds"), get(beam, "seconds"), get(stock, "seconds"),
                          get(beam, "ratio_beam_numpy"), get(stock, "ratio_beam_numpy"),
                          get(beam, "graph_seconds"), get(beam, "stages_seconds"),
                          get(beam, "users_per_s"), get(beam, "peak_rss_mb"),
                          (beam or numpy or stock).get("identical", "")])
    return _table(["mechanism", "users", "NumPy s", "Beam s", "stock Beam s", "Beam/NumPy", "stock/NumPy",
                   "graph s", "stages s", "Beam users/s", "Beam peak RSS MB", "identical"], table)


def _stream(rows: list[dict]) -> str:
    names = {"pubsub": "Pub/Sub emulator", "kafka": "Kafka"}
    table = []
    for r in rows:
        runner = "Flink mini-cluster" if r["runner"] == "Flink" else r["runner"]
        table.append([f"{runner} ({names.get(r['source'], r['source'])})", r["parallelism"],
                      f"{int(_num(r['pane_per_s'])):,}", f"{int(_num(r['pane_per_core_per_s'])):,}",
                      f"{int(_num(r['accepted_per_s'])):,}",
                      f"{r['latency_p50_s']} / {r['latency_p95_s']} / {r['latency_max_s']}",
                      r["latency_batches"], f"{r['startup_s']} s"])
    return _table(["runner (source)", "parallelism", "reports/s to a pane", "per core", "accepted/s",
                   "latency median / p95 / max (s)", "batches timed", "job up in"], table)


def _peers(rows: list[dict]) -> str:
    table = [[r["who"], r["oracle"].upper(), _power(r["users"]),
              _fmt(_num(r["seconds"]), 1) if r["seconds"] else "–", r.get("error") or ""] for r in rows]
    return _table(["who", "oracle", "users", "seconds (whole command)", "error"], table)


def _kernels(rows: list[dict]) -> str:
    table = [[r["oracle"].upper(), _power(r["users"]), r["d"], r["epsilon"],
              f"{int(_num(r['kvldp_users_per_s'])):,}", f"{int(_num(r['floor_users_per_s'])):,}",
              f"{_num(r['floor_over_kvldp']):.2f}×"] for r in rows]
    return _table(["oracle", "users", "d", "ε", "kvldp users/s", "NumPy floor users/s",
                   "kvldp's time / the floor's"], table)


def _large(directory: Path) -> str:
    parts = []
    for sub in sorted(p for p in directory.iterdir() if (p / "bench.csv").exists()):
        rows = _bench_rows(sub / "bench.csv")
        table = [[r["mechanism"], _power(r["users"]), r["path"], r["seconds"], f"{int(_num(r['users_per_s'])):,}",
                  r["peak_rss_mb"], r["batch"], r["ratio_beam_numpy"]] for r in rows]
        parts.append(f"`{sub.relative_to(DOCS).as_posix()}/bench.csv`:\n\n"
                     + _table(["mechanism", "users", "path", "seconds", "users/s", "peak RSS MB", "batch",
                               "Beam/NumPy"], table))
    return "\n\n".join(parts)


def _generic(path: Path) -> str:
    rows = _read(path)
    if not rows:
        return f"`{path.relative_to(DOCS).as_posix()}`: no rows."
    header = list(rows[0])
    return f"`{path.relative_to(DOCS).as_posix()}`:\n\n" + _table(header, [[r[h] for h in header] for r in rows])


def _values(bench: list[dict], peers: list[dict], kernels: list[dict]) -> dict[str, str]:
    values: dict[str, str] = {}
    values["peak_rss_gb"] = _span([_num(r["peak_rss_mb"]) / 1000 for r in bench])
    million = [r for r in bench if r["path"] == "beam" and r["users"] == "1000000" and r["graph_seconds"]]
    short = [_num(r["graph_seconds"]) for r in million if r["mechanism"] != "privkvm-plus"]
    plus = [r for r in million if r["mechanism"] == "privkvm-plus"]
    values["graph_1e6_short"] = _span(short, 3)
    values["graph_1e6_plus"] = _fmt(_num(plus[0]["graph_seconds"]), 3) if plus else "–"
    numpy_plus = [r for r in bench if r["mechanism"] == "privkvm-plus" and r["users"] == "1000000"
                  and r["path"] == "numpy"]
    values["numpy_1e6_plus"] = _fmt(_num(numpy_plus[0]["seconds"]), 3) if numpy_plus else "–"
    for path, name in (("numpy", "numpy"), ("beam", "tuned"), ("beam-stock", "stock")):
        r = [x for x in bench if x["mechanism"] == "privkvm-plus" and x["users"] == "10000000" and x["path"] == path]
        values[f"plus_1e7_{name}"] = _fmt(_num(r[0]["seconds"]), 2) if r else "–"
    for r in peers:
        who = r["who"]
        key = ("kvldp_raw" if "raw" in who else "kvldp_default" if "kvldp" in who else
               who.replace("-", "_"))
        values[f"peer_{r['oracle']}_{r['users']}_{key}"] = _fmt(_num(r["seconds"]), 1) if r["seconds"] else "–"
    added = []
    for oracle, users in {(r["oracle"], r["users"]) for r in peers}:
        pair = {("raw" if "raw" in r["who"] else "default"): _num(r["seconds"]) for r in peers
                if r["oracle"] == oracle and r["users"] == users and "kvldp" in r["who"] and r["seconds"]}
        if len(pair) == 2:
            added.append(pair["default"] - pair["raw"])
    values["peer_pp_added"] = _span(added, 1) if added else "–"
    large = BENCH / "large-domains"
    for sub in sorted(p for p in large.iterdir() if (p / "bench.csv").exists()) if large.exists() else []:
        rows = [r for r in _bench_rows(sub / "bench.csv") if r["mechanism"] in ("pckv-ue", "ks-ue")]
        top = max((int(r["users"]) for r in rows), default=0)
        rows = [r for r in rows if int(r["users"]) == top]

        def rounded(x):
            return round(x, -2) if x >= 1000 else round(x, -1)
        for path in ("numpy", "beam"):
            picked = [r for r in rows if r["path"] == path]
            if picked:
                values[f"large_{sub.name}_{path}_users_per_s"] = _span(
                    [rounded(_num(r["users_per_s"])) for r in picked])
                values[f"large_{sub.name}_{path}_rss_gb"] = _span([_num(r["peak_rss_mb"]) / 1000 for r in picked])
        ratios = [_num(r["ratio_beam_numpy"]) for r in rows if r["path"] == "beam"]
        if ratios:
            values[f"large_{sub.name}_ratio"] = _span(ratios, 1)
    for r in kernels:
        values[f"kernel_{r['oracle']}"] = f"{_num(r['floor_over_kvldp']):.2f}"
    return values


def render_performance(markdown: str) -> str:
    used: set[Path] = set()

    def need(name: str) -> Path:
        path = BENCH / name
        if not path.exists():
            log.warning("performance.md: %s is missing", path.relative_to(ROOT))
        used.add(path)
        return path

    bench = _bench_rows(need("bench.csv"))
    stream = _read(need("stream_bench.csv"))
    peers = _read(need("peers.csv"))
    kernels = _read(need("kernels.csv"))
    large = BENCH / "large-domains"
    used.update(large.rglob("*.csv"))
    tables = {
        "ratios": lambda: _ratios(bench),
        "full": lambda: _bench_full(bench),
        "stream": lambda: _stream(stream),
        "peers": lambda: _peers(peers),
        "kernels": lambda: _kernels(kernels),
        "large-domains": lambda: _large(large),
        "others": lambda: "\n\n".join(_generic(p) for p in sorted(BENCH.rglob("*.csv")) if p not in used)
        or "(none: every CSV of docs/figures/bench/ is in a table above)",
    }
    values = _values(bench, peers, kernels)

    def table(m):
        name = m.group(1)
        if name not in tables:
            log.warning("performance.md: no table named %r (known: %s)", name, ", ".join(tables))
            return m.group(0)
        return tables[name]()

    def value(m):
        name = m.group(1)
        if name not in values:
            log.warning("performance.md: no value named %r (known: %s)", name, ", ".join(sorted(values)))
            return m.group(0)
        return values[name]

    markdown = re.sub(r"<!--\s*bench:([\w-]+)\s*-->", table, markdown)
    return re.sub(r"\[\[([\w-]+)\]\]", value, markdown)


if __name__ == "__main__":                              # print the generated tables
    print(render_performance("\n\n".join(f"<!-- bench:{n} -->" for n in
                                         ("ratios", "full", "stream", "peers", "kernels", "large-domains", "others"))))


# --- reliability ------------------------------------------------------------------------------------------


def _summary_json(name: str) -> dict:
    path = RELIABILITY / name
    if not path.exists():
        log.warning("reliability.md: %s is missing", path.relative_to(ROOT))
        return {}
    return json.loads(path.read_text())


def render_reliability(markdown: str) -> str:
    """The campaign's tables, from the summaries its tests wrote (``KVLDP_FUZZ_SUMMARY``,
    ``KVLDP_CRASH_SUMMARY``, ``KVLDP_STREAM_CRASH_SUMMARY``) and copied to docs/figures/reliability/."""
    fuzz = _summary_json("fuzz.json")
    rows = [[parser, f"{v['cases']:,}", ", ".join(f"{k} {n:,}" for k, n in sorted(v["outcomes"].items())),
             "0", f"{v['seconds']:.0f} s"] for parser, v in sorted(fuzz.items())]
    fuzz_table = _table(["input", "cases", "outcomes", "crashes outstanding", "time"], rows)
    crash = _summary_json("crash.json")
    rows = [[job, v["kill points"], v["killed before it finished"], v["reruns needing --overwrite"],
             f"{v['reruns identical']} of {v['kill points']}", v["left partial output"],
             f"{v['uncrashed seconds']} s"] for job, v in sorted(crash.items())]
    stream = _summary_json("stream_crash.json")
    if stream:
        restores = stream.get("restores from a checkpoint (checkpoints API)", stream.get("restores"))
        rows.append(["stream (Flink TaskManager)", stream["kills"], restores, "–",
                     f"{stream['windows checked']} of {stream['windows']} windows = collect",
                     f"lost {stream['reports lost']}, twice {stream['reports counted twice']}",
                     f"{stream['seconds']} s"])
    crash_table = _table(["command", "SIGKILL points", "killed mid-run / restored", "reruns asked for --overwrite",
                          "reruns byte-identical", "partial files under final names", "run time"], rows)
    return (markdown.replace("{{ reliability_fuzz_table }}", fuzz_table)
            .replace("{{ reliability_crash_table }}", crash_table))
