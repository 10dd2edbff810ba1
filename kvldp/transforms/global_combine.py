"""A global combine whose default for no input is injected on an Impulse.

``CombineAll(fn)`` is ``beam.CombineGlobally(fn)``: one output, the
combine of every element in the global window, ``fn``'s value for no input
when there is none. Beam makes that default from ``Create([None])``:
an Impulse, a FlatMap of the encoded ``[None]`` and a Map that decodes it,
then the Map that injects the default. That is two ParDos more than the
default needs, each built, type-checked and pickled twice (Beam round-trips
every fn) when the graph is built, translated again when it runs, and built
into operations by the stage that runs them. Here the default is injected
straight on an Impulse: the same output, on any runner, from one ParDo
(the truth sums, IOH's pattern sums, the pre-passes' sums). A protocol's
round goes one step further and injects its counts' default in its
calibration (``collector.CollectStep``).

Without defaults (a round's counts, a window's combine), the combine is
Beam's own three steps without ``CombineGlobally``'s wrapper and its
``UnKey`` lambda's type inference (``CombineWithoutDefaults``).
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np
from apache_beam.pvalue import AsList
from apache_beam.transforms.window import GlobalWindows
from apache_beam.typehints.typehints import TupleConstraint

from kvldp.transforms.coders import ArrayPayloadCoder, NDArray


class CombineAll(beam.PTransform):
    """``PCollection[T] -> PCollection[fn's output]``, one element
    (``beam.CombineGlobally(fn)``, with ``fanout`` its ``with_fanout``;
    ``fn``: a ``CombineFn`` or a function of an iterable)."""

    def __init__(self, fn, fanout: int | None = None, label: str | None = None):
        super().__init__(label)
        # a plain function of an iterable combines as Beam's CallableWrapperCombineFn, as in CombineGlobally
        self._fn, self._fanout = beam.CombineFn.maybe_from_callable(fn), fanout

    def expand(self, pcoll):
        if pcoll.windowing.windowfn != GlobalWindows():
            raise ValueError("a combine with a default for no input needs the global window; "
                             "window the input's combine with without_defaults()")
        combined = pcoll | "Combine" >> CombineWithoutDefaults(self._fn, self._fanout)
        inject = beam.Map(inject_default, AsList(combined), self._fn)
        if combined.element_type is not None:
            inject = inject.with_output_types(combined.element_type)
        return pcoll.pipeline | "DoOnce" >> beam.Impulse() | "InjectDefault" >> inject


class CombineWithoutDefaults(beam.PTransform):
    """``beam.CombineGlobally(fn).without_defaults()`` (one output per window
    that has input; ``fanout``: its ``with_fanout``): the same three steps
    (``KeyWithVoid``, ``CombinePerKey``, ``UnKey``) without its wrapper's cost.

    Beam's ``UnKey`` is ``Map(lambda k_v: k_v[1])`` with no output type, so
    each combine's graph ran Beam's bytecode type inference on the lambda
    to find the type its ``CombinePerKey`` already states; and the wrapper
    itself is a composite more to apply, type-check and translate. Here the
    value's type is read off the ``CombinePerKey``'s output: the same
    element types (hence coders) and the same steps and labels, so a
    streaming job's update compatibility is kept. ``tests/test_global_combine.py``
    compares both, typed and untyped, windowed, with fanout."""

    def __init__(self, fn, fanout: int | None = None, label: str | None = None):
        super().__init__(label)
        self._fn, self._fanout = beam.CombineFn.maybe_from_callable(fn), fanout

    def expand(self, pcoll):
        combine_per_key = beam.CombinePerKey(self._fn)
        if self._fanout:
            combine_per_key = combine_per_key.with_hot_key_fanout(self._fanout)
        key = beam.Map(_key_with_none).with_output_types(beam.typehints.KV[None, pcoll.element_type])
        combined = pcoll | "KeyWithVoid" >> key | "CombinePerKey" >> combine_per_key
        unkey = beam.Map(_value).with_output_types(_value_type(combined.element_type))
        return combined | "UnKey" >> unkey


def _key_with_none(value):
    return None, value


def _value(key_value):
    return key_value[1]


def _value_type(kv_type):
    """The value type of a ``Tuple[K, V]`` hint (``Any`` when there is none)."""
    if isinstance(kv_type, TupleConstraint) and len(kv_type.tuple_types) == 2:
        return kv_type.tuple_types[1]
    return beam.typehints.Any


def inject_default(_, combined: list, fn: beam.CombineFn):
    """The combined value, or ``fn``'s value for no input when the combine had none."""
    if len(combined) > 1:
        raise ValueError(f"a global combine produced {len(combined)} values, not one")
    if combined:
        return combined[0]
    fn.setup()
    try:
        return fn.apply([])
    finally:
        fn.teardown()


@beam.typehints.with_output_types(NDArray)
class ArraySumCombineFn(beam.CombineFn):
    """Element-wise sum of equally long NumPy arrays (truth statistics)."""

    def __init__(self, size: int):
        self._size = size

    def create_accumulator(self):
        return np.zeros(self._size)

    def add_input(self, acc, row):
        acc += row
        return acc

    def merge_accumulators(self, accumulators):
        out = np.zeros(self._size)
        for a in accumulators:
            out += a
        return out

    def extract_output(self, acc):
        return acc

    def get_accumulator_coder(self):
        return ArrayPayloadCoder()
