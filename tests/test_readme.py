"""Every ``kvldp`` command of the README and of the docs pages runs (issue 16:
the README's ``--alpha`` example failed, its Clothing sweep needed 11 GB per
cell; issue 41 moved most commands into ``docs/``).

The commands are read from the ``bash`` blocks of the README and of
``COMMAND_PAGES``, in order and in
one working directory (later commands read what earlier ones wrote), and
run as printed except for their sizes: users, repeats and epsilons are cut
so the whole README runs in about a minute. The streaming demo needs a
Pub/Sub emulator and runs for minutes; ``tests/test_streaming.py`` runs
the same commands' flags against the emulator.
"""
from __future__ import annotations

import re
import shlex
import shutil
from pathlib import Path

import pytest

from kvldp.cli import commands as cli

ROOT = Path(__file__).resolve().parents[1]
STREAMING = ("stream", "publish")
# The README, then the docs pages its commands moved to (issue 41), read in this order.
COMMAND_PAGES = ("README.md", "docs/commands.md", "docs/streaming.md", "docs/longitudinal.md")


def readme_commands() -> list[str]:
    """The ``kvldp`` command lines of the bash blocks of the README and of the
    docs pages that hold commands (``COMMAND_PAGES``; continuations joined,
    comments dropped, ``a && b`` split), in order."""
    text = "\n".join((ROOT / page).read_text() for page in COMMAND_PAGES)
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", text, flags=re.S):
        for raw in block.replace("\\\n", " ").splitlines():
            line = raw.split(" # ")[0].split("  #")[0].strip()
            if not line or line.startswith("#"):
                continue
            for piece in line.split("&&"):
                part = piece.strip().removeprefix(".venv/bin/")
                if part.startswith("kvldp "):
                    commands.append(part)
    return commands


def small(argv: list[str]) -> list[str]:
    """The command at a small size: at most 20,000 users, one repeat, two
    epsilons, three collections, real datasets resampled to 3,000 users,
    bench once."""
    out = list(argv)

    def cap(flag, value):
        if flag in out:
            i = out.index(flag) + 1
            out[i] = value(out[i])
        return flag in out

    cap("--users", lambda v: str(min(int(v), 20_000)))
    cap("--repeats", lambda v: "1")
    cap("--epsilons", lambda v: ",".join(v.split(",")[:2]))
    cap("--collections", lambda v: "3")
    if out[0] == "evaluate" and "--preset" in out:
        out += ["--users", "20000", "--repeats", "1", "--epsilons", "1,4"]
        if out[out.index("--preset") + 1] == "longitudinal":
            out += ["--collections", "3"]
    if out[0] in ("simulate", "evaluate", "advise") and "clothing" in out:
        out += ["--resample-users", "3000"]
    if out[0] == "bench":
        out += ["--repeats", "1"]
        if "--sweep" in out:                       # two mechanisms, one size
            out += ["--mechanisms", "pckv-grr,privkvm", "--sizes", "3000"]
    return out


def test_the_readme_lists_the_commands_it_should():
    commands = readme_commands()
    names = {shlex.split(c)[1] for c in commands}
    assert {"simulate", "perturb", "collect", "query", "evaluate", "advise", "bench", "seed"} <= names
    assert not [c for c in commands if "…" in c], "a README command is incomplete"


def test_every_readme_command_runs(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    failures = []
    for command in readme_commands():
        argv = shlex.split(command)[1:]
        if argv[0] in STREAMING:
            continue
        code = cli.main(small(argv))
        err = capsys.readouterr().err
        if code != 0:
            failures.append(f"{command}\n  -> exit {code}: {err.strip()[-400:]}")
    assert not failures, "\n".join(failures)


@pytest.mark.parametrize("command", [c for c in readme_commands() if shlex.split(c)[1] in STREAMING])
def test_streaming_commands_parse(command):
    """The streaming demo's commands are at least valid command lines."""
    name, _, beam_args = cli.configure(shlex.split(command)[1:])
    assert name in STREAMING and not beam_args
