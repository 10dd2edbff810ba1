"""Running a sweep of independent cells so that it survives interruption.

``kvldp evaluate`` runs one pipeline per (mechanism, epsilon, repeat) cell.
A cell's rows are stored in a file of their own, named by a fingerprint of
every parameter that shapes them, and written whole (a temporary name, then
a rename), so:

* a rerun skips exactly the cells already done *with the same parameters*;
  changing any parameter (users, seed, a mechanism option, the top sets…)
  makes new cells, and ``results.csv`` -- rebuilt from the store after every
  cell -- never mixes rows of two parameter sets;
* a kill leaves no torn row: a cell file is there whole or not at all.

Cells run in worker processes. SIGINT or SIGTERM stops the sweep within a
few seconds: the workers (each the leader of its own process group, so a
terminal's Ctrl-C reaches only the parent, and whatever they started goes
with them) are killed, and no process outlives the sweep. A worker whose
parent dies (even by SIGKILL) exits by itself.
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import hashlib
import json
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path

from kvldp.runtime import atomic

STORE_VERSION = 1          # bump when the rows of a cell change meaning for the same parameters


def fingerprint(parameters) -> str:
    """16 hex digits of SHA-256 over a canonical JSON of ``parameters``
    (dataclasses and tuples included)."""
    text = json.dumps([STORE_VERSION, parameters], sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _plain(value):
    import dataclasses
    if dataclasses.is_dataclass(value):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value) if f.compare}
    if isinstance(value, (set, frozenset)):
        return sorted(value, key=repr)
    return repr(value)


class CellStore:
    """``out/cells/NAME-FINGERPRINT.csv``: one file per finished cell."""

    def __init__(self, out_dir: Path, fields: Sequence[str]):
        self.directory = Path(out_dir) / "cells"
        self.directory.mkdir(parents=True, exist_ok=True)
        self.fields = list(fields)

    def path(self, name: str, cell_fingerprint: str) -> Path:
        return self.directory / f"{name}-{cell_fingerprint}.csv"

    def done(self, name: str, cell_fingerprint: str) -> bool:
        return self.path(name, cell_fingerprint).exists()

    def write(self, name: str, cell_fingerprint: str, rows: list[dict]):
        write_csv_atomically(self.path(name, cell_fingerprint), self.fields, rows)

    def rows(self, names_and_fingerprints: Iterable[tuple[str, str]]) -> Iterator[dict]:
        for name, fp in names_and_fingerprints:
            path = self.path(name, fp)
            if path.exists():
                with open(path, newline="") as fh:
                    yield from csv.DictReader(fh)

    def others(self, wanted: set[Path]) -> int:
        """Cell files of other parameter sets (kept, never mixed in); not the
        hidden temporary file a killed sweep left (``runtime.atomic``)."""
        return sum(1 for p in self.directory.glob("*.csv") if p not in wanted and not p.name.startswith("."))


def write_csv_atomically(path: Path, fields: Sequence[str], rows: Iterable[dict]):
    """Write ``rows`` to ``path`` whole: a temporary file in the same
    directory, flushed to disk, then renamed over ``path``."""
    with atomic.replaced(path) as tmp, open(tmp, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(fields))
        writer.writeheader()
        writer.writerows(rows)
        fh.flush()
        os.fsync(fh.fileno())


class Interrupted(Exception):
    """The sweep was stopped by SIGINT or SIGTERM (the finished cells are kept)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


@contextlib.contextmanager
def stop_on_signals():
    """Turn SIGINT and SIGTERM into ``Interrupted`` in the main thread for
    the duration of the block (SIGTERM's default would kill this process
    and leave its workers behind)."""
    def handler(signum, frame):
        raise Interrupted(signum)
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


class SweepInterrupted(KeyboardInterrupt):
    """A sweep stopped by a signal, with what it kept (the CLI exits 130 with its message)."""


def _worker_init(parent: int):
    """A worker leads its own process group (a terminal's Ctrl-C goes to the
    parent alone, which then kills the group) and exits when its parent dies."""
    os.setpgrp()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    from kvldp.runtime import console  # what the command prints of Beam's logs, here too
    console.set_up_logging()

    def watch():
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="kvldp-parent-watch").start()


def run_cells(work: Callable, tasks: Sequence, processes: int, on_done: Callable[[object, object], None]):
    """``on_done(task, work(task))`` for every task, the work in ``processes``
    worker processes (spawned: each imports Beam afresh, shares nothing).
    Raises ``Interrupted`` after killing every worker on SIGINT/SIGTERM, and
    a task's own error after killing the others.

    A ``ProcessPoolExecutor``, not a ``multiprocessing.Pool``: an idle Pool
    worker holds the task queue's lock while it waits, so once it was
    killed ``Pool.terminate`` waited for that lock forever (a cell that
    failed -- e.g. on a full disk -- hung the sweep, issue 42); the
    executor gives up on a pool whose workers died instead."""
    if not tasks:
        return
    pool = concurrent.futures.ProcessPoolExecutor(
        max_workers=min(processes, len(tasks)), mp_context=multiprocessing.get_context("spawn"),
        initializer=_worker_init, initargs=(os.getpid(),))
    try:
        with stop_on_signals():
            pending = {pool.submit(work, task): task for task in tasks}
            while pending:
                finished, _ = concurrent.futures.wait(pending, timeout=0.05,
                                                      return_when=concurrent.futures.FIRST_COMPLETED)
                for future in [f for f in pending if f in finished]:      # in the order submitted
                    on_done(pending.pop(future), future.result())
    except BaseException:
        kill_workers(pool)
        raise
    pool.shutdown()


def kill_workers(pool: concurrent.futures.ProcessPoolExecutor):
    """SIGKILL every worker's process group (the worker and whatever it
    started), then let the pool reap them: nothing outlives the sweep."""
    for child in multiprocessing.active_children():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(child.pid, signal.SIGKILL)
    pool.shutdown(wait=True, cancel_futures=True)
