"""Running a job: the pipeline factory (the safe local runner), scratch paths, counters."""
from __future__ import annotations

import atexit
import contextlib
import io
import json
import logging
import os
import shutil
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DebugOptions,
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
    TestOptions,
)
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from kvldp.runtime import atomic, tally, tweaks
from kvldp.runtime.local_runner import make_runner
from kvldp.runtime.options import JobOptions
from kvldp.runtime.process import release_freed_memory

SAFE_RUNNING_MODE = "in_memory"


class InMemoryWorkersNotice(logging.Filter):
    """Drops Beam's notice that ``in_memory`` with 2 workers has no
    parallelism: its ParallelBundleManager does run the partitions of a stage
    on 2 embedded workers in threads (2 workers measured 1.3x faster than 1,
    DESIGN.md), so the notice would mislead on every job. The ``kvldp``
    command installs it at its start (``cli.main``)."""

    LOGGER = "apache_beam.runners.portability.fn_api_runner.fn_runner"

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("If direct_num_workers is not equal to 1")


def make_pipeline(beam_args: Sequence[str]) -> beam.Pipeline:
    """A pipeline with every Beam option passed through.

    Without ``--runner`` it runs on the in-process FnApiRunner (what
    DirectRunner falls back to; ``runtime.local_runner.make_runner``: kvldp's
    ``LocalRunner`` with the tweaks that apply here, else Beam's own) so a
    local batch job never tries to download the Prism binary (DESIGN.md), in
    ``in_memory`` mode with two workers.
    ``multi_threading`` (this CLI's default before) flushes its data plane
    from a timer thread in the middle of an element, and the runner then
    decodes half an element: a runaway allocation, ``Unknown type tag``, or
    silently lost batches (``shared/repro/beam_timed_flush.py``). A user who
    asks for it gets it, with a warning.
    """
    options = PipelineOptions(list(beam_args))
    standard = options.view_as(StandardOptions)
    if standard.runner is not None:
        tweaks.note_stock(f"jobs on --runner {standard.runner} run as Beam ships them")
        return beam.Pipeline(options=options)
    if standard.streaming:
        # unbounded sources (Pub/Sub) need the DirectRunner's streaming mode
        tweaks.note_stock("a streaming job runs on Beam's DirectRunner as Beam ships it")
        return beam.Pipeline(runner="DirectRunner", options=options)
    if "option_views" in tweaks.active():
        options = JobOptions(list(beam_args))
    direct = options.view_as(DirectOptions)
    if not any(a.startswith("--direct_num_workers") for a in beam_args):
        direct.direct_num_workers = min(2, os.cpu_count() or 1)
    if not any(a.startswith("--direct_running_mode") for a in beam_args):
        direct.direct_running_mode = SAFE_RUNNING_MODE
    elif direct.direct_running_mode == "multi_threading":
        warnings.warn("--direct_running_mode multi_threading can corrupt elements in Beam's local runner "
                      "(a timed flush splits an element: runaway memory, 'Unknown type tag' or lost batches); "
                      f"the default, {SAFE_RUNNING_MODE}, is safe", RuntimeWarning, stacklevel=2)
    return beam.Pipeline(runner=make_runner(), options=options)


class DryRunFinished(Exception):
    """A ``--dry_run`` job: its graph was built for its runner (for Dataflow,
    the whole job request: every DoFn pickled, every option translated) and
    nothing ran. ``cli.main`` prints the message and exits 0."""


def is_dry_run(beam_args: Sequence[str]) -> bool:
    return bool(PipelineOptions(list(beam_args)).view_as(TestOptions).dry_run)


def run_pipeline(p: beam.Pipeline, wait: bool = True):
    """``p.run()`` (and wait for it): with ``--dry_run`` the runner builds the
    job without submitting it and ``DryRunFinished`` says so, so no job goes
    on to read outputs that were never written. A job that runs longer than
    the progress interval prints its counters every interval (``Progress``)."""
    with Progress():
        result = p.run()
        options = p.options.view_as(TestOptions)
        if options.dry_run:
            raise DryRunFinished(_dry_run_report(p, result))
        if wait:
            finish(result)
    return result


def finish(result):
    """Wait for a job, then hand the heap it freed back to the OS."""
    result.wait_until_finish()
    release_freed_memory()
    return result


PROGRESS_ENV = "KVLDP_PROGRESS_EVERY"
PROGRESS_COUNTERS = (("rows_read", "rows read"), ("users_perturbed", "users perturbed"),
                     ("reports_written", "reports written"), ("reports_read", "reports read"))


class Progress:
    """A line on stderr every ``KVLDP_PROGRESS_EVERY`` seconds (default 10;
    0: none) while a job runs: what its DoFns have counted so far in this
    process (``runtime.tally``: the local runner and Flink's LOOPBACK
    workers run here; a remote runner's workers count elsewhere, and its own
    console shows them)."""

    def __init__(self, every: float | None = None, out=None):
        self.every = float(os.environ.get(PROGRESS_ENV, "10")) if every is None else every
        self.out = out or sys.stderr
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self):
        if self.every > 0:
            self._start = tally.tally(tally.PROCESS)
            self._began = time.monotonic()
            self._thread = threading.Thread(target=self._report, daemon=True, name="kvldp-progress")
            self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def line(self) -> str | None:
        now = tally.tally(tally.PROCESS)
        parts = [f"{label} {now.get(name, 0) - self._start.get(name, 0):,}" for name, label in PROGRESS_COUNTERS
                 if now.get(name, 0) - self._start.get(name, 0)]
        return f"[{time.monotonic() - self._began:5.0f} s] " + " · ".join(parts) if parts else None

    def _report(self):
        while not self._stop.wait(self.every):
            text = self.line()
            if text:
                print(text, file=self.out, flush=True)


def _dry_run_report(p: beam.Pipeline, result) -> str:
    """What a dry run built; a Dataflow job request goes to ``--dataflow_job_file``
    (Beam writes it only when submitting): the job and its pipeline proto."""
    job = getattr(result, "job", None)
    graph = getattr(job, "proto_pipeline", None)
    size = f"{len(graph.components.transforms)} transforms, " if graph is not None else ""
    job_file = p.options.view_as(DebugOptions).dataflow_job_file
    if job is not None and job_file:
        from google.protobuf import json_format
        request = {"job": json.loads(job.json()), "pipeline": json_format.MessageToDict(graph)}
        with FileSystems.create(job_file) as fh:
            fh.write(json.dumps(request, indent=1, sort_keys=True).encode())
    return (f"dry run: the {p.runner.__class__.__name__} job was built ({size}every DoFn pickled) and not "
            f"submitted{f'; job request written to {job_file}' if job is not None and job_file else ''}")


# Scratch directories by scope: the innermost ``scratch_scope`` removes what
# was made inside it; the outermost (the process) is removed at exit.
_SCRATCH_SCOPES: list[list[str]] = [[]]


def scratch_path(beam_args: Sequence[str], name: str) -> str:
    """A fresh path for an intermediate file both the workers and this
    process can reach: under ``--temp_location`` when given (remote
    runners), else in a local temporary directory. The directory is removed
    when the enclosing ``scratch_scope`` ends (a CLI job, an evaluate cell),
    or at the latest when the process exits: nothing a user wants goes there."""
    temp = PipelineOptions(list(beam_args)).view_as(GoogleCloudOptions).temp_location
    directory = (FileSystems.join(temp, f"kvldp-{uuid.uuid4().hex}") if temp
                 else tempfile.mkdtemp(prefix="kvldp-"))
    _SCRATCH_SCOPES[-1].append(directory)
    return FileSystems.join(directory, name)


def spill_directory(p: beam.Pipeline) -> str | None:
    """Where a job's large groupings wait on disk (``transforms/spill.py``):
    a local scratch directory on the in-process runner, whose GroupByKey
    holds its whole input in memory; ``None`` on any other runner, whose
    shuffle spills by itself."""
    return scratch_path([], "spill") if isinstance(p.runner, FnApiRunner) else None


@contextlib.contextmanager
def scratch_scope():
    """Remove the scratch directories made inside the block when it ends,
    however it ends. After a dry run only local ones: a remote one was never
    written, and asking a remote store without credentials retries for minutes."""
    _SCRATCH_SCOPES.append([])
    try:
        yield
    except DryRunFinished:
        _remove_scratch(_SCRATCH_SCOPES.pop(), remote=False)
        raise
    except BaseException:
        _remove_scratch(_SCRATCH_SCOPES.pop())
        raise
    _remove_scratch(_SCRATCH_SCOPES.pop())


def _remove_scratch(directories: list[str], remote: bool = True):
    for directory in directories:
        try:
            if "://" not in directory:
                shutil.rmtree(directory, ignore_errors=True)
                continue
            if not remote:
                continue
            found = FileSystems.match([FileSystems.join(directory, "**")])[0].metadata_list
            if found:
                FileSystems.delete([m.path for m in found])
        except Exception as err:        # a leftover temporary file must not fail a finished job
            print(f"(could not remove the scratch directory {directory}: {err})", file=sys.stderr)
    directories.clear()


atexit.register(lambda: [_remove_scratch(scope) for scope in reversed(_SCRATCH_SCOPES)])


def read_array(path: str) -> np.ndarray:
    with FileSystems.open(path) as fh:
        return np.load(io.BytesIO(fh.read()))


def counters(result, quiet: bool = False) -> dict[str, int]:
    """The ``kvldp`` counters of a pipeline (finished, or running: what has
    been committed so far; ``quiet``: no notice when a runner has none)."""
    out: dict[str, int] = {}
    try:
        for c in result.metrics().query()["counters"]:
            if c.key.metric.namespace == "kvldp":
                value = c.committed if c.committed is not None else c.attempted
                out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value or 0)
    except Exception as err:  # some runners do not report metrics
        if not quiet:
            print(f"(metrics unavailable: {err})", file=sys.stderr)
    return out


def print_row_summary(stats: dict[str, int], out=None, failed: bool = False):
    """``rows read = accepted + rejected`` for jobs that read ratings files;
    ``failed``: the job failed on them (too many rejected)."""
    out = out or sys.stdout
    if "rows_read" not in stats:
        return
    read, acc, rej = stats.get("rows_read", 0), stats.get("rows_accepted", 0), stats.get("rows_rejected", 0)
    status = "MISMATCH" if read != acc + rej else "FAILED: too many rejected" if failed else "ok"
    print(f"rows read {read} = accepted {acc} + rejected {rej} [{status}]", file=out)
    lost = stats.get("users_all_rejected", 0)
    if lost:
        print(f"{lost} user{'s' if lost > 1 else ''} had every row rejected: they send no report and are not in "
              "n (each frequency is a share of the users who report)", file=out)


def save_array(array, path: str):
    buf = io.BytesIO()
    np.save(buf, array)
    with atomic.writing(path), FileSystems.create(path) as fh:      # a full disk names the file
        fh.write(buf.getvalue())
