"""Crash tests of the batch jobs (issue 42): ``perturb``, ``collect`` and
``evaluate`` killed with SIGKILL at seeded random instants.

After each kill: every file under its final name is byte-identical to the
uncrashed run's (a file being written lives under a temporary name,
``PATH.tmp-<uuid>``, and is renamed when whole; perturb's manifest is
written last, so a delivery without one is refused by collect); then a
rerun (with ``--overwrite`` when the command asks for it, in one line)
exits 0 and leaves exactly the uncrashed run's files, byte for byte.

A file named ``*.partial.*`` (``evaluate``'s rows so far) says it is
partial and may differ; the rerun removes it.

Kill points per command: ``KVLDP_KILL_POINTS`` (default 2 in the default
suite; the ``slow`` campaign 50 each). With ``KVLDP_CRASH_SUMMARY`` set,
each command's tally is written to that JSON file (docs/reliability.md).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

DEFAULT_POINTS = int(os.environ.get("KVLDP_KILL_POINTS", "2"))
CAMPAIGN_POINTS = int(os.environ.get("KVLDP_CAMPAIGN_KILL_POINTS", "50"))
MECH = ["--mechanism", "pckv-ue", "--epsilon", "2"]
PERTURB = ["perturb", *MECH, "--users", "20000", "--keys", "50", "--seed", "3", "--batch-size", "2000",
           "--output", "out/R.avro"]
COLLECT = ["collect", *MECH, "--input", "reports/R-*.avro", "--key-dictionary", "reports/R.keys.txt",
           "--output", "out/estimates.jsonl"]
EVALUATE = ["evaluate", "--mechanisms", "pckv-ue,pckv-grr", "--epsilons", "1,2", "--repeats", "1", "--users",
            "3000", "--keys", "6", "--seed", "5", "--out", "out"]
JOBS = {"perturb": PERTURB, "collect": COLLECT, "evaluate": EVALUATE}


def _run(argv: list[str], cwd: Path, kill_after: float | None = None) -> tuple[int, str]:
    """``kvldp ARGV`` in ``cwd`` (its own session), SIGKILLed with all its
    processes ``kill_after`` seconds in; (exit code, stderr)."""
    with open(cwd / "stderr.txt", "w") as err:
        proc = subprocess.Popen([sys.executable, "-m", "kvldp", *argv], cwd=cwd, stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True)
        try:
            proc.wait(timeout=kill_after if kill_after is not None else 300)
        except subprocess.TimeoutExpired:
            if kill_after is None:
                raise
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    return proc.returncode, (cwd / "stderr.txt").read_text()


def _is_temporary(path: Path) -> bool:
    """``PATH.tmp-<uuid>`` (Beam filesystems), ``.NAME.<pid>.tmp.EXT`` (runtime.atomic), Beam's sink directories."""
    return (".tmp-" in path.name or (path.name.startswith(".") and ".tmp" in path.name)
            or any(part.startswith("beam-temp-") for part in path.parts))


def _outputs(out: Path) -> dict[str, bytes]:
    """The files under their final names below ``out``."""
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and not _is_temporary(p.relative_to(out))}


class Job:
    """One command's reference run and its kill points, in ``root``."""

    def __init__(self, name: str, root: Path, reports: Path | None):
        self.name, self.argv, self.root, self.reports = name, JOBS[name], root, reports
        work = self._fresh("reference")
        start = time.monotonic()
        code, err = _run(self.argv, work)
        self.seconds = time.monotonic() - start
        assert code == 0, err[-2000:]
        self.reference = _outputs(work / "out")
        assert self.reference
        self.tally = {"kill points": 0, "killed before it finished": 0, "left partial output": 0,
                      "reruns identical": 0, "reruns needing --overwrite": 0, "temporary files left": 0}

    def _fresh(self, label: str) -> Path:
        work = self.root / label
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        if self.reports is not None:
            shutil.copytree(self.reports, work / "reports")
        return work

    def kill_at(self, seconds: float, label: str) -> None:
        work = self._fresh(label)
        code, _ = _run(self.argv, work, kill_after=seconds)
        self.tally["kill points"] += 1
        self.tally["killed before it finished"] += code == -signal.SIGKILL
        out = work / "out"
        seen = _outputs(out) if out.exists() else {}
        # a file named partial (evaluate's results.partial.csv: the rows so far) says what it is
        partial = {name for name, data in seen.items() if self.reference.get(name) != data
                   and ".partial." not in name}
        assert not partial, f"{self.name} killed at {seconds:.2f} s: {sorted(partial)} differ from the " \
                            "uncrashed run's under their final names"
        self.tally["left partial output"] += bool(partial)
        self.tally["temporary files left"] += sum(1 for p in out.rglob("*") if _is_temporary(p.relative_to(out))
                                                  and p.is_file()) if out.exists() else 0
        code, err = _run(self.argv, work)
        if code != 0:
            lines = err.strip().splitlines()
            assert code == 2 and "--overwrite" in lines[-1], err[-2000:]      # one line saying what to do
            self.tally["reruns needing --overwrite"] += 1
            code, err = _run([*self.argv, "--overwrite"], work)
            assert code == 0, err[-2000:]
        assert _outputs(out) == self.reference, f"{self.name}: the rerun after a kill at {seconds:.2f} s differs"
        self.tally["reruns identical"] += 1


@pytest.fixture(scope="module")
def reports(tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("reports")
    code, err = _run(PERTURB, work)
    assert code == 0, err
    return work / "out"


def _campaign(name: str, points: int, root: Path, reports: Path) -> dict:
    job = Job(name, root, reports if name == "collect" else None)
    rng = np.random.default_rng([42, points, list(JOBS).index(name)])
    for i, at in enumerate(rng.uniform(0.25, 1.05, size=points) * job.seconds):
        job.kill_at(float(at), f"kill{i}")
    _record(name, job)
    return job.tally


def _record(name: str, job: Job) -> None:
    path = os.environ.get("KVLDP_CRASH_SUMMARY")
    if not path:
        return
    summary = json.loads(Path(path).read_text()) if Path(path).exists() else {}
    summary[name] = {**job.tally, "uncrashed seconds": round(job.seconds, 1)}
    Path(path).write_text(json.dumps(summary, indent=1, sort_keys=True))


@pytest.mark.parametrize("name", sorted(JOBS))
def test_a_killed_job_leaves_nothing_partial_and_a_rerun_is_byte_identical(name, tmp_path, reports):
    tally = _campaign(name, DEFAULT_POINTS, tmp_path, reports)
    assert tally["reruns identical"] == DEFAULT_POINTS


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(JOBS))
def test_campaign_a_killed_job_leaves_nothing_partial_and_a_rerun_is_byte_identical(name, tmp_path, reports):
    tally = _campaign(name, CAMPAIGN_POINTS, tmp_path, reports)
    assert tally["reruns identical"] == CAMPAIGN_POINTS
    assert tally["killed before it finished"] >= CAMPAIGN_POINTS // 2       # the kills landed inside the runs


# --- a full disk, an unwritable directory --------------------------------------------------------------------

def _on_small_disk(tmp_path: Path, argv: list[str], options: str) -> tuple[int, str, list[str]]:
    """``kvldp ARGV`` with ``disk`` (its output, and TMPDIR) a tmpfs mounted
    with ``options`` in a user namespace of its own; (exit code, stderr,
    what is left on the disk afterwards)."""
    if not shutil.which("unshare") or subprocess.run(["unshare", "-rm", "true"], check=False).returncode:
        if os.environ.get("CI"):
            pytest.fail("unshare -rm is needed for the full-disk tests (user namespaces)")
        pytest.skip("no user namespaces here (unshare -rm)")
    disk = tmp_path / "disk"
    disk.mkdir()
    command = " ".join(f"'{a}'" for a in [sys.executable, "-m", "kvldp", *argv])
    script = (f"mount -t tmpfs -o {options} tmpfs {disk} && cd {tmp_path} && TMPDIR={disk} {command}; "
              f"code=$?; find {disk} -mindepth 1 >&2; exit $code")
    done = subprocess.run(["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, timeout=300,
                          check=False)
    lines = done.stderr.strip().splitlines()
    kvldp_lines = [x for x in lines if x.startswith("kvldp ")]
    left = [x for x in lines if x.startswith(str(disk))]
    return done.returncode, "\n".join(kvldp_lines), left


@pytest.mark.parametrize("name", ["perturb", "collect"])
def test_a_full_disk_is_one_line_naming_the_file_and_leaves_nothing(name, tmp_path, reports):
    """Before: ``OSError: [Errno 28] No space left on device`` naming no
    file, perturb's half-written report file and Beam's sink directory
    left behind, and its whole report files without a manifest."""
    shutil.copytree(reports, tmp_path / "reports")
    argv = [a.replace("out/", "disk/out/") for a in JOBS[name]]
    code, err, left = _on_small_disk(tmp_path, argv, "size=100k" if name == "perturb" else "size=8k")
    assert code == 1 and len(err.splitlines()) == 1, err
    assert "No space left on device" in err and str(tmp_path / "disk" / "out") in err, err
    assert left in ([], [str(tmp_path / "disk" / "out")]), left          # at most the empty directory


@pytest.mark.parametrize("name", ["perturb", "collect"])
def test_an_unwritable_directory_is_refused_before_any_compute(name, tmp_path, reports):
    shutil.copytree(reports, tmp_path / "reports")
    argv = [a.replace("out/", "disk/out/") for a in JOBS[name]]
    code, err, left = _on_small_disk(tmp_path, argv, "ro,size=8k")
    assert code == 2 and len(err.splitlines()) == 1 and "--output" in err, err
    assert "Read-only file system" in err or "not writable" in err, err
    assert left == [], left
