"""An evaluate sweep that survives interruption (issue 16): rows keyed by a
fingerprint of every parameter (a changed rerun never mixes its rows with
the old ones), written whole (no torn line), and SIGINT/SIGTERM stop it
within 5 s with no worker left behind."""
from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvldp.cli import commands as cli
from kvldp.pipelines import sweep

SWEEP = ["evaluate", "--mechanisms", "pckv-grr", "--epsilons", "1,2", "--repeats", "2", "--keys", "10",
         "--top", "5", "--parallel", "2", "--seed", "3", "--engine", "numpy"]


def rows(path) -> list[dict]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_a_rerun_with_changed_parameters_never_mixes_rows(tmp_path, capsys):
    out = tmp_path / "ev"
    assert cli.main([*SWEEP, "--users", "2000", "--out", str(out)]) == 0
    first = rows(out / "results.csv")
    assert {r["n_users"] for r in first} == {"2000"}
    assert "0 cells done, 4 to run" in capsys.readouterr().out
    assert cli.main([*SWEEP, "--users", "3000", "--out", str(out)]) == 0        # another sweep, same folder
    text = capsys.readouterr().out
    assert "0 cells done, 4 to run" in text and "8 (cell, post-processing) pairs of other parameters" in text
    assert {r["n_users"] for r in rows(out / "results.csv")} == {"3000"}
    assert len(rows(out / "results.csv")) == len(first)
    assert cli.main([*SWEEP, "--users", "2000", "--out", str(out)]) == 0        # back: nothing to run
    assert "4 cells done, 0 to run" in capsys.readouterr().out
    assert rows(out / "results.csv") == first
    # a mechanism option is a parameter too
    assert cli.main([*SWEEP, "--users", "2000", "--padding", "2", "--out", str(out)]) == 0
    assert "0 cells done, 4 to run" in capsys.readouterr().out


def test_a_torn_results_file_is_rebuilt_whole(tmp_path, capsys):
    out = tmp_path / "ev"
    assert cli.main([*SWEEP, "--users", "2000", "--out", str(out)]) == 0
    whole = (out / "results.csv").read_text()
    (out / "results.csv").write_text(whole[: len(whole) // 2])            # a kill in the middle of a line
    assert cli.main([*SWEEP, "--users", "2000", "--out", str(out)]) == 0
    assert (out / "results.csv").read_text() == whole


def test_fingerprints_follow_every_parameter():
    base = {"users": 10, "options": {"padding": 2}, "tops": (5,)}
    assert sweep.fingerprint(base) == sweep.fingerprint(dict(reversed(list(base.items()))))
    for changed in ({**base, "users": 11}, {**base, "options": {"padding": 3}}, {**base, "tops": (5, 10)}):
        assert sweep.fingerprint(changed) != sweep.fingerprint(base)


def children_of(pid: int) -> list[int]:
    """Every live descendant of ``pid`` (from /proc)."""
    parent = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z":
                parent[int(entry.name)] = int(fields[1])
    found, frontier = [], [pid]
    while frontier:
        p = frontier.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        found += kids
        frontier += kids
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@pytest.mark.skipif(not Path("/proc").exists(), reason="needs /proc")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_stops_the_sweep_within_5_s_and_leaves_no_worker(tmp_path, signum):
    out = tmp_path / "ev"
    argv = [sys.executable, "-m", "kvldp", "evaluate", "--mechanisms", "pckv-ue",
            "--epsilons", "1,2,3,4", "--repeats", "1", "--users", "3000000", "--keys", "100", "--parallel", "2",
            "--seed", "1", "--out", str(out)]
    job = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, "PYTHONUNBUFFERED": "1"})
    deadline = time.time() + 120
    while len(children_of(job.pid)) < 2:             # both workers up
        assert job.poll() is None and time.time() < deadline, job.communicate()
        time.sleep(0.2)
    time.sleep(6)                                     # the workers are inside their pipelines now
    workers = children_of(job.pid)
    assert job.poll() is None, "the sweep ended before it could be interrupted: make it longer"
    sent = time.time()
    job.send_signal(signum)
    _, err = job.communicate(timeout=30)
    took = time.time() - sent
    assert job.returncode == 130, err
    assert took < 5, f"{took:.1f} s to stop"
    assert f"stopped by {signal.Signals(signum).name}" in err and "rerun the same command" in err
    time.sleep(0.5)
    assert not [w for w in workers if alive(w)], "workers outlived the sweep"
    assert not (out / "results.csv").exists()         # never a results.csv that looks complete
    if (out / "results.partial.csv").exists():        # whole, whatever finished
        rows(out / "results.partial.csv")
