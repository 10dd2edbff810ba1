"""Subprocesses a test runs in a session of their own, and what is alive in
that session (``/proc``): the soak's memory watchdog (``test_soak.py``) and
the crash tests' kills (``crash_points.py``) read the same processes.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGE = os.sysconf("SC_PAGE_SIZE")


def die_with_parent():
    """In the child: SIGKILL when the test process dies (its own session
    would otherwise outlive a killed pytest)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)     # PR_SET_PDEATHSIG


def kill_group(sid: int):
    """SIGKILL the session leader's process group (not the groups its processes made)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(sid, signal.SIGKILL)


def _members(sid: int) -> Iterator[tuple[int, bytes]]:
    """(pid, state) of the processes whose session id is ``sid``."""
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except OSError:
            continue                        # gone meanwhile
        if int(fields[3]) == sid:           # after "(comm)": state ppid pgrp session
            yield int(entry.name), fields[0]


def session_members(sid: int) -> list[int]:
    """Live processes (not zombies) whose session id is ``sid``."""
    return [pid for pid, state in _members(sid) if state != b"Z"]


def session_rss_mb(sid: int) -> float:
    """Summed RSS of every live process whose session id is ``sid``."""
    return sum(_rss(pid) for pid, _ in _members(sid)) / 2**20


def _rss(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/statm", "rb") as fh:
            return int(fh.read().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0                            # gone meanwhile
