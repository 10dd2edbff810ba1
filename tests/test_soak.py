"""Soak: the same local job many times, each in its own watched subprocess
(issue 15, item 2). Slow; run with

    KVLDP_SOAK_RUNS=20 python -m pytest -m slow tests/test_soak.py -s

Beam's ``multi_threading`` local runner flushed its data plane from a timer
thread in the middle of an element, so identical jobs intermittently ran
away in memory (20+ GB) or died with ``Unknown type tag``. The CLI now
defaults to ``in_memory``; these tests check, over many identical runs, that
every run exits 0, every run writes identical results for the fixed seed,
and no run's peak RSS passes the cap.

Each run is a child process in its own session. A watchdog thread sums the
RSS of every process in that session every 0.1 s and kills the session when
the sum passes the hard limit (a runaway grows ~300 MB/s, so it is caught
long before it eats the machine); the peak reported is the larger of that
polled peak and the child's ``ru_maxrss`` from ``wait4`` (exact, kernel
kept). A child also dies with the test process (``PR_SET_PDEATHSIG``).
Linux only (``/proc``); only the standard library is used (no psutil).

Environment:
  KVLDP_SOAK_RUNS        runs per job (default 20)
  KVLDP_SOAK_RSS_CAP_MB  asserted peak RSS per run (default 1536; measured 0.2-0.4 GB)
  KVLDP_SOAK_KILL_MB     hard limit: the run is killed above it (default 6144)
  KVLDP_SOAK_TIMEOUT_S   a run taking longer is killed (default 600)
  KVLDP_SOAK_BEAM_ARGS   extra Beam options for every run, e.g.
                         "--direct_running_mode multi_threading" (to watch the old default fail)
"""
from __future__ import annotations

import dataclasses
import hashlib
import os
import shlex
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from kvldp.datasets import shared_data_dir
from sessions import REPO, die_with_parent, kill_group, session_rss_mb

pytestmark = pytest.mark.slow

RUNS = int(os.environ.get("KVLDP_SOAK_RUNS", "20"))
CAP_MB = float(os.environ.get("KVLDP_SOAK_RSS_CAP_MB", "1536"))
KILL_MB = float(os.environ.get("KVLDP_SOAK_KILL_MB", "6144"))
TIMEOUT_S = float(os.environ.get("KVLDP_SOAK_TIMEOUT_S", "600"))
BEAM_ARGS = shlex.split(os.environ.get("KVLDP_SOAK_BEAM_ARGS", ""))


@dataclasses.dataclass
class Run:
    """One watched subprocess."""

    returncode: int
    peak_mb: float
    seconds: float
    killed: str = ""            # why the watchdog killed it, if it did
    stderr_tail: str = ""


def run_watched(cmd: list[str], cwd: Path, log: Path) -> Run:
    """Run ``cmd`` in a new session with stdout/stderr in ``log``.out/.err,
    killing the whole session above ``KILL_MB`` or after ``TIMEOUT_S``."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
           "TMPDIR": str(cwd)}               # Beam/kvldp scratch dirs go away with tmp_path
    start = time.monotonic()
    with open(f"{log}.out", "wb") as out, open(f"{log}.err", "wb") as err:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=out, stderr=err, start_new_session=True,
                                preexec_fn=die_with_parent)  # noqa: PLW1509 -- only prctl, no Popen equivalent
    done, killed, polled = threading.Event(), [], [0.0]

    def watch():
        while not done.wait(0.1):
            rss = session_rss_mb(proc.pid)
            polled[0] = max(polled[0], rss)
            reason = (f"RSS {rss:.0f} MB > hard limit {KILL_MB:.0f} MB" if rss > KILL_MB else
                      f"still running after {TIMEOUT_S:.0f} s" if time.monotonic() - start > TIMEOUT_S else "")
            if reason:
                killed.append(reason)
                kill_group(proc.pid)
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)   # reaped here: Popen must not wait again
    done.set()
    watcher.join()
    kill_group(proc.pid)                   # leftovers (e.g. worker processes) of this run only
    seconds = time.monotonic() - start
    peak = max(usage.ru_maxrss / 1024, polled[0])         # ru_maxrss is in KiB on Linux
    tail = Path(f"{log}.err").read_text(errors="replace")[-2000:] if proc.returncode else ""
    return Run(proc.returncode, peak, seconds, killed[0] if killed else "", tail)


def kvldp(*args: str) -> list[str]:
    return [sys.executable, "-m", "kvldp", *args, *BEAM_ARGS]


def _digest(*paths: Path) -> str:
    h = hashlib.sha256()
    for p in paths:
        h.update(p.name.encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def _report_digest(directory: Path) -> str:
    """Digest of the report *records* (Avro files carry a random sync marker,
    so their bytes differ between identical runs) and of the key dictionary."""
    import fastavro

    h = hashlib.sha256()
    files = sorted(directory.glob("R-*.avro"))
    assert files, f"no report files in {directory}"
    for f in files:
        with open(f, "rb") as fh:
            reader = fastavro.reader(fh)
            h.update(f.name.encode() + repr(sorted(reader.metadata.items())).encode())
            for record in reader:
                h.update(repr(record).encode())
    h.update((directory / "R.keys.txt").read_bytes())
    return h.hexdigest()


def summarise(job: str, runs: list[Run], failures: list[str]) -> str:
    peaks = [r.peak_mb for r in runs]
    walls = [r.seconds for r in runs]
    mode = " ".join(BEAM_ARGS) or "default runner"
    line = (f"SOAK {job} [{mode}]: runs={len(runs)} failures={len(failures)} "
            f"peak_rss_mb max={max(peaks):.0f} median={statistics.median(peaks):.0f} min={min(peaks):.0f} "
            f"(cap {CAP_MB:.0f}, kill {KILL_MB:.0f}) wall_s median={statistics.median(walls):.1f} "
            f"max={max(walls):.1f} total={sum(walls):.0f}")
    print("\n" + line, flush=True)
    for f in failures:
        print("  " + f.replace("\n", "\n    "), flush=True)
    return line


def part_line(what: str, runs: list[Run]) -> str:
    """Peak RSS and wall time of one step of a job (e.g. perturb of perturb+collect)."""
    peaks, walls = [r.peak_mb for r in runs], [r.seconds for r in runs]
    line = (f"  {what}: n={len(runs)} peak_rss_mb max={max(peaks):.0f} median={statistics.median(peaks):.0f} "
            f"wall_s median={statistics.median(walls):.1f} max={max(walls):.1f}")
    print(line, flush=True)
    return line


def check(job: str, runs: list[Run], digests: list[str | None], failures: list[str],
          parts: dict[str, list[Run]] | None = None):
    summarise(job, runs, failures)
    for what, part in (parts or {}).items():
        if part:
            part_line(what, part)
    assert len(runs) == RUNS
    assert not failures, f"{job}: {len(failures)} of {RUNS} runs failed: {failures[:3]}"
    over = [f"run {i}: {r.peak_mb:.0f} MB" for i, r in enumerate(runs) if r.peak_mb > CAP_MB]
    assert not over, f"{job}: peak RSS over the {CAP_MB:.0f} MB cap: {over}"
    assert None not in digests
    distinct = sorted(set(digests))
    assert len(distinct) == 1, (f"{job}: {len(distinct)} different results from one seed: "
                                f"{[digests.index(d) for d in distinct]} are the first runs of each")


def _failure(i: int, what: str, run: Run) -> str | None:
    if run.returncode == 0 and not run.killed:
        return None
    return (f"run {i} {what}: exit {run.returncode} {run.killed} peak {run.peak_mb:.0f} MB "
            f"after {run.seconds:.0f} s\n{run.stderr_tail[-600:]}")


@pytest.fixture(scope="module")
def clothing_path() -> Path:
    path = shared_data_dir() / "clothing_rating.mat"
    if not path.exists():
        pytest.skip(f"Clothing data not found at {path} (set KVLDP_DATA_DIR)")
    return path


def test_soak_simulate_clothing(tmp_path, clothing_path):
    runs, digests, failures = [], [], []
    for i in range(RUNS):
        work = tmp_path / f"run{i:02d}"
        work.mkdir()
        out = work / "est.jsonl"
        run = run_watched(kvldp("simulate", "--mechanism", "pckv-grr", "--epsilon", "2", "--dataset", "clothing",
                                "--dataset-path", str(clothing_path), "--seed", "7", "--output", str(out)),
                          work, work / "simulate")
        runs.append(run)
        failure = _failure(i, "simulate", run)
        if failure is None and not out.exists():
            failure = f"run {i}: exit 0 but no {out.name}"
        if failure is None:
            lines = out.read_bytes().splitlines()
            if len(lines) != 5850 or b'"n_reports": 105508' not in lines[0]:
                failure = f"run {i}: {len(lines)} estimate records, first {lines[:1]}"
        failures += [failure] if failure else []
        digests.append(None if failure else _digest(out))
    check("simulate pckv-grr clothing", runs, digests, failures)


N_USERS, PER_USER, N_ITEMS = 100_000, 5, 10_000


def ratings_file(path: Path, users: int, per_user: int, items: int, seed: int, shuffle: bool = False,
                 id_step: int = 1, first_id: int = 0) -> Path:
    """``users`` x ``per_user`` distinct items each (of ``items``), ratings
    1..5, one user after another or (``shuffle``) rows in random order; user
    ``u``'s id is ``first_id + u * id_step``."""
    rng = np.random.default_rng(seed)
    first = rng.integers(0, items, users)[:, None]
    # strictly increasing offsets below items: per_user distinct items per user
    steps = np.cumsum(rng.integers(1, items // per_user, (users, per_user)), axis=1)
    chosen = (first + steps) % items
    assert (np.diff(np.sort(chosen, axis=1), axis=1) > 0).all()
    rows = np.column_stack([np.repeat(first_id + np.arange(users) * id_step, per_user), chosen.ravel(),
                            rng.integers(1, 6, users * per_user)])
    if shuffle:
        rows = rows[rng.permutation(len(rows))]
    with open(path, "w") as fh:
        fh.write("user,item,rating\n")
        np.savetxt(fh, rows, fmt="%d", delimiter=",")
    return path


@pytest.fixture(scope="module")
def ratings_csv(tmp_path_factory) -> Path:
    """10^5 users x 5 distinct items each (of 10^4), ratings 1..5."""
    return ratings_file(tmp_path_factory.mktemp("ratings") / "ratings.csv", N_USERS, PER_USER, N_ITEMS, 20240515)


def test_soak_perturb_then_collect_csv(tmp_path, ratings_csv):
    """The worst case of the issue: ingest of a ratings CSV without
    ``--key-dictionary`` (a dictionary pre-pass job, then the perturb job),
    then the collector."""
    mech = ["--mechanism", "pckv-grr", "--epsilon", "2", "--padding", "5"]
    n_rows = N_USERS * PER_USER
    runs, digests, failures, parts = [], [], [], {"perturb": [], "collect": []}
    for i in range(RUNS):
        work = tmp_path / f"run{i:02d}"
        (work / "out").mkdir(parents=True)
        perturb = run_watched(kvldp("perturb", *mech, "--input", str(ratings_csv), "--rating-range", "1,5",
                                    "--seed", "3", "--output", str(work / "out" / "R.avro")),
                              work, work / "perturb")
        failure = _failure(i, "perturb", perturb)
        summary = f"rows read {n_rows} = accepted {n_rows} + rejected 0 [ok]"
        if failure is None and summary not in (work / "perturb.out").read_text():
            failure = f"run {i} perturb: no '{summary}' in its output"
        collect = None
        if failure is None:
            est = work / "est.jsonl"
            collect = run_watched(kvldp("collect", *mech, "--input", str(work / "out" / "R*.avro"),
                                        "--key-dictionary", str(work / "out" / "R.keys.txt"),
                                        "--output", str(est)),
                                  work, work / "collect")
            failure = _failure(i, "collect", collect)
            if failure is None and len(est.read_bytes().splitlines()) != N_ITEMS:
                failure = f"run {i} collect: not {N_ITEMS} estimate records"
        parts["perturb"].append(perturb)
        parts["collect"] += [collect] if collect else []
        runs.append(Run(perturb.returncode or (collect.returncode if collect else 0),
                        max(perturb.peak_mb, collect.peak_mb if collect else 0),
                        perturb.seconds + (collect.seconds if collect else 0)))
        failures += [failure] if failure else []
        digests.append(None if failure else _report_digest(work / "out") + _digest(work / "est.jsonl"))
    check("perturb+collect pckv-grr csv 1e5x5", runs, digests, failures, parts)


GROWTH_MB_PER_M_ROWS = 85     # measured: ~250 through the runner's grouping, ~38 spilled


def test_ingest_memory_does_not_grow_with_the_rows(tmp_path):
    """``perturb`` of a ratings file (its dictionary pre-pass and its
    grouping of every user's rows included) takes little more memory for 8x
    the rows: the local runner's GroupByKey held every row, ~250 MB more per
    million rows (5M rows: 1.36 GB), and its rows now wait on disk
    (``transforms/spill.py``: 5M rows in 0.49 GB)."""
    peaks = {}
    for users in (50_000, 400_000):
        work = tmp_path / f"u{users}"
        (work / "out").mkdir(parents=True)
        path = ratings_file(work / "r.csv", users, 5, 5_000, seed=users, shuffle=True,
                            id_step=7, first_id=1000)
        run = run_watched(kvldp("perturb", "--mechanism", "pckv-grr", "--epsilon", "4", "--input", str(path),
                                "--rating-range", "1,5", "--seed", "3", "--output", str(work / "out" / "R.avro")),
                          work, work / "perturb")
        assert _failure(0, "perturb", run) is None, run.stderr_tail
        assert f"rows read {users * 5} = accepted {users * 5} + rejected 0 [ok]" in \
            (work / "perturb.out").read_text()
        peaks[users] = run.peak_mb
    growth = peaks[400_000] - peaks[50_000]
    print(f"\nINGEST peak RSS: 0.25M rows {peaks[50_000]:.0f} MB, 2M rows {peaks[400_000]:.0f} MB: "
          f"+{growth / 1.75:.0f} MB per million rows", flush=True)
    assert growth < GROWTH_MB_PER_M_ROWS * 1.75, peaks
