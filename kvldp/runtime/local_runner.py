"""kvldp's local runner: Beam's in-process FnApiRunner, and the tweaks
around a job on it.

``make_runner`` gives ``LocalRunner`` with the tweaks that apply here
(``tweaks.active``), or Beam's own ``FnApiRunner`` when none of Beam's
does (``KVLDP_STOCK_BEAM=1``, an untested Beam), saying so once.

Tweak ``sparse_bundles``: with two workers, Beam's ``ParallelBundleManager``
splits every stage's input into two partitions and runs both, each on its
own embedded worker (``fn_runner.py``). Most of a kvldp graph's stages hold
one element -- the Impulse that starts a branch, a global combine's merge,
a round's calibration, the estimates' write -- so the second partition is
empty, and running it still builds that stage's whole operator tree on the
second worker (unpickling every DoFn, monitoring infos). ``LocalRunner``
runs a stage on one worker when only one partition holds input (and there
are no timers, which Beam sends to the first worker only); a stage with
input in several partitions runs in parallel as before. An empty
partition's bundle processes no element, so skipping it changes no output
(none of kvldp's DoFns, nor Beam's lifted combines and file writes, emit
from ``finish_bundle`` without input). For the same reason a stage with no
input at all (and no timers) does not run: a protocol that stopped early
leaves its later rounds without input (``transforms/rounds.py``). A
stateful stage keeps Beam's bundle manager.

While a job runs, ``LocalRunner`` applies its other tweaks of Beam:
the memos that graph construction and each stage's set-up
ask for (``graph_swaps``; ``tuned`` applies them around a whole command, so
that building its graphs gains too), and, with in-process workers, the
zlib pickles and the thread-less bundle set-up (``in_process_swaps``).

``LocalRunner`` also notes when a job's stages start and end (``kvldp
bench`` splits a job's time there; Beam's own runner has no such note).
"""
from __future__ import annotations

import contextlib
import time

from apache_beam.options.pipeline_options import DirectOptions
from apache_beam.portability.api import beam_fn_api_pb2
from apache_beam.runners.portability.fn_api_runner.fn_runner import BundleManager, FnApiRunner, ParallelBundleManager

from kvldp.runtime import argspecs, bundle_setup, dofn_specs, pickles, tweaks, yield_check

# tweak name -> what it swaps while a command's graph is built and its job runs
GRAPH_SWAPS = {"memo_argspecs": argspecs.SWAP, "memo_dofn_specs": dofn_specs.SWAP,
               "memo_yield_check": yield_check.SWAP}
# ... and while a job with in-process workers runs
IN_PROCESS_SWAPS = {"zlib_pickles": pickles.SWAP, "inline_bundle_setup": bundle_setup.SWAP}


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


@contextlib.contextmanager
def applied(swaps):
    """A context in which every swap of ``swaps`` is applied (from its entry,
    not from the call that makes it)."""
    with contextlib.ExitStack() as stack:
        for swap in swaps:
            stack.enter_context(swap.applied())
        yield


def graph_swaps(chosen: frozenset[str]) -> list[tweaks.Swap]:
    return [swap for name, swap in GRAPH_SWAPS.items() if name in chosen]


def in_process_swaps(chosen: frozenset[str]) -> list[tweaks.Swap]:
    return [swap for name, swap in IN_PROCESS_SWAPS.items() if name in chosen]


class LocalRunner(FnApiRunner):
    """``FnApiRunner`` with kvldp's tweaks (``chosen``; module docstring)
    applied while its jobs run. It notes when a job's stages start and end."""

    # ``time.perf_counter()`` when the last job's first stage started and its last ended (None before
    # a job): a job's time before the stages is its graph -- built, translated and fused -- however few users
    stages_started: float | None = None
    stages_ended: float | None = None

    def __init__(self, chosen: frozenset[str] | None = None, **kwargs):
        super().__init__(**kwargs)
        self.tweaks = tweaks.active() if chosen is None else frozenset(chosen)

    def run_pipeline(self, pipeline, options):
        in_process = options.view_as(DirectOptions).direct_running_mode != "multi_processing"
        swaps = graph_swaps(self.tweaks) + (in_process_swaps(self.tweaks) if in_process else [])
        with applied(swaps):
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
        if "sparse_bundles" in self.tweaks and not bundle_context_manager.stage.is_stateful():
            return _SparseParallelBundleManager(bundle_context_manager, self._progress_frequency,
                                                cache_token_generator=FnApiRunner.get_cache_token_generator(
                                                    static=False))
        return manager


def beam_tweaks(chosen: frozenset[str]) -> frozenset[str]:
    """The tweaks of ``chosen`` that touch Beam (not the process alone)."""
    touching = {t.name for t in tweaks.TWEAKS if t.tested}
    return frozenset(chosen) & touching


def make_runner() -> FnApiRunner:
    """The runner of a local batch job: ``LocalRunner`` with the tweaks that
    apply here, or Beam's ``FnApiRunner`` as Beam ships it when none of
    Beam's does (said once, with the reason)."""
    chosen = tweaks.active()
    if not beam_tweaks(chosen):
        tweaks.note_stock(tweaks.stock_reason() or "no tweak of Beam's selected")
        return FnApiRunner()
    return LocalRunner(chosen)


def tuned(local: bool) -> contextlib.AbstractContextManager:
    """Around a command whose jobs run on the local runner (``local``): the
    graph tweaks that apply here, so that its graphs are built with them
    too; anything else runs as Beam ships it."""
    return applied(graph_swaps(tweaks.active())) if local else contextlib.nullcontext()
