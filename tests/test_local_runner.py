"""The local runner (``kvldp/runtime/local_runner.py``): a one-element stage
runs on one worker, a stage with work for both on both, and the output is
Beam's; in-process jobs pickle with zlib and every payload still loads, and
build their bundle processors without Beam's two threads; Beam's own
functions are back once a job ends, and with ``KVLDP_STOCK_BEAM=1`` a job
runs on Beam's own runner."""
from __future__ import annotations

import threading

import apache_beam as beam
import pytest
from apache_beam.internal import pickler
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from kvldp.runtime import bundle_setup, local_runner, pickles, tweaks
from kvldp.runtime import jobs as runner
from kvldp.runtime.options import JobOptions

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


ALL = frozenset(tweaks.TWEAK_NAMES)


@pytest.mark.parametrize("make_runner, one_stage_workers", [(lambda: local_runner.LocalRunner(ALL), 1),
                                                            (FnApiRunner, 2)])
def test_one_element_stages_run_on_one_worker_and_outputs_are_beams(make_runner, one_stage_workers):
    _SETUPS.clear()
    options = JobOptions(["--direct_num_workers=2", "--direct_running_mode=in_memory"])
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


@pytest.mark.parametrize("make_runner, workers", [(lambda: local_runner.LocalRunner(ALL), 0), (FnApiRunner, 2)])
@pytest.mark.parametrize("count", [1, 2])
def test_a_stage_without_input_does_not_run(make_runner, workers, count):
    """Beam runs such a stage anyway (on every worker); the local runner
    does not, and what comes out is the same: nothing, and a side input of it
    is empty."""
    _SETUPS.clear()
    options = JobOptions([f"--direct_num_workers={count}", "--direct_running_mode=in_memory"])
    with beam.Pipeline(runner=make_runner(), options=options) as p:
        empty = _empty_graph(p)
        assert_that(empty, equal_to([]), label="NothingOut")
        sizes = p | "Probe" >> beam.Create([0]) | beam.Map(lambda _, side: len(side), beam.pvalue.AsList(empty))
        assert_that(sizes, equal_to([0]), label="EmptySide")
    assert len(_SETUPS.get("empty", ())) == min(workers, count)


def test_the_cli_pipeline_runs_on_the_local_runner_and_on_beams_own_when_stock(monkeypatch, caplog):
    assert isinstance(runner.make_pipeline([]).runner, local_runner.LocalRunner)
    monkeypatch.setenv(tweaks.STOCK_ENV, "1")
    with caplog.at_level("INFO", logger="kvldp.runtime"):
        stock = runner.make_pipeline([])
    assert type(stock.runner) is FnApiRunner and type(stock.options) is PipelineOptions
    assert any("stock Beam" in r.getMessage() and tweaks.STOCK_ENV in r.getMessage() for r in caplog.records) or \
        tweaks.STOCK_ENV + "=1" in tweaks._noted


def test_a_beam_release_outside_the_tested_set_runs_stock(monkeypatch):
    monkeypatch.setattr(tweaks, "beam_version", lambda: "2.999.0")
    assert tweaks.active() == {t.name for t in tweaks.TWEAKS if not t.tested}
    assert "not a release" in tweaks.stock_reason()
    assert type(runner.make_pipeline([]).runner) is FnApiRunner


class _PickleInside(beam.DoFn):
    def process(self, element):
        yield pickles.is_zlib_payload(pickler.dumps(element))


def test_in_process_jobs_pickle_with_zlib_and_everything_loads():
    assert not pickles.is_zlib_payload(pickler.dumps({"a": 1}))       # outside a job: Beam's bz2
    with runner.make_pipeline([]) as p:
        inside = p | beam.Create([1, 2]) | beam.ParDo(_PickleInside())
        assert_that(inside, equal_to([True, True]))
    assert not pickles.is_zlib_payload(pickler.dumps({"a": 1}))       # and after it
    assert pickler.dumps is pickles._beam_dumps and pickler.loads is pickles._beam_loads
    with pickles.SWAP.applied():
        zlib_payload = pickler.dumps({"a": 1})
    bz2_payload = pickler.dumps({"a": 1})
    assert pickles.is_zlib_payload(zlib_payload) and not pickles.is_zlib_payload(bz2_payload)
    with pickles.SWAP.applied():                # during a job either codec loads
        assert pickler.loads(zlib_payload) == pickler.loads(bz2_payload) == {"a": 1}
        assert pickler.loads(zlib_payload.decode()) == {"a": 1}             # str payloads, as protos carry them
    assert pickler.loads(bz2_payload) == {"a": 1}


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
    assert statesampler.StateSampler is not bundle_setup.StepTracker
    assert getattr(bundle_processor, "concurrent", None) is not bundle_setup._inline_concurrent
    assert statesampler.StateSampler("x", None).sampling_period_ms == 200


def test_beams_runner_builds_on_its_thread_with_its_sampler():
    """The other side of the test above: outside a ``LocalRunner`` job Beam's
    own thread and sampler run (so the test above can fail)."""
    _BUILT_ON.clear()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        kinds = p | beam.Create([1]) | beam.ParDo(_BuildAndStepTracker())
        assert_that(kinds, equal_to(["StateSampler"]))
    from apache_beam.runners.worker import bundle_processor
    if hasattr(bundle_processor, "concurrent"):       # Beam 2.7x builds the tree on a thread of its own (2.62 not)
        assert any(name.startswith("ExecutionTreeCreator") for name in _BUILT_ON), _BUILT_ON


def test_the_inline_executor_returns_or_raises_as_a_thread_would():
    with bundle_setup._InlineExecutor(max_workers=1, thread_name_prefix="x") as executor:
        assert executor.submit(lambda a, b=0: a + b, 2, b=3).result(timeout=1) == 5
        failed = executor.submit(lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        failed.result(timeout=1)


def test_subprocess_workers_keep_beams_codec(monkeypatch):
    seen = []
    monkeypatch.setattr(FnApiRunner, "run_pipeline",
                        lambda self, pipeline, options: seen.append(pickles.SWAP.in_use))
    for mode, expected in (("multi_processing", False), ("in_memory", True), ("multi_threading", True)):
        options = JobOptions([f"--direct_running_mode={mode}"])
        local_runner.LocalRunner(ALL).run_pipeline(None, options)
        assert seen.pop() == expected, mode
