"""The process tuning of the ``kvldp`` command's local jobs: the C heap
(glibc only; elsewhere those functions do nothing) and Python's cyclic
garbage collector -- tweaks ``heap`` and ``gc_freeze`` (``tweaks.py``).

Both are process-wide, so only the command's start applies them
(``start.py``), for a job on the in-process runner; importing this module
changes nothing, and a remote runner's workers never run it.

The in-process runner's workers are threads of one process, and two glibc
defaults cost a d = 10^6 job a third of its memory (KS-UE, 10^4 users):

* each thread allocates from an arena of its own, so memory the perturbing
  worker freed stays in its arena while the estimating worker grows another:
  the job peaked at 1.04 GB, 0.81 GB with one arena, in the same time (the
  GIL serialises the allocations anyway);
* freed heap stays in the process, and glibc raises its mmap threshold once
  a large array is freed, so the large arrays after it come from the heap
  too: a job ends with ~0.7 GB of free heap in RSS, and what the command does
  next (reading the estimates back for its summary) stacked on top of it
  (KVUE: 1.29 GB, where the job's own peak was 0.95 GB).

* glibc sets its mmap and trim thresholds from the last large array freed:
  after a batch's first 0.4 MB temporary (50,000 float64s) it serves such
  arrays from the heap but hands the heap's top back to the kernel
  whenever more than 0.8 MB of it is free -- after every few temporaries --
  and the next ones fault their pages in again, each zero-filled by the
  kernel while the thread holds the GIL: three 0.4 MB arrays made and freed
  cost 261 page faults a time, and PCKV-UE at 10^7 users took 3.30-3.49 s
  where it takes 2.39-2.78 s with the heap kept (Beam: 2.05-2.27 -> 1.72-2.09 s,
  three interleaved runs each).

And one Python default costs every job time: a full collection walks every
tracked object, and after the imports (Beam, its gcp clients, protobuf) there
are ~1.1 M of them, none of them garbage: 0.08-0.09 s per full collection
(the one after each job, and any the job's allocations trigger).
"""
from __future__ import annotations

import contextlib
import ctypes
import fcntl
import functools
import gc
import glob
import os
import shutil
import tempfile

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD, M_ARENA_MAX = -1, -3, -8      # glibc's malloc.h
# glibc's own ceiling for its dynamic mmap threshold on 64-bit, and its rule
# that the trim threshold is twice the mmap threshold
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 2 * MMAP_THRESHOLD


_heap_set_up = [False]


SCRATCH_PREFIX = "kvldp-run-"
OWNER_LOCK = ".owner.lock"     # held (flock) by the command while it runs; the kernel drops it when it dies


@contextlib.contextmanager
def private_tempdir():
    """The command's temporary files in one directory of its own, removed
    when it ends however it ends: Beam makes a ``beam-pipeline-temp*``
    directory for every pipeline and removes it only when that pipeline's
    run returns, so an interrupted job, a pipeline never run, or an
    evaluate worker killed with its sweep left one behind in ``$TMPDIR``
    each. ``TMPDIR`` points here too, for the command's subprocesses.

    A command killed with SIGKILL runs no ``finally``: its directory stays,
    and the next command removes it (``clear_abandoned``)."""
    parent = tempfile.gettempdir()
    clear_abandoned(parent)
    base = tempfile.mkdtemp(prefix=SCRATCH_PREFIX, dir=parent)
    owner = os.open(os.path.join(base, OWNER_LOCK), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(owner, fcntl.LOCK_EX)
    saved_env, saved_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    os.environ["TMPDIR"], tempfile.tempdir = base, base
    try:
        yield base
    finally:
        tempfile.tempdir = saved_dir
        if saved_env is None:
            os.environ.pop("TMPDIR", None)
        else:
            os.environ["TMPDIR"] = saved_env
        shutil.rmtree(base, ignore_errors=True)
        os.close(owner)


def clear_abandoned(parent: str) -> list[str]:
    """Remove the scratch directories under ``parent`` whose command died
    (issue 42: every SIGKILLed command left one, with whatever its jobs had
    written in it). A command holds an exclusive ``flock`` on its
    directory's lock file while it runs; the kernel drops it when the
    process dies however it dies, so a lock we can take is an abandoned
    directory, and one held (or not yet made) belongs to a live command."""
    removed = []
    for path in glob.glob(os.path.join(glob.escape(parent), SCRATCH_PREFIX + "*")):
        try:
            fd = os.open(os.path.join(path, OWNER_LOCK), os.O_RDWR)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue
        try:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
        finally:
            os.close(fd)
    return removed


def set_up(tweaks: frozenset[str]) -> None:
    """Before Beam and pyarrow are imported: the C heap (``heap``)."""
    if "heap" in tweaks:
        set_up_heap()


def settle(tweaks: frozenset[str]) -> None:
    """Once the command has imported what it runs: the imports' objects
    frozen (``gc_freeze``)."""
    if "gc_freeze" in tweaks:
        settle_imports()


def set_up_heap() -> None:
    """The C heap for the in-process runner: one arena (``one_arena``) and
    thresholds that keep a batch's temporaries in the heap (``steady_heap``);
    after each job ``release_freed_memory`` hands the free heap back."""
    one_arena()
    steady_heap()
    _heap_set_up[0] = _glibc() is not None


@functools.cache
def _glibc():
    """The C library when it is glibc (``mallopt``, ``malloc_trim``), else None."""
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return None
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt, libc.malloc_trim       # noqa: B018  (both, or neither)
    except (ValueError, OSError, AttributeError):   # no such confstr name, no glibc
        return None
    return libc


def one_arena() -> None:
    """Every thread allocates from one arena (``M_ARENA_MAX`` = 1).

    glibc fixes the arena limit the first time a thread needs an arena of
    its own, and importing pyarrow or Beam already starts threads: so the
    command's start runs this before they are imported; called later it
    changes nothing."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_ARENA_MAX, 1)


def steady_heap() -> None:
    """Arrays below 32 MiB come from the heap, and up to 64 MiB of free
    heap stays at its top for the next batch's temporaries (``mallopt``
    ``M_MMAP_THRESHOLD``, ``M_TRIM_THRESHOLD``: where glibc's own adjustment
    ends up after a 32 MiB array is freed, instead of wherever the first
    array freed leaves it; module docstring). Larger arrays -- a UE batch at
    d = 10^6 -- are mapped and unmapped as before, and ``release_freed_memory``
    still hands the free heap back after a job: PCKV-UE at d = 10^6 (10^4
    users) peaked at 742 MB with it and 749 MB without."""
    libc = _glibc()
    if libc is not None:
        libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


@functools.cache
def settle_imports() -> None:
    """Move every object that exists now into the collector's permanent
    generation (``gc.freeze``), so later full collections skip them.

    Once per process, when a command has imported what it runs and before
    its jobs: the objects are then the modules' own, which live as long as
    the process (a collection right after the imports finds nothing
    unreachable). Later calls do nothing: a second freeze would also pin
    whatever the jobs since left for the collector to free."""
    gc.freeze()


def release_freed_memory() -> None:
    """Hand the heap a finished in-process job freed back to the OS
    (``malloc_trim``): after a d = 10^6 job, 0.9 -> 0.25 GB of RSS. Only
    where this process set its heap up (``set_up_heap``): anywhere else the
    heap is the program's own business."""
    libc = _glibc()
    if libc is not None and _heap_set_up[0]:
        gc.collect()
        libc.malloc_trim(0)
