"""The local runner's C heap (issue 17: ``simulate`` at d = 10^6 peaked at
1.04-1.29 GB, over the 1 GiB budget, of which ~0.2 GB was memory one
worker thread freed that the other could not reuse, and ~0.7 GB free heap
the job left behind).

Each check runs in a fresh interpreter: glibc fixes its arena limit the
first time a second thread allocates, which in this test process happened
long ago. The threads allocate 4 MB arrays after a 16 MB one was freed,
so glibc serves them from its arenas (it raises its mmap threshold on that
free), as it does a job's d-sized arrays.
"""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest


def _glibc() -> bool:
    try:
        return bool(os.confstr("CS_GNU_LIBC_VERSION"))
    except (ValueError, OSError):
        return False


pytestmark = pytest.mark.skipif(not _glibc(), reason="the arena and trim settings are glibc's")

PROBE = textwrap.dedent("""
    import sys, threading
    if sys.argv[1] == "kvldp":
        from kvldp.runtime import process
        process.set_up(frozenset({"heap"}))   # what the kvldp command's start does for a local job
    import numpy as np

    def rss_mb():
        with open("/proc/self/status") as fh:
            return next(int(line.split()[1]) >> 10 for line in fh if line.startswith("VmRSS"))

    np.ones(16 << 20, np.uint8)            # freed at once: glibc now serves arrays below 16 MB from its arenas

    def fill(out):
        out.extend(np.ones(4 << 20, np.uint8) for _ in range(50))     # 200 MB

    # two workers alive at once, as the local runner's are (a thread that
    # exits hands its arena on to the next one)
    freed, done, pins = threading.Event(), threading.Event(), []

    def first_worker():
        blocks = []
        fill(blocks)
        pins.append(blocks.pop())          # the last block pins its heap's top: no automatic trim
        blocks.clear()
        freed.set()
        done.wait()

    first = threading.Thread(target=first_worker)
    first.start()
    freed.wait()
    before = rss_mb()
    second = []
    worker = threading.Thread(target=fill, args=(second,))
    worker.start()
    worker.join()
    grown = rss_mb() - before
    second.clear()
    done.set()
    first.join()
    before = rss_mb()
    if sys.argv[1] == "kvldp":
        process.release_freed_memory()
    print(grown, before - rss_mb())
""")


def _probe(mode: str) -> tuple[int, int]:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True,
                         env={**os.environ, "MALLOC_ARENA_MAX": "", "PYTHONMALLOC": ""})
    grown, released = map(int, out.stdout.split())
    return grown, released


def test_a_thread_reuses_what_another_freed():
    """The command's heap set-up (tweak ``heap``) puts every thread on one arena: a
    second worker's 200 MB reuse the 200 MB the first one freed."""
    grown, _ = _probe("kvldp")
    assert grown < 50, f"RSS grew {grown} MB for memory another thread had freed"


def test_without_it_the_second_thread_grows_its_own_arena():
    """The probe can fail: with glibc's default arenas the same 200 MB are new."""
    grown, _ = _probe("plain")
    assert grown > 150


def test_release_hands_the_freed_heap_back():
    """After a job: the 200 MB the threads freed leave RSS."""
    _, released = _probe("kvldp")
    assert released > 150, f"only {released} MB released"


FAULTS = textwrap.dedent("""
    import resource, sys
    if sys.argv[1] == "kvldp":
        from kvldp.runtime import process
        process.set_up(frozenset({"heap"}))
    import numpy as np

    def batch():                      # a batch's temporaries: three 0.4 MB arrays, made and freed together
        a, b, c = np.ones(50_000), np.ones(50_000), np.ones(50_000)
        return a[0] + b[0] + c[0]

    for _ in range(10):
        batch()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(100):
        batch()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
""")


def _page_faults(mode: str) -> int:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES", "PYTHONMALLOC"))}
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, check=True, env=env)
    return int(out.stdout.split()[-1])


def test_a_batchs_temporaries_stay_in_the_heap():
    """The command's heap set-up pins glibc's thresholds: 100 batches
    of temporaries reuse the heap's pages (a fault each would be ~2.6 us,
    zero-filled by the kernel while the thread holds the GIL)."""
    assert _page_faults("kvldp") < 100


def test_without_it_glibc_trims_the_heap_between_batches():
    """The probe can fail: with glibc's own thresholds every batch faults its pages in again."""
    assert _page_faults("plain") > 5_000
