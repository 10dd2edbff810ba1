"""``CombineAll``: Beam's ``CombineGlobally`` with its default for no input
injected on an Impulse instead of a ``Create([None])`` (issue 17: every
round of a job paid for two ParDos that only made ``None``), and a
synthetic domain's key names as a constant instead of a stage.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import window

from kvldp.mechanisms.kv.pckv import PCKVGRR
from kvldp.mechanisms.kv.privkvm import PrivKVMPlus
from kvldp.pipelines import sources
from kvldp.pipelines.graphs import simulate_graph
from kvldp.transforms.global_combine import ArraySumCombineFn, CombineAll, CombineWithoutDefaults


def _nan_as_text(value):
    return "nan" if isinstance(value, float) and np.isnan(value) else value


@pytest.mark.parametrize("values", [[3, 1, 4, 1, 5], [7], []])
@pytest.mark.parametrize("fanout", [None, 3])
def test_it_gives_what_combine_globally_gives(values, fanout):
    for fn in (sum, beam.combiners.CountCombineFn(), beam.combiners.MeanCombineFn()):
        theirs = beam.CombineGlobally(fn)
        if fanout:
            theirs = theirs.with_fanout(fanout)
        expected = {sum: sum(values), beam.combiners.CountCombineFn: len(values),
                    beam.combiners.MeanCombineFn: np.mean(values) if values else float("nan")}
        with beam.Pipeline() as p:
            # an empty input that is a real PCollection (Create([]) would be typed Any and trivially empty)
            source = p | beam.Create(values or [0]) | "Keep" >> beam.Filter(lambda _, keep: keep, bool(values))
            ours = source | "Ours" >> CombineAll(fn, fanout) | "OursText" >> beam.Map(_nan_as_text)
            beams = source | "Theirs" >> theirs | "TheirsText" >> beam.Map(_nan_as_text)
            want = [_nan_as_text(expected[fn if fn is sum else type(fn)])]
            assert_that(ours, equal_to(want), label="ours")
            assert_that(beams, equal_to(want), label="theirs")


class _TypedSum(beam.CombineFn):
    """A CombineFn whose output type is stated (the combined value's coder follows it)."""

    def create_accumulator(self):
        return 0

    def add_input(self, total, value):
        return total + value

    def merge_accumulators(self, totals):
        return sum(totals)

    def extract_output(self, total):
        return total

    def default_type_hints(self):
        return beam.typehints.decorators.IOTypeHints.empty().with_input_types(int).with_output_types(int)


def _element_types(transform, source_type=None):
    """Each step's output element type and full label, the steps' labels in order."""
    p = beam.Pipeline()
    source = p | beam.Create([1, 2])
    if source_type is not None:
        source = source | beam.Map(lambda x: x).with_output_types(source_type)
    source | "Combine" >> transform
    found = []

    class Types(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            if node.full_label.startswith("Combine/"):
                found.append((node.full_label, [str(o.element_type) for o in node.outputs.values()]))

        enter_composite_transform = visit_transform

    p.visit(Types())
    return found


@pytest.mark.parametrize("fn", [sum, _TypedSum(), ArraySumCombineFn(3)])
@pytest.mark.parametrize("fanout", [None, 2])
@pytest.mark.parametrize("source_type", [None, int])
def test_without_defaults_builds_beams_steps_and_types(fn, fanout, source_type):
    """``CombineWithoutDefaults`` is ``CombineGlobally(fn).without_defaults()``
    step for step: the same labels and the same element types (so coders),
    its ``UnKey``'s type stated where Beam infers it from a lambda."""
    theirs = beam.CombineGlobally(fn).without_defaults()
    if fanout:
        theirs = theirs.with_fanout(fanout)
    assert _element_types(CombineWithoutDefaults(fn, fanout), source_type) == _element_types(theirs, source_type)


@pytest.mark.parametrize("fanout", [None, 3])
def test_without_defaults_combines_each_window_that_has_input(fanout):
    events = [(1, 0.0), (2, 1.0), (3, 12.0), (4, 25.0), (5, 26.0)]
    with beam.Pipeline() as p:
        windowed = (p | beam.Create(events) | beam.Map(lambda e: window.TimestampedValue(*e))
                    | beam.WindowInto(window.FixedWindows(10)))
        ours = windowed | "Ours" >> CombineWithoutDefaults(sum, fanout)
        theirs = windowed | "Theirs" >> beam.CombineGlobally(sum).without_defaults()
        assert_that(ours, equal_to([3, 3, 9]), label="ours")
        assert_that(theirs, equal_to([3, 3, 9]), label="theirs")


def test_no_input_gives_the_combine_fns_empty_value():
    with beam.Pipeline() as p:
        empty = p | beam.Create([np.ones(3)]) | beam.Filter(lambda _: False)
        out = empty | CombineAll(ArraySumCombineFn(3)) | beam.Map(lambda a: a.tolist())
        assert_that(out, equal_to([[0.0, 0.0, 0.0]]))


def test_a_windowed_input_is_refused_with_the_way_out():
    windowed = beam.Pipeline() | beam.Create([1, 2]) | beam.WindowInto(window.FixedWindows(10))
    with pytest.raises(ValueError, match="without_defaults"):
        windowed | CombineAll(sum)


def _labels(protocol, users: int = 200):
    data = sources.DataConfig("synthetic-uu", users=users, keys=10, seed=1, batch_size=100)
    dataset = sources.built_in_dataset(data, 1)
    p = beam.Pipeline()
    simulate_graph(sources.user_source(p, data, dataset), protocol, 1, truth=False)
    labels = []

    class Labels(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            labels.append(node.full_label)

    p.visit(Labels())
    return labels


def test_a_round_makes_its_default_without_create():
    """Before: every round's combine built ``DoOnce/FlatMap`` and
    ``DoOnce/Map(decode)`` (Beam's ``Create([None])``); PrivKVM+ ten times.
    A round's calibration injects the default itself, on the state the round
    starts from (``collector.CollectStep``): one Impulse, round 1's."""
    for protocol in (PCKVGRR(10, 4.0), PrivKVMPlus(10, 4.0)):
        rounds = [label for label in _labels(protocol) if label.startswith("Protocol/")]
        assert not [label for label in rounds if "DoOnce" in label or "Create" in label]
        assert [label for label in rounds if label.endswith("/Start")] == ["Protocol/Round1/Collect/Start"]


def test_a_synthetic_domains_key_names_are_no_stage():
    """Before: a ``KeyNames`` Create (three transforms, a stage of its own)
    in every simulation of a generated dataset, for a recipe that pickles as d."""
    assert not [label for label in _labels(PCKVGRR(10, 4.0)) if label.startswith("KeyNames")]
