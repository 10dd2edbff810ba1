"""``spread``: items keyed by position, grouped, let go -- each item once,
typed as Beam would infer it (the type is stated instead of inferred)."""
from __future__ import annotations

from typing import Any

import apache_beam as beam
import pytest
from apache_beam.testing.util import assert_that, equal_to

from kvldp.transforms.spread import SpreadOut, _items, positioned, spread


@pytest.mark.parametrize("key_type", [None, beam.typehints.KV[int, Any], beam.typehints.KV[int, str],
                                      beam.typehints.KV[int, beam.typehints.Tuple[int, float]]])
def test_the_items_type_is_the_one_beam_infers(key_type):
    p = beam.Pipeline()
    keyed = p | beam.Create([(0, "a"), (1, "b")])
    if key_type is not None:
        keyed = keyed | beam.Map(lambda kv: kv).with_output_types(key_type)
    ours = spread(keyed)
    inferred = keyed | "Group" >> beam.GroupByKey() | "Inferred" >> beam.FlatMapTuple(_items)
    assert ours.element_type == inferred.element_type


def test_every_item_comes_out_once():
    items = [("spec", i) for i in range(7)]
    with beam.Pipeline() as p:
        assert_that(p | SpreadOut(items), equal_to(items), label="out")
        again = p | "Trigger" >> beam.Create([None]) | beam.FlatMap(positioned, items)
        assert_that(spread(again), equal_to(items), label="spread")
