"""Killing a ``kvldp`` command at a chosen instant, and reading what it left
(issue 42's crash tests, ``tests/test_crash_jobs.py``).

A kill here is what a lost machine does: SIGKILL to every process of the
command's session at once. ``kvldp evaluate``'s workers lead process groups
of their own (``kvldp.pipelines.sweep``), so killing the command's process
group alone would leave them running for up to half a second, still
writing; the session holds them all. The child dies with the test process
too (``PR_SET_PDEATHSIG``, ``tests/sessions.py``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sessions import REPO, die_with_parent, kill_group, session_members

SUMMARY_ENV = "KVLDP_CRASH_SUMMARY"


@dataclasses.dataclass
class Outcome:
    """One run of a command: its exit code (``-9``: killed), stderr and wall time."""

    code: int
    stderr: str
    seconds: float

    @property
    def killed(self) -> bool:
        return self.code == -signal.SIGKILL

    def lines(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if line.strip()]


def command(argv: list[str]) -> list[str]:
    return [sys.executable, "-m", "kvldp", *argv]


def environment(tmpdir: Path) -> dict[str, str]:
    """The checkout importable, ``TMPDIR`` the test's own (what a killed
    command leaves there goes with the test), no progress lines."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
            "TMPDIR": str(tmpdir), "KVLDP_PROGRESS_EVERY": "0"}


def run(argv: list[str], cwd: Path, kill_after: float | None = None, timeout: float = 600) -> Outcome:
    """``kvldp ARGV`` in ``cwd``, in a session of its own; with
    ``kill_after``, every process of that session is SIGKILLed that many
    seconds after the start (unless it ended before)."""
    tmpdir = cwd / "tmp"
    tmpdir.mkdir(exist_ok=True)
    err_path = cwd / "stderr.txt"
    start = time.monotonic()
    with open(err_path, "wb") as err:
        proc = subprocess.Popen(command(argv), cwd=cwd, env=environment(tmpdir), stdout=subprocess.DEVNULL,
                                stderr=err, start_new_session=True,
                                preexec_fn=die_with_parent)  # noqa: PLW1509 -- only prctl, no Popen equivalent
    try:
        proc.wait(timeout=kill_after if kill_after is not None else timeout)
    except subprocess.TimeoutExpired:
        kill_session(proc.pid)
        if kill_after is None:
            raise
    proc.wait()
    kill_session(proc.pid)              # whatever it started and left (none when it ended well)
    return Outcome(proc.returncode, err_path.read_text(errors="replace"), time.monotonic() - start)


def kill_session(sid: int, wait: float = 10.0) -> None:
    """SIGKILL every process of session ``sid`` (its leader's group and the
    groups its processes made) and wait until none is left."""
    deadline = time.monotonic() + wait
    kill_group(sid)
    while members := session_members(sid):
        for pid in members:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        if time.monotonic() > deadline:
            raise AssertionError(f"processes {members} of session {sid} survived SIGKILL for {wait:.0f} s")
        time.sleep(0.02)


def is_temporary(relative: Path) -> bool:
    """A file being written, under a name no reader opens: ``PATH.tmp-<uuid>``
    (kvldp's writers on Beam's filesystems), ``.NAME.<pid>.tmp.EXT``
    (``kvldp.runtime.atomic``), inside Beam's text sink's ``beam-temp-*``
    directory."""
    name = relative.name
    return (".tmp-" in name or (name.startswith(".") and ".tmp" in name)
            or any(part.startswith("beam-temp-") for part in relative.parts))


def final_files(out: Path) -> dict[str, bytes]:
    """Every file below ``out`` under its final name, with its bytes."""
    if not out.exists():
        return {}
    return {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*"))
            if p.is_file() and not is_temporary(p.relative_to(out))}


def temporary_files(out: Path) -> list[str]:
    if not out.exists():
        return []
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if is_temporary(p.relative_to(out)))


def kill_points(seed: list[int], n: int) -> list[float]:
    """``n`` instants as shares of an uncrashed run's duration, drawn
    uniformly over ``(0, 1.1)``: a kill may land anywhere, also just after
    the command ended."""
    import numpy as np
    return [float(x) for x in np.random.default_rng(seed).uniform(0.0, 1.1, size=n)]


def record(name: str, tally: dict) -> None:
    """Add ``name``'s tally to the JSON file ``$KVLDP_CRASH_SUMMARY`` names, if set."""
    path = os.environ.get(SUMMARY_ENV)
    if not path:
        return
    with open(path, "a+") as fh:              # the commands' campaigns may run at once (pytest -n 3)
        fcntl.flock(fh, fcntl.LOCK_EX)
        fh.seek(0)
        text = fh.read()
        summary = json.loads(text) if text.strip() else {}
        summary[name] = tally
        fh.seek(0)
        fh.truncate()
        fh.write(json.dumps(summary, indent=1, sort_keys=True) + "\n")


# --- a small disk: a tmpfs in a user namespace of our own --------------------------------------------------------

def require_namespaces() -> None:
    """Skip (fail under ``CI``) unless this machine lets an unprivileged
    user mount a tmpfs in a user namespace (``unshare -rm``)."""
    if shutil.which("unshare") and subprocess.run(
            ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=4k tmpfs /mnt"], capture_output=True,
            check=False).returncode == 0:
        return
    if os.environ.get("CI"):
        pytest.fail("the full-disk tests need user namespaces (unshare -rm, mount -t tmpfs)")
    pytest.skip("no user namespaces here (unshare -rm, mount -t tmpfs)")


def run_on_tmpfs(argv: list[str], cwd: Path, disk: Path, options: str, tmpdir_on_disk: bool = True,
                 timeout: float = 120) -> tuple[Outcome, list[str]]:
    """``kvldp ARGV`` in ``cwd`` with ``disk`` a tmpfs mounted with
    ``options`` (and ``TMPDIR`` on it, unless not ``tmpdir_on_disk``), in a
    mount namespace of its own (the tmpfs goes with it); also what is left
    on ``disk`` when the command ends (paths relative to it)."""
    require_namespaces()
    disk.mkdir(parents=True, exist_ok=True)
    quoted = " ".join(f"'{a}'" for a in command(argv))
    if not tmpdir_on_disk:
        (cwd / "tmp").mkdir(exist_ok=True)
    env = environment(disk if tmpdir_on_disk else cwd / "tmp")
    script = (f"mount -t tmpfs -o {options} tmpfs '{disk}' && cd '{cwd}' && {quoted} 2>stderr.txt; code=$?; "
              f"cd '{disk}' && find . -mindepth 1 > '{cwd}/left.txt'; exit $code")
    start = time.monotonic()
    with subprocess.Popen(["unshare", "-rm", "sh", "-c", script], env=env, stdout=subprocess.DEVNULL,
                          start_new_session=True, preexec_fn=die_with_parent) as done:  # noqa: PLW1509
        try:
            done.wait(timeout=timeout)
        finally:
            kill_session(done.pid)          # a command that hangs goes with the test
    seconds = time.monotonic() - start
    err = (cwd / "stderr.txt").read_text(errors="replace") if (cwd / "stderr.txt").exists() else ""
    left = (cwd / "left.txt").read_text().split() if (cwd / "left.txt").exists() else ["(find did not run)"]
    return Outcome(done.returncode, err, seconds), sorted(p.removeprefix("./") for p in left)


def run_unprivileged(argv: list[str], cwd: Path) -> Outcome:
    """``kvldp ARGV`` as a user whom file modes bind: this user when it is
    not root; for root (who writes anywhere) a user namespace mapping it to
    uid 1000, without capabilities, where root's files show as that user's."""
    if os.geteuid() != 0:
        return run(argv, cwd)
    if not shutil.which("unshare") or subprocess.run(
            ["unshare", "--map-user=1000", "--map-group=1000", "true"], check=False).returncode:
        if os.environ.get("CI"):
            pytest.fail("as root the unwritable-directory test needs unshare --map-user (user namespaces)")
        pytest.skip("running as root and no user namespaces: every directory is writable")
    tmpdir = cwd / "tmp"
    tmpdir.mkdir(exist_ok=True)
    start = time.monotonic()
    done = subprocess.run(["unshare", "--map-user=1000", "--map-group=1000", *command(argv)], cwd=cwd,
                          env=environment(tmpdir), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                          timeout=600, check=False)
    return Outcome(done.returncode, done.stderr, time.monotonic() - start)
