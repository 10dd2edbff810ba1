"""The local runner (``kvldp/pipelines/local_runner.py``): a one-element stage
runs on one worker, a stage with work for both on both, and the output is
Beam's; in-process jobs pickle with zlib and every payload still loads, and
build their bundle processors without Beam's two threads."""
from __future__ import annotations

import threading

import apache_beam as beam
import pytest
from apache_beam.internal import pickler
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from kvldp.pipelines import local_runner, runner

_SETUPS: dict[str, set[int]] = {}
_LOCK = threading.Lock()


class _RecordWorkers(beam.DoFn):
    """Records which DoFn instances (one per worker that sets the stage up) ran."""

    def __init__(self, name: str):
        self._name = name

    def setup(self):
        with _LOCK:
            _SETUPS.setdefault(self._name, set()).add(id(self))

    def process(self, element):
        yield element


def _graph(p):
    one = p | "One" >> beam.Create([7]) | "OneStage" >> beam.ParDo(_RecordWorkers("one"))
    many = (p | "Many" >> beam.Create(range(1000)) | beam.Reshuffle()
            | "ManyStage" >> beam.ParDo(_RecordWorkers("many")))
    total = many | beam.CombineGlobally(sum)
    return one, total


@pytest.mark.parametrize("make_runner, one_stage_workers", [(local_runner.LocalRunner, 1), (FnApiRunner, 2)])
def test_one_element_stages_run_on_one_worker_and_outputs_are_beams(make_runner, one_stage_workers):
    _SETUPS.clear()
    options = runner.JobOptions(["--direct_num_workers=2", "--direct_running_mode=in_memory"])
    with beam.Pipeline(runner=make_runner(), options=options) as p:
        one, total = _graph(p)
        assert_that(one, equal_to([7]), label="OneIsKept")
        assert_that(total, equal_to([sum(range(1000))]), label="TotalIsKept")
    assert len(_SETUPS["one"]) == one_stage_workers
    assert len(_SETUPS["many"]) == 2          # a stage with work for both workers still uses both


def _empty_graph(p):
    """A stage whose input is empty: the output of a GroupByKey that received nothing."""
    nothing = (p | "Seed" >> beam.Create([1, 2]) | "NoneKept" >> beam.Filter(lambda x: x > 5)
               | "Key" >> beam.Map(lambda x: (x, x)) | "Group" >> beam.GroupByKey())
    return nothing | "EmptyStage" >> beam.ParDo(_RecordWorkers("empty"))


@pytest.mark.parametrize("make_runner, workers", [(local_runner.LocalRunner, 0), (FnApiRunner, 2)])
@pytest.mark.parametrize("count", [1, 2])
def test_a_stage_without_input_does_not_run(make_runner, workers, count):
    """Beam runs such a stage anyway (on every worker); the local runner
    does not, and what comes out is the same: nothing, and a side input of it
    is empty."""
    _SETUPS.clear()
    options = runner.JobOptions([f"--direct_num_workers={count}", "--direct_running_mode=in_memory"])
    with beam.Pipeline(runner=make_runner(), options=options) as p:
        empty = _empty_graph(p)
        assert_that(empty, equal_to([]), label="NothingOut")
        sizes = p | "Probe" >> beam.Create([0]) | beam.Map(lambda _, side: len(side), beam.pvalue.AsList(empty))
        assert_that(sizes, equal_to([0]), label="EmptySide")
    assert len(_SETUPS.get("empty", ())) == min(workers, count)


def test_the_cli_pipeline_runs_on_the_local_runner():
    assert isinstance(runner.make_pipeline([]).runner, local_runner.LocalRunner)


class _PickleInside(beam.DoFn):
    def process(self, element):
        yield local_runner.is_zlib_payload(pickler.dumps(element))


def test_in_process_jobs_pickle_with_zlib_and_everything_loads():
    assert not local_runner.is_zlib_payload(pickler.dumps({"a": 1}))       # outside a job: Beam's bz2
    with runner.make_pipeline([]) as p:
        inside = p | beam.Create([1, 2]) | beam.ParDo(_PickleInside())
        assert_that(inside, equal_to([True, True]))
    assert not local_runner.is_zlib_payload(pickler.dumps({"a": 1}))       # and after it
    with local_runner.in_process_job():
        zlib_payload = pickler.dumps({"a": 1})
    bz2_payload = pickler.dumps({"a": 1})
    assert local_runner.is_zlib_payload(zlib_payload) and not local_runner.is_zlib_payload(bz2_payload)
    assert pickler.loads(zlib_payload) == pickler.loads(bz2_payload) == {"a": 1}
    assert pickler.loads(zlib_payload.decode()) == {"a": 1}                 # str payloads, as protos carry them


_BUILT_ON: list[str] = []


class _BuildAndStepTracker(beam.DoFn):
    """Records the thread that unpickles it on the worker (Beam builds a
    stage's operator tree there) and yields the kind of state sampler its
    bundle runs under, counting each element in a user metric."""

    def __setstate__(self, state):
        self.__dict__.update(state)
        with _LOCK:
            _BUILT_ON.append(threading.current_thread().name)

    def process(self, element):
        from apache_beam.runners.worker import statesampler
        beam.metrics.Metrics.counter("test", "seen").inc()
        yield type(statesampler.get_current_tracker()).__name__


def test_in_process_bundles_build_on_the_workers_thread_with_a_step_tracker_and_beams_come_back():
    _BUILT_ON.clear()
    p = runner.make_pipeline([])
    kinds = p | beam.Create([1, 2, 3]) | beam.ParDo(_BuildAndStepTracker())
    assert_that(kinds, equal_to(["StepTracker"] * 3))
    result = p.run()
    result.wait_until_finish()
    # user metrics still find their step through the tracker
    seen = result.metrics().query(beam.metrics.MetricsFilter().with_name("seen"))["counters"]
    assert [c.committed for c in seen] == [3]
    workers = [name for name in _BUILT_ON if name != threading.current_thread().name]   # not the graph's roundtrip
    assert workers and not any(name.startswith("ExecutionTreeCreator") for name in workers), workers
    from apache_beam.runners.worker import bundle_processor, statesampler
    assert statesampler.StateSampler is local_runner._BeamStateSampler
    assert bundle_processor.concurrent is local_runner._beams_concurrent
    assert statesampler.StateSampler("x", None).sampling_period_ms == 200


def test_beams_runner_builds_on_its_thread_with_its_sampler():
    """The other side of the test above: outside a ``LocalRunner`` job Beam's
    own thread and sampler run (so the test above can fail)."""
    _BUILT_ON.clear()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        kinds = p | beam.Create([1]) | beam.ParDo(_BuildAndStepTracker())
        assert_that(kinds, equal_to(["StateSampler"]))
    assert any(name.startswith("ExecutionTreeCreator") for name in _BUILT_ON), _BUILT_ON


def test_the_inline_executor_returns_or_raises_as_a_thread_would():
    with local_runner._InlineExecutor(max_workers=1, thread_name_prefix="x") as executor:
        assert executor.submit(lambda a, b=0: a + b, 2, b=3).result(timeout=1) == 5
        failed = executor.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failed.result(timeout=1)


def test_subprocess_workers_keep_beams_codec(monkeypatch):
    seen = []
    monkeypatch.setattr(FnApiRunner, "run_pipeline",
                        lambda self, pipeline, options: seen.append(local_runner._in_process_jobs[0]))
    for mode, expected in (("multi_processing", 0), ("in_memory", 1), ("multi_threading", 1)):
        options = runner.JobOptions([f"--direct_running_mode={mode}"])
        local_runner.LocalRunner().run_pipeline(None, options)
        assert seen.pop() == expected, mode


def _sized_values():
    import types as pytypes

    import numpy as np

    from kvldp.mechanisms.protocol import ProtocolState
    fresh = pytypes.ModuleType("kvldp_test_fresh_module")
    fresh.table = list(range(1000))
    return [
        [ProtocolState(1, np.arange(100.0), False, 0.5, None)],
        [("spec", i, np.zeros(8)) for i in range(20)],
        {"a": [1, 2.0, "three"], "b": (None, b"x" * 100)},
        [np.arange(10_000), _sized_values, vars(np)],       # a function and a module's globals: not counted
        [fresh, vars(fresh)],
        [],
    ], fresh


def test_side_inputs_weigh_what_beam_weighs_and_new_modules_count_as_loaded():
    import sys

    values, fresh = _sized_values()
    for value in values:
        assert local_runner._deep_size(value) == local_runner._beams_deep_size(value), value
    before = local_runner._deep_size(values[4])
    sys.modules[fresh.__name__] = fresh          # now loaded: its globals are excluded, as Beam's function does
    try:
        assert local_runner._deep_size(values[4]) == local_runner._beams_deep_size(values[4]) < before
    finally:
        del sys.modules[fresh.__name__]
    assert local_runner._deep_size(values[4]) == before
    assert local_runner._excluded_ids() is local_runner._excluded_ids()    # listed once


def test_an_in_process_job_weighs_side_inputs_with_the_listed_globals():
    from apache_beam.runners.worker import statecache
    p = runner.make_pipeline([])
    side = p | "Side" >> beam.Create([5])
    out = p | beam.Create([1, 2]) | beam.Map(lambda x, s: x + s, beam.pvalue.AsSingleton(side))
    assert_that(out, equal_to([6, 7]))
    sized = []
    original = local_runner._excluded_ids

    def counted():
        sized.append(1)
        return original()

    local_runner._excluded_ids = counted
    try:
        p.run().wait_until_finish()
    finally:
        local_runner._excluded_ids = original
    assert sized                                     # the side input was weighed by ``_deep_size``
    assert statecache.get_deep_size is local_runner._beams_deep_size
