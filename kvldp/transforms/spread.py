"""Items spread over the workers: keyed by their position, grouped, let go.

A runner splits a stage's work by its input: the FnApiRunner hands the
keys of a GroupByKey's output round-robin to its workers, Dataflow and
Flink shard them by key. A generated dataset's batch recipes (and, after a
protocol's round, the recipes of the next) are a few dozen elements made
in one place, so they go through a GroupByKey keyed by their position
before the batches are made, and every worker makes its share.

Beam's ``Create`` spreads its values with a ``Reshuffle``: random keys, the
elements' timestamps and windows reified and restored -- six transforms
around the GroupByKey, each built, pickled twice and translated with the
graph and built into operations by the stages that run them (~15 ms of a
job at 10^6 users). Recipes in the global window need none of it: their
position is a key, and a GroupByKey's output keeps the global window.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import apache_beam as beam

# what ``spread`` takes: items keyed by their position
Positioned = beam.typehints.KV[int, Any]


def spread(keyed: beam.PCollection) -> beam.PCollection:
    """``PCollection[(position, item)] -> PCollection[item]``, grouped by position (module docstring).

    The items' type is stated: ``Any``, what Beam would find by running its
    bytecode type inference on ``_items`` (~1 ms a round of a protocol's graph)."""
    items = beam.FlatMapTuple(_items).with_output_types(Any)
    return keyed | "Spread" >> beam.GroupByKey() | "Items" >> items


def _items(_position, items):
    return items


class SpreadOut(beam.PTransform):
    """``pipeline -> PCollection[item]``: ``items``, a constant of the graph,
    spread over the workers (``beam.Create(items)`` without its Reshuffle's
    random keys and metadata)."""

    def __init__(self, items: Sequence, label: str | None = None):
        super().__init__(label)
        self._items = list(items)

    def expand(self, pbegin):
        keyed = beam.FlatMap(positioned, self._items).with_output_types(Positioned)
        return spread(pbegin | "Impulse" >> beam.Impulse() | "Keyed" >> keyed)


def positioned(_trigger, items: list):
    """``items`` keyed by their position, whatever the element that triggers
    them (an Impulse's, or the state a round starts from): ``spread``'s input."""
    return enumerate(items)
