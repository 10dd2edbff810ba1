"""Crash tests of the batch jobs (issue 42): ``perturb``, ``collect`` and
``evaluate`` killed with SIGKILL at seeded random instants, a full disk and
an unwritable directory.

Each command runs once uncrashed (its reference outputs, its duration T),
then once per kill point in a fresh directory, killed (SIGKILL to every
process of its session: ``tests/crash_points.py``) at an instant drawn
uniformly over (0, 1.1 T), T the median of its uncrashed runs so far (the
reference and the reruns: a shared machine's load moves it; the draws are
seeded shares of T). After each kill:

* every file under its final name is byte-identical to the reference's; a
  file being written lives under a temporary name (``PATH.tmp-<uuid>``,
  ``.NAME.<pid>.tmp.EXT``), which no reader opens. perturb writes its
  manifest last: report files without one are refused by ``collect``.
  evaluate's ``results.partial.csv`` says it is partial and holds only rows
  of the reference's ``results.csv``;
* the same command run again exits 0 (after a one-line refusal asking for
  ``--overwrite`` where the killed run left outputs) and leaves exactly the
  reference's files, byte for byte; it adds no temporary file of its own.

Two uncrashed runs with the same seed write the same bytes (checked by
every rerun: nothing such as a time or run id differs).

Kill points per command: ``KVLDP_KILL_POINTS`` (default 3); the ``slow``
campaign ``KVLDP_CAMPAIGN_KILL_POINTS`` (else ``KVLDP_KILL_POINTS``, else
50). With ``KVLDP_CRASH_SUMMARY`` set, each command's tally goes to that
JSON file (``docs/figures/reliability/crash.json``, docs/reliability.md).
"""
from __future__ import annotations

import csv
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import crash_points as cp
from kvldp.pipelines import manifest, sweep

DEFAULT_POINTS = int(os.environ.get("KVLDP_KILL_POINTS", "3"))
CAMPAIGN_POINTS = int(os.environ.get("KVLDP_CAMPAIGN_KILL_POINTS", os.environ.get("KVLDP_KILL_POINTS", "50")))
MECH = ["--mechanism", "pckv-ue", "--epsilon", "2"]
PERTURB = ["perturb", *MECH, "--users", "4000", "--keys", "20", "--seed", "3", "--batch-size", "500",
           "--output", "out/R.avro"]
COLLECT = ["collect", *MECH, "--input", "reports/R-*.avro", "--key-dictionary", "reports/R.keys.txt",
           "--output", "out/estimates.jsonl"]
# two cells on the NumPy runner (a Beam cell costs ~3 s more; the sweep's store, results and figures are the same)
EVALUATE = ["evaluate", "--mechanisms", "pckv-ue,pckv-grr", "--epsilons", "2", "--repeats", "1", "--users",
            "2000", "--keys", "6", "--seed", "5", "--postprocess", "raw", "--engine", "numpy", "--out", "out"]
SIMULATE = ["simulate", *MECH, "--users", "4000", "--keys", "20", "--seed", "3", "--output", "out/estimates.jsonl"]
JOBS = {"perturb": PERTURB, "collect": COLLECT, "evaluate": EVALUATE}


class Job:
    """One command's reference run in ``root``, its kill points, and their tally."""

    def __init__(self, name: str, argv: list[str], root: Path, reports: Path):
        self.name, self.argv, self.root, self.reports = name, argv, root, reports
        work = self._fresh("reference")
        done = cp.run(argv, work)
        assert done.code == 0, done.stderr[-3000:]
        self.durations = [done.seconds]
        self.reference = cp.final_files(work / "out")
        assert self.reference and not cp.temporary_files(work / "out"), cp.temporary_files(work / "out")
        assert not list((work / "tmp").iterdir()), "an uncrashed run left scratch files in TMPDIR"
        # killed before it finished = killed before any output + landed mid-write (temporary files, or some
        # of the outputs) + killed with every output complete (while it cleaned up or printed)
        self.tally = {"kill points": 0, "finished before the kill": 0, "killed before it finished": 0,
                      "killed before any output": 0, "landed mid-write": 0,
                      "killed with every output complete": 0, "left temporary files": 0,
                      "left partial output": 0, "reruns needing --overwrite": 0, "reruns identical": 0,
                      "scratch directories left in TMPDIR": 0}
        self.refusal_checked = False

    def _fresh(self, label: str) -> Path:
        work = self.root / label
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        if self.name == "collect":
            shutil.copytree(self.reports, work / "reports")
        return work

    @property
    def typical_seconds(self) -> float:
        """The median uncrashed run so far (the machine's load changes over a campaign)."""
        return statistics.median(self.durations)

    def kill_at(self, share: float, label: str) -> None:
        """Kill a run ``share`` of the typical run's duration in."""
        work, out = self._fresh(label), self.root / label / "out"
        seconds = share * self.typical_seconds
        first = cp.run(self.argv, work, kill_after=seconds)
        where = f"{self.name} killed at {seconds:.2f} s of {self.typical_seconds:.2f} s"
        self.tally["kill points"] += 1
        seen, temps = cp.final_files(out), cp.temporary_files(out)
        if not first.killed:                    # it ended before the instant: an uncrashed run
            assert first.code == 0 and seen == self.reference and not temps, f"{where}: {first.stderr[-2000:]}"
            self.tally["finished before the kill"] += 1
            self.durations.append(first.seconds)
        else:
            self.tally["killed before it finished"] += 1
            complete = set(seen) == set(self.reference)
            self.tally["killed before any output"] += not seen and not temps
            self.tally["landed mid-write"] += bool(temps) or (bool(seen) and not complete)
            self.tally["killed with every output complete"] += complete and not temps
            self.tally["left temporary files"] += bool(temps)
            differ = sorted(n for n, data in seen.items() if self.reference.get(n) != data and ".partial." not in n)
            self.tally["left partial output"] += bool(differ)
            assert not differ, f"{where}: {differ} differ from the uncrashed run's under their final names"
            self._check_partial(work, seen, where)
        # a SIGKILLed command's $TMPDIR/kvldp-run-* stays; the rerun removes it (runtime.process.clear_abandoned)
        self.tally["scratch directories left in TMPDIR"] += len(list((work / "tmp").iterdir()))
        self._rerun(work, temps, where)
        left = list((work / "tmp").iterdir())
        assert not left, f"{where}: scratch left in TMPDIR after the rerun: {left}"

    def _check_partial(self, work: Path, seen: dict, where: str) -> None:
        """What a killed run left under final names is refused or says it is partial."""
        if self.name == "perturb" and any(n.endswith(".avro") for n in seen) and "R.manifest.json" not in seen:
            names = (work / "out/R.keys.txt").read_text().split("\n") if "R.keys.txt" in seen else []
            with pytest.raises(manifest.ManifestMismatch, match="no manifest"):
                manifest.check_delivery(str(work / "out/R-*.avro"), names)
            if not self.refusal_checked:         # once per campaign: collect itself says so in one line
                refused = cp.run(["collect", *MECH, "--input", "out/R-*.avro", "--keys", "20",
                                  "--output", "collected.jsonl"], work)
                assert refused.code == 2 and len(refused.lines()) == 1, refused.stderr
                assert "no manifest" in refused.stderr and not (work / "collected.jsonl").exists()
                self.refusal_checked = True
        if "results.partial.csv" in seen:       # evaluate's rows so far: each one of the reference's
            with open(work / "out/results.partial.csv", newline="") as fh:
                partial = [tuple(row) for row in csv.reader(fh)]
            whole = {tuple(row) for row in csv.reader(self.reference["results.csv"].decode().splitlines())}
            assert partial and set(partial) <= whole, f"{where}: results.partial.csv holds rows results.csv has not"

    def _rerun(self, work: Path, temps: list[str], where: str) -> None:
        out = work / "out"
        again = cp.run(self.argv, work)
        if again.code != 0:
            assert again.code == 2 and len(again.lines()) == 1 and "--overwrite" in again.stderr, \
                f"{where}: the rerun failed: {again.stderr[-2000:]}"          # one line saying what to do
            self.tally["reruns needing --overwrite"] += 1
            again = cp.run([*self.argv, "--overwrite"], work)
            assert again.code == 0, f"{where}: the rerun with --overwrite failed: {again.stderr[-2000:]}"
        self.durations.append(again.seconds)
        assert cp.final_files(out) == self.reference, f"{where}: the rerun's outputs differ from the uncrashed run's"
        added = set(cp.temporary_files(out)) - set(temps)
        assert not added, f"{where}: the rerun left temporary files {sorted(added)}"
        self.tally["reruns identical"] += 1


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    """perturb's reports, for collect."""
    work = tmp_path_factory.mktemp("reports")
    done = cp.run(PERTURB, work)
    assert done.code == 0, done.stderr[-3000:]
    return work / "out"


def campaign(name: str, argv: list[str], points: int, root: Path, reports: Path) -> dict:
    job = Job(name, argv, root, reports)
    for i, share in enumerate(cp.kill_points([42, points, list(JOBS).index(name)], points)):
        job.kill_at(share, f"kill{i}")
    cp.record(name, {**job.tally, "uncrashed seconds": round(job.typical_seconds, 1)})
    assert job.tally["reruns identical"] == points
    return job.tally


@pytest.mark.parametrize("name", list(JOBS))
def test_a_killed_job_leaves_nothing_partial_and_a_rerun_is_byte_identical(name, tmp_path, reports):
    campaign(name, JOBS[name], DEFAULT_POINTS, tmp_path, reports)


@pytest.mark.slow
@pytest.mark.parametrize("name", list(JOBS))
def test_campaign_a_killed_job_leaves_nothing_partial_and_a_rerun_is_byte_identical(name, tmp_path, reports):
    tally = campaign(name, JOBS[name], CAMPAIGN_POINTS, tmp_path, reports)
    assert tally["killed before it finished"] >= CAMPAIGN_POINTS // 2     # the kills landed inside the runs


# --- a full disk, an unwritable directory --------------------------------------------------------------------

def _one_line(done: cp.Outcome, name: str) -> str:
    """The command's one line on stderr (nothing else but warnings and
    evaluate's progress bar), no traceback."""
    assert "Traceback" not in done.stderr, done.stderr
    ours = [line for line in done.lines() if line.startswith(f"kvldp {name}:")]
    assert len(ours) == 1, done.stderr
    assert all(line.startswith(("kvldp ", "WARNING:", "cells: ")) for line in done.lines()), done.stderr
    return ours[0]


FULL = {"perturb": (PERTURB, "size=16k"), "collect": (COLLECT, "size=8k"), "simulate": (SIMULATE, "size=8k"),
        "evaluate": (EVALUATE, "size=4k")}
# the default suite's share (the campaign runs every case): simulate writes its estimates as collect does
SLOW = pytest.mark.slow


@pytest.mark.parametrize("name", [pytest.param(n, marks=SLOW) if n == "simulate" else n for n in FULL])
def test_a_full_disk_is_one_line_naming_the_file_and_leaves_nothing(name, tmp_path, reports):
    """The output and ``TMPDIR`` on a tmpfs that fills mid-job (perturb's
    reports take 40 KB, the estimates 15 KB). Before: ``OSError: [Errno
    28] No space left on device`` naming no file, a half-written report
    file, Beam's sink directory and the whole report files of a delivery
    without its manifest; evaluate hung (``sweep.run_cells``)."""
    shutil.copytree(reports, tmp_path / "reports")
    argv, options = FULL[name]
    argv = [a.replace("out/", "disk/out/") if a != "out" else "disk/out" for a in argv]
    done, left = cp.run_on_tmpfs(argv, tmp_path, tmp_path / "disk", options)
    line = _one_line(done, name)
    assert done.code == 1 and "No space left on device" in line and "disk/out/" in line, line
    if name == "evaluate":                      # the cells it finished are kept, whole, for the rerun
        left = [p for p in left if not p.startswith("out/cells/") or cp.is_temporary(Path(p))]
        assert set(left) <= {"out", "out/cells", "out/runs"}, left
    else:
        assert left in ([], ["out"]), left          # at most the empty output directory


def test_a_full_disk_under_a_jobs_scratch_array_names_the_file():
    """The arrays a job hands to the command (perturb's set sizes, the
    pre-passes' sums) are written by ``runtime.jobs.save_array``: on a full
    disk it raised ``[Errno 28]`` naming no file (found by the crash tests,
    issue 42). ``/dev/full`` refuses every write as a full disk does."""
    from kvldp.runtime.jobs import save_array
    with pytest.raises(OSError, match="No space left") as raised:
        save_array(np.arange(3), "/dev/full")
    assert raised.value.filename == "/dev/full"


def test_a_disk_full_at_the_manifest_leaves_no_delivery(tmp_path, reports):
    """The reports and the key dictionary fit, the manifest does not (the
    tmpfs holds exactly their pages; ``TMPDIR`` elsewhere). Before: one
    line naming no file, and the whole report files and key dictionary
    left without a manifest, with the manifest's temporary file."""
    pages = sum(-(-p.stat().st_size // 4096) for p in reports.iterdir() if p.name != "R.manifest.json")
    argv = [a.replace("out/", "disk/out/") for a in PERTURB]
    done, left = cp.run_on_tmpfs(argv, tmp_path, tmp_path / "disk", f"size={4 * pages}k", tmpdir_on_disk=False)
    line = _one_line(done, "perturb")
    assert done.code == 1 and "No space left on device" in line and "R.manifest.json" in line, line
    assert left == ["out"], left


@pytest.mark.parametrize("name", ["perturb", pytest.param("collect", marks=SLOW), pytest.param("simulate", marks=SLOW)])
def test_an_unwritable_directory_is_one_line_before_any_compute(name, tmp_path, reports):
    """``--output`` into a directory of mode 0555 (as a user file modes bind:
    root runs it in a user namespace as uid 1000)."""
    shutil.copytree(reports, tmp_path / "reports")
    locked = tmp_path / "out"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)
    done = cp.run_unprivileged({"simulate": SIMULATE}.get(name) or JOBS[name], tmp_path)
    line = _one_line(done, name)
    assert done.code == 2 and "--output" in line and str(locked) in line and "not writable" in line, line
    assert not list(locked.iterdir())


def test_an_output_below_an_unwritable_directory_is_one_line(tmp_path):
    """The output's directory cannot be created."""
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    locked.chmod(0o555)
    done = cp.run_unprivileged([a.replace("out/", "locked/out/") for a in PERTURB], tmp_path)
    line = _one_line(done, "perturb")
    assert done.code == 2 and f"cannot create {locked / 'out'}" in line and "Permission denied" in line, line
    assert not list(locked.iterdir())


def test_a_read_only_output_is_one_line_before_any_compute(tmp_path):
    """A read-only file system (mounted ``ro``: refused to root too)."""
    argv = [a.replace("out/", "disk/out/") for a in PERTURB]
    done, left = cp.run_on_tmpfs(argv, tmp_path, tmp_path / "disk", "ro,size=8k")
    line = _one_line(done, "perturb")
    assert done.code == 2 and "--output" in line and "Read-only file system" in line, line
    assert left == [], left


def test_a_failing_cell_ends_the_sweep_with_its_error(tmp_path):
    """Before: a cell that raised left its worker idle on the task queue
    holding the queue's lock; the sweep SIGKILLed it, then
    ``Pool.terminate`` waited for that lock forever (``kvldp evaluate`` on
    a full disk hung until killed)."""
    missing = tmp_path / "missing"              # each cell: os.stat of a file that is not there
    script = ("import os; from kvldp.pipelines import sweep\n"
              f"sweep.run_cells(os.stat, ['{missing}/1', '{missing}/2', '{missing}/3'], 1, lambda task, rows: None)")
    with subprocess.Popen([sys.executable, "-c", script], env=cp.environment(tmp_path), stderr=subprocess.PIPE,
                          text=True, start_new_session=True) as sweeping:
        try:
            _, err = sweeping.communicate(timeout=30)
        finally:
            cp.kill_session(sweeping.pid)
    assert sweeping.returncode == 1 and f"No such file or directory: '{missing}/1'" in err, err[-2000:]


def test_a_killed_sweeps_temporary_cell_file_is_not_counted_as_other_parameters(tmp_path):
    """A sweep killed while writing a cell leaves ``.NAME.PID.tmp.csv`` in
    the store (``runtime.atomic``). Before: the rerun counted it among
    "(cell, post-processing) pairs of other parameters"."""
    store = sweep.CellStore(tmp_path, ["a"])
    store.write("cell", "0123", [{"a": 1}])
    (store.directory / ".cell-4567.99.tmp.csv").write_text("a\n")
    assert store.others({store.path("cell", "0123")}) == 0
