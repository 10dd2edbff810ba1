"""Counters a streaming job reads while it runs.

Each ``JobCounter`` increments Beam's metric (what Dataflow and Flink
report) and a tally in this process, keyed by the job. Beam's streaming
DirectRunner commits a ParDo's metric updates for its first bundle only
(apache-beam 2.77, measured: ``DirectMetrics.commit_logical`` receives the
first bundle's counts, then empty updates for every later bundle), so a
local streaming job would report its first ten messages for ever; the
DirectRunner runs every DoFn in this process, so the job reads the tally
instead. On other runners the tally stays in the workers and the job reads
Beam's metrics.
"""
from __future__ import annotations

import collections
import threading

from apache_beam.metrics import Metrics

NAMESPACE = "kvldp"

_tallies: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
_seen: dict[tuple[str, str], set] = collections.defaultdict(set)
_lock = threading.Lock()


class JobCounter:
    """Beam counter ``kvldp/name`` plus the in-process tally of ``job``."""

    def __init__(self, job: str, name: str):
        self._job, self._name = job, name
        self._metric = Metrics.counter(NAMESPACE, name)

    def inc(self, n: int = 1):
        self._metric.inc(n)
        with _lock:
            _tallies[self._job][self._name] += n


class DistinctCounter:
    """Beam counter ``kvldp/name`` plus the tally of ``job``, each item
    counted once by this process. A Flink job restored from a checkpoint
    replays what followed it, panes included: the count of windows that
    closed must not grow when the same window closes again (issue 42: the
    job stopped after ``--stop-after-windows`` N with N-1 windows closed,
    one counted twice)."""

    def __init__(self, job: str, name: str):
        self._job, self._name = job, name
        self._metric = Metrics.counter(NAMESPACE, name)

    def add(self, item) -> bool:
        """Count ``item`` unless this process counted it; whether it was new."""
        with _lock:
            seen = _seen[(self._job, self._name)]
            if item in seen:
                return False
            seen.add(item)
            _tallies[self._job][self._name] += 1
        self._metric.inc()
        return True


# Batch jobs count under one key per process: ``runtime.jobs``'s progress
# line reads it while an in-process runner (the local default, Flink's
# LOOPBACK workers) runs the job.
PROCESS = "process"


def counter(name: str) -> JobCounter:
    """Beam counter ``kvldp/name`` plus this process's tally (progress lines)."""
    return JobCounter(PROCESS, name)


def tally(job: str) -> dict[str, int]:
    """What this process's DoFns of ``job`` have counted so far."""
    with _lock:
        return dict(_tallies.get(job, {}))


def forget(job: str) -> None:
    with _lock:
        _tallies.pop(job, None)
        for key in [k for k in _seen if k[0] == job]:
            del _seen[key]
