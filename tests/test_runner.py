"""The CLI's local runner: ``in_memory`` by default, never ``multi_threading``
unless asked (issue 15, item 2).

``multi_threading``'s data plane flushes from a timer thread in the middle of
an element, and the runner then decodes half an element: a runaway
allocation or ``Unknown type tag`` (DESIGN.md, ``shared/repro/beam_timed_flush.py``).
These tests only build pipelines (nothing runs); ``tests/test_soak.py``
(``pytest -m slow``) runs whole jobs many times.
"""
from __future__ import annotations

import os
import warnings

import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import DirectOptions, PipelineOptions, StandardOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from kvldp.runtime.jobs import make_pipeline


def _direct(pipeline) -> DirectOptions:
    return pipeline.options.view_as(DirectOptions)


def _runner_warnings(record) -> list:
    return [w for w in record if issubclass(w.category, RuntimeWarning) and "multi_threading" in str(w.message)]


def _build(args):
    """``make_pipeline(args)`` and the multi_threading RuntimeWarnings it emitted."""
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        pipeline = make_pipeline(args)
    return pipeline, _runner_warnings(record)


def test_default_is_in_memory_fnapi_runner_with_two_workers():
    pipeline, warned = _build([])
    assert isinstance(pipeline.runner, FnApiRunner)          # no Prism download attempt
    assert _direct(pipeline).direct_running_mode == "in_memory"
    assert _direct(pipeline).direct_running_mode != "multi_threading"
    assert _direct(pipeline).direct_num_workers == min(2, os.cpu_count() or 1)
    assert not warned


def test_unrelated_beam_options_keep_the_safe_default():
    pipeline, warned = _build(["--job_name", "x", "--direct_runner_bundle_repeat", "0"])
    assert _direct(pipeline).direct_running_mode == "in_memory"
    assert _direct(pipeline).direct_num_workers == min(2, os.cpu_count() or 1)
    assert not warned


@pytest.mark.parametrize("args", [["--direct_running_mode", "multi_threading"],
                                  ["--direct_running_mode=multi_threading"]])
def test_explicit_multi_threading_is_kept_but_warns(args):
    with pytest.warns(RuntimeWarning, match="multi_threading"):
        pipeline = make_pipeline(args)
    assert isinstance(pipeline.runner, FnApiRunner)
    assert _direct(pipeline).direct_running_mode == "multi_threading"
    assert _direct(pipeline).direct_num_workers == min(2, os.cpu_count() or 1)


@pytest.mark.parametrize("args", [["--direct_running_mode", "in_memory"], ["--direct_running_mode=in_memory"]])
def test_explicit_in_memory_does_not_warn(args):
    pipeline, warned = _build(args)
    assert not warned
    assert _direct(pipeline).direct_running_mode == "in_memory"


def test_explicit_worker_count_is_kept():
    pipeline, warned = _build(["--direct_num_workers", "1"])
    assert _direct(pipeline).direct_num_workers == 1
    assert _direct(pipeline).direct_running_mode == "in_memory"
    assert not warned


@pytest.mark.parametrize("extra", [[], ["--direct_running_mode", "multi_threading", "--direct_num_workers", "3"]])
def test_explicit_runner_passes_through_untouched(extra):
    args = ["--runner", "DirectRunner", *extra]
    pipeline, warned = _build(args)
    assert not isinstance(pipeline.runner, FnApiRunner)
    assert pipeline.options.view_as(StandardOptions).runner == "DirectRunner"
    # every option exactly as a plain Beam pipeline has it: nothing set or overridden
    plain = beam.Pipeline(options=PipelineOptions(args))
    assert pipeline.options.get_all_options() == plain.options.get_all_options()
    assert _direct(pipeline).direct_running_mode == PipelineOptions(args).view_as(DirectOptions).direct_running_mode
    assert not warned


def test_the_command_freezes_its_imports_once_before_any_job():
    """``kvldp``'s start moves what its imports made into the collector's
    permanent generation (tweak ``gc_freeze``): a full collection walked
    ~1.1 M objects, 0.08 s after every job. Once only: a later freeze would
    pin what the jobs since left for the collector. Not with
    ``KVLDP_STOCK_BEAM=1``, nor for a remote runner, nor on import."""
    import subprocess
    import sys
    import textwrap

    probe = textwrap.dedent("""
        import gc, sys
        import kvldp.cli.commands, kvldp.runtime.start
        assert gc.get_freeze_count() == 0              # importing froze nothing
        from kvldp.runtime import process, start
        start.main(["advise", "--epsilon", "2", "--users", "1000", "--keys", "10", *sys.argv[1:]])
        frozen = gc.get_freeze_count()
        garbage = [[] for _ in range(1000)]
        for a, b in zip(garbage, garbage[1:]):
            a.append(b); b.append(a)          # cycles, for the collector to free
        del garbage
        process.settle_imports()
        print(frozen, gc.get_freeze_count(), gc.collect())
    """)

    def run(*args, stock=False):
        env = {**os.environ, "KVLDP_STOCK_BEAM": "1" if stock else ""}
        out = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, check=True,
                             env=env)
        return tuple(map(int, out.stdout.split()[-3:]))

    frozen, after, collected = run()
    assert frozen > 100_000 and after == frozen and collected >= 1000
    assert run(stock=True)[0] == 0
    assert run("--runner", "DirectRunner")[0] == 0


@pytest.mark.parametrize("copy_of", ["deepcopy", "pickle"])
def test_job_options_copies_make_their_own_views_of_their_own_values(copy_of, monkeypatch):
    """A copy of ``JobOptions`` (``Pipeline`` deep-copies its options) holds
    the values, not the original's views: changing one does not change the
    other, and copying parses no flags for the views it leaves behind."""
    import copy
    import pickle

    from apache_beam.options.pipeline_options import GoogleCloudOptions, SetupOptions, TypeOptions

    from kvldp.runtime.options import JobOptions

    original = JobOptions(["--direct_num_workers=2", "--save_main_session"])
    for cls in (StandardOptions, DirectOptions, SetupOptions, TypeOptions, GoogleCloudOptions):
        original.view_as(cls)
    parses = []
    init = PipelineOptions.__init__
    monkeypatch.setattr(PipelineOptions, "__init__",
                        lambda self, *a, **k: parses.append(type(self)) or init(self, *a, **k))
    made = copy.deepcopy(original) if copy_of == "deepcopy" else pickle.loads(pickle.dumps(original))
    assert parses == []
    assert "_views" not in made.__dict__ and made._all_options is not original._all_options
    assert made.view_as(DirectOptions).direct_num_workers == 2 and made.view_as(SetupOptions).save_main_session
    made.view_as(DirectOptions).direct_num_workers = 1
    assert original.view_as(DirectOptions).direct_num_workers == 2
    assert made.get_all_options()["direct_num_workers"] == 1
    assert made.view_as(DirectOptions) is made.view_as(DirectOptions)          # its views are kept again


def test_job_options_views_keep_their_option_names():
    """A view of ``JobOptions`` lists its option names once: reads, writes
    (shared with every other view), ``dir``, ``str`` and an unknown name's
    error behave as on Beam's view, without listing the parsed namespace
    again (Beam sorts ``dir`` of it on every attribute access)."""
    import pickle

    from apache_beam.options.pipeline_options import TypeOptions

    from kvldp.runtime.options import JobOptions

    options = JobOptions(["--direct_num_workers=2", "--pipeline_type_check"])
    direct, beams = options.view_as(DirectOptions), PipelineOptions(["--direct_num_workers=2"]).view_as(DirectOptions)
    assert list(direct._visible_option_list()) == beams._visible_option_list()
    assert str(direct) == str(beams)
    direct.__dict__["_visible_options"] = _Unlistable()        # listing it again would raise
    assert direct.direct_num_workers == 2
    direct.direct_num_workers = 1
    assert options.view_as(DirectOptions).direct_num_workers == 1
    assert options.get_all_options()["direct_num_workers"] == 1
    assert options.view_as(TypeOptions).pipeline_type_check is True
    with pytest.raises(AttributeError, match="no attribute 'not_an_option'"):
        _ = direct.not_an_option
    with pytest.raises(AttributeError, match="no attribute 'not_an_option'"):
        direct.not_an_option = 3
    typed = options.view_as(TypeOptions)
    restored = pickle.loads(pickle.dumps(typed))
    assert restored.pipeline_type_check is True and list(restored._visible_option_list()) == list(
        typed._visible_option_list())


class _Unlistable:
    def __dir__(self):
        raise AssertionError("the view listed its namespace again")
