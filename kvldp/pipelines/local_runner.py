"""The local runner: Beam's in-process FnApiRunner with less fixed cost per stage.

With two workers, Beam's ``ParallelBundleManager`` splits every stage's
input into two partitions and runs both, each on its own embedded worker
(``fn_runner.py``). Most of a kvldp graph's stages hold one element -- the
Impulse that starts a branch, a global combine's merge, a round's
calibration, the estimates' write -- so the second partition is empty, and
running it still builds that stage's whole operator tree on the second
worker: unpickling every DoFn, a thread to build the tree, a state-sampler
thread, monitoring infos. Measured here: a one-element stage costs ~26 ms
on two workers and ~14 ms on one; a PrivKVM+ job has 31 stages, 29 of them
this small.

``LocalRunner`` runs a stage on one worker when only one partition holds
input (and there are no timers, which Beam sends to the first worker only);
a stage with input in several partitions runs in parallel as before. An
empty partition's bundle processes no element, so skipping it changes no
output (none of kvldp's DoFns, nor Beam's lifted combines and file writes,
emit from ``finish_bundle`` without input). For the same reason a stage
with no input at all (and no timers) does not run: a protocol that stopped
early leaves its later rounds without input (``transforms/rounds.py``), and
each of those rounds' three stages cost ~6-18 ms when it ran empty. A
stateful stage keeps Beam's bundle manager.

While a ``LocalRunner`` job runs with in-process workers (``in_memory``, the
default, or ``multi_threading``), Beam's pickler compresses what it pickles
with zlib, its other codec (``pickler.dumps(use_zlib=True)``), instead of
bz2 at level 9: a worker unpickles every DoFn of a stage, pickles it again
with its windowing and unpickles that (``bundle_processor.
_create_pardo_operation``), and the driver pickles each once more to
translate the graph -- ~300 bz2 compressions in a PrivKVM+ job, each
allocating bz2's 7.6 MB of work space for a 2 KB payload (0.23 ms, against
0.025 ms for zlib). ``pickler.loads`` reads either codec (a bz2 stream
begins ``BZh``, a zlib one ``x``), so a payload made during a job loads
anywhere; payloads made outside one -- or for subprocess workers
(``multi_processing``), which run Beam's own ``loads`` -- stay bz2.

During such a job, too, a bundle processor is built without two threads
Beam starts for it. Its operator tree is built on the worker's own thread,
not on an ``ExecutionTreeCreator`` thread that the worker waits for: that
thread is there so that a remote SDK harness stuck unpickling a DoFn can
time out and terminate itself (``bundle_processor.BundleProcessor``), and
an in-process worker's harness is the user's own process. And its state
sampler tracks the current step without the thread that samples it
(``statesampler_fast.pyx``): user metrics (the pipeline's tallies) find
their step through the tracker as before, but no time is attributed to
steps, so Beam's per-step ``msecs`` metrics read 0 on the local runner.
``stop()`` joined that thread, which first slept out its current period (it
grows 1.2x per wake from 2 ms to 200 ms): every bundle that ran longer than
~1 s waited up to 0.2 s more at its end (0.14 s of a 1.05 s PCKV-GRR job at
10^7 users, measured here). Capping the period at 5 ms still left ~2 ms a
bundle, and each thread's start and join waits for the GIL: F2M's job at
10^6 users took a median of 100 ms with both threads and 92 ms without,
PrivKVM's 239 and 230 ms (15 and 10 runs each, interleaved).

And a worker weighs each side input it caches by its deep size
(``statecache.get_deep_size``, objsize underneath), which first lists the
globals of every loaded module (~2,300 here) so as not to count them: ~1.7
ms a side input, 15 ms of PrivKVM's job at 10^6 users (nine side inputs).
During an in-process job the same size is computed with those globals'
identities listed once for as long as the loaded modules stay the same
(``_deep_size``): PrivKVM's nine then take 2.5 ms, 1.6 of it the first.
"""
from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import sys
import threading
import time
import types

from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import DirectOptions
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner.fn_runner import BundleManager, FnApiRunner, ParallelBundleManager
from apache_beam.runners.worker import bundle_processor, statecache, statesampler


class _SparseParallelBundleManager(ParallelBundleManager):
    """``ParallelBundleManager`` that runs a bundle whose input lands in one
    partition on one worker (``BundleManager.process_bundle``) instead of
    fanning out to empty ones, and a bundle with no input at all nowhere."""

    def process_bundle(self, inputs, expected_outputs, fired_timers, expected_output_timers, dry_run=False):
        if not any(fired_timers.values()):
            occupied = _occupied_partitions(inputs, self._num_workers)
            if not occupied:
                return _NOTHING_RAN, []
            if occupied == 1:
                return BundleManager.process_bundle(self, inputs, expected_outputs, fired_timers,
                                                    expected_output_timers, dry_run)
        return super().process_bundle(inputs, expected_outputs, fired_timers, expected_output_timers, dry_run)


# What a bundle that processed no element and set no timer reports: no residuals, no metrics.
_NOTHING_RAN = beam_fn_api_pb2.InstructionResponse(process_bundle=beam_fn_api_pb2.ProcessBundleResponse())


def _occupied_partitions(inputs, num_workers: int) -> int:
    """How many of ``num_workers`` partitions of ``inputs`` hold data
    (``partition`` is Beam's own split, cached by the buffer, so the parallel
    path that may follow reuses it)."""
    occupied = set()
    for buffer in inputs.values():
        for index, part in enumerate(buffer.partition(num_workers)):
            if any(part):
                occupied.add(index)
    return len(occupied)


class LocalRunner(FnApiRunner):
    """``FnApiRunner`` whose stages with a single occupied partition run on
    one worker, and whose in-process jobs pickle with zlib and build their
    bundle processors without threads (module docstring). It notes when a
    job's stages start and end (``kvldp bench`` splits a job's time there)."""

    # ``time.perf_counter()`` when the last job's first stage started and its last ended (None before
    # a job): a job's time before the stages is its graph -- built, translated and fused -- however few users
    stages_started: float | None = None
    stages_ended: float | None = None

    def run_pipeline(self, pipeline, options):
        in_process = options.view_as(DirectOptions).direct_running_mode != "multi_processing"
        with in_process_job() if in_process else contextlib.nullcontext():
            return super().run_pipeline(pipeline, options)

    def run_stages(self, stage_context, stages):
        self.stages_started, self.stages_ended = time.perf_counter(), None
        try:
            return super().run_stages(stage_context, stages)
        finally:
            self.stages_ended = time.perf_counter()

    def _get_bundle_manager(self, bundle_context_manager):
        manager = super()._get_bundle_manager(bundle_context_manager)
        # every stage but a stateful one (Beam's manager then), one worker's too: it skips their empty bundles
        if not bundle_context_manager.stage.is_stateful():
            return _SparseParallelBundleManager(bundle_context_manager, self._progress_frequency,
                                                cache_token_generator=FnApiRunner.get_cache_token_generator(
                                                    static=False))
        return manager


_BeamStateSampler = statesampler.StateSampler


class StepTracker(_BeamStateSampler):
    """Beam's state sampler without its sampling thread: it tracks the
    current step, and measures no time (module docstring)."""

    def start(self) -> None:
        self.tracked_thread = threading.current_thread()
        statesampler.set_current_tracker(self)
        self.started = True

    def stop(self) -> None:
        statesampler.set_current_tracker(None)
        self.finished = True


class _InlineExecutor:
    """What ``BundleProcessor`` asks of a ``ThreadPoolExecutor``, running the
    task at once on the calling thread (module docstring)."""

    def __init__(self, max_workers=None, thread_name_prefix=""):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        return False

    def submit(self, fn, *args, **kwargs) -> concurrent.futures.Future:
        future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except BaseException as e:          # the caller's ``result()`` raises it, as from a thread
            future.set_exception(e)
        return future


_beams_concurrent = bundle_processor.concurrent
# ``concurrent`` as ``bundle_processor`` reads it (``concurrent.futures.X``), with the inline executor
_inline_concurrent = types.SimpleNamespace(futures=types.SimpleNamespace(
    ThreadPoolExecutor=_InlineExecutor, TimeoutError=concurrent.futures.TimeoutError))
_beams_deep_size = statecache.get_deep_size
_globals_seen: list = [None, frozenset()]  # (how many modules, the last loaded), and the ids excluded
_globals_lock = threading.Lock()


def _excluded_ids() -> frozenset:
    """What objsize excludes from a deep size: ``id(None)`` and
    ``id(vars(m))`` for every loaded module ``m``; listed again only when
    the loaded modules change. A module's ``__dict__`` is its own for its
    life, and an import adds a module at the end of ``sys.modules``, so
    the count and the last module tell a change (the only change they miss
    -- the last module removed and put back with one other removed -- leaves
    one more dict excluded, as it was a moment before)."""
    modules = sys.modules
    key = (len(modules), id(next(reversed(modules.values()), None)))
    with _globals_lock:
        seen, ids = _globals_seen
        if seen == key:
            return ids
    ids = frozenset([id(None), *(id(vars(m)) for m in list(modules.values()) if hasattr(m, "__dict__"))])
    with _globals_lock:
        _globals_seen[:] = [key, ids]
    return ids


def _size_settings():
    """objsize's settings for Beam's size, referent and filter functions,
    module globals left to ``_excluded_ids``; None where this objsize has no
    traversal context (0.7 on; Beam allows 0.6) or this Beam no such
    functions: then Beam's own ``get_deep_size`` stays."""
    try:
        from objsize.traverse import ObjSizeSettings
    except ImportError:
        return None
    functions = ("_get_referents_func", "_filter_func", "_size_func")
    if not hasattr(ObjSizeSettings, "new_context") or not all(hasattr(statecache, f) for f in functions):
        return None
    return ObjSizeSettings(get_referents_func=statecache._get_referents_func, filter_func=statecache._filter_func,
                           get_size_func=statecache._size_func, exclude_modules_globals=False)


_SIZE_SETTINGS = _size_settings()


def _deep_size(*objs) -> int:
    """``statecache.get_deep_size``: the same traversal, size and filter
    functions, with the ids it excludes from ``_excluded_ids`` instead of
    listed afresh on every call (a traversal only reads them)."""
    context = _SIZE_SETTINGS.new_context()
    context.exclude_set = _excluded_ids()
    return context.get_deep_size(*objs)


_beam_dumps, _beam_loads = pickler.dumps, pickler.loads
# (module, attribute, ours, Beam's): what an in-process job swaps while it runs
_SWAPS = [(statesampler, "StateSampler", StepTracker, _BeamStateSampler),
          (bundle_processor, "concurrent", _inline_concurrent, _beams_concurrent)]
if _SIZE_SETTINGS is not None:
    _SWAPS.append((statecache, "get_deep_size", _deep_size, _beams_deep_size))
_in_process_jobs = [0]          # in-process jobs running now (a job may start while another runs)
_jobs_lock = threading.Lock()


@contextlib.contextmanager
def in_process_job():
    """Within: Beam's pickler compresses with zlib, bundle processors are
    built on the worker's thread with a step tracker for a state sampler,
    and cached side inputs are weighed without listing every module's
    globals each time (module docstring)."""
    with _jobs_lock:
        _in_process_jobs[0] += 1
        for module, name, ours, _ in _SWAPS:
            setattr(module, name, ours)
    try:
        yield
    finally:
        with _jobs_lock:
            _in_process_jobs[0] -= 1
            if not _in_process_jobs[0]:
                for module, name, _, beams in _SWAPS:
                    setattr(module, name, beams)


def _dumps(o, enable_trace=True, use_zlib=False, **kwargs):
    return _beam_dumps(o, enable_trace=enable_trace, use_zlib=use_zlib or _in_process_jobs[0] > 0, **kwargs)


def _loads(encoded, enable_trace=True, use_zlib=False):
    return _beam_loads(encoded, enable_trace=enable_trace, use_zlib=use_zlib or is_zlib_payload(encoded))


def is_zlib_payload(encoded) -> bool:
    """Whether Beam's base64 payload holds a zlib stream (first byte ``x``,
    deflate with a 32 KiB window) rather than bz2 (``BZh``)."""
    return base64.b64decode(encoded[:4])[:1] == b"x"


pickler.dumps, pickler.loads = _dumps, _loads
