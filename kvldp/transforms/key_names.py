"""The key dictionary as a one-element PCollection (a side input of the
calibration), created without Beam's per-element type inference."""
from __future__ import annotations

from collections.abc import Sequence

import apache_beam as beam

from kvldp.datasets.base import NumberedKeys


class CreateKeyNames(beam.PTransform):
    """``pbegin -> [names]``: one element, the dictionary's item ids in key
    order. Its type is declared: ``beam.Create`` otherwise infers the type of
    a list by visiting every item -- 10 s of the driver's time at d = 10^6."""

    def __init__(self, names: Sequence[str], label: str | None = None):
        super().__init__(label)
        # numbered names stay a recipe (pickled as d): a list would cost every stage that reads it d strings
        self._names = names if isinstance(names, NumberedKeys) else list(names)

    def expand(self, pbegin):
        kind = NumberedKeys if isinstance(self._names, NumberedKeys) else list[str]
        return pbegin | "Create" >> beam.Create([self._names]).with_output_types(kind)
