"""Tweak ``inline_bundle_setup``: an in-process worker builds a stage's
bundle processor on its own thread, with a state sampler that has no
sampling thread.

Beam builds a stage's operator tree on an ``ExecutionTreeCreator`` thread
that the worker waits for (2.77; ``bundle_processor.BundleProcessor``):
that thread is there so that a remote SDK harness stuck unpickling a DoFn
can time out and terminate itself, and an in-process worker's harness is
the user's own process. Here the tree is built on the worker's thread
(``_InlineExecutor`` for the ``concurrent`` that ``bundle_processor``
reads; 2.62 builds it inline already).

And Beam's state sampler runs a thread that samples the current step
(``statesampler_fast.pyx``) whose ``stop()`` joins it after it slept out
its current period (it grows 1.2x per wake from 2 ms to 200 ms): every
bundle that ran longer than ~1 s waited up to 0.2 s more at its end.
``StepTracker`` tracks the current step without that thread: user metrics
(the pipeline's tallies) find their step through it as before, but no time
is attributed to steps, so Beam's per-step ``msecs`` metrics read 0 on the
local runner.

Applied while a ``LocalRunner`` job with in-process workers runs
(``in_memory``, ``multi_threading``); subprocess workers are Beam's own.
"""
from __future__ import annotations

import concurrent.futures
import threading
import types

from apache_beam.runners.worker import bundle_processor, statesampler

from kvldp.runtime.tweaks import Swap


class StepTracker(statesampler.StateSampler):
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


# ``concurrent`` as ``bundle_processor`` reads it (``concurrent.futures.X``), with the inline executor
_inline_concurrent = types.SimpleNamespace(futures=types.SimpleNamespace(
    ThreadPoolExecutor=_InlineExecutor, TimeoutError=concurrent.futures.TimeoutError))

SWAP = Swap((statesampler, "StateSampler", StepTracker),
            # 2.62 builds the tree on the worker's thread already: no ``concurrent`` to replace
            *([(bundle_processor, "concurrent", _inline_concurrent)] if hasattr(bundle_processor, "concurrent")
              else []))
