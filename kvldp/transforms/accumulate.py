"""The collector: accumulate reports into count arrays, then calibrate.

``MechanismCombineFn`` wraps a mechanism's ``accumulate``/``merge`` as a Beam
CombineFn (as TFT's ``_CombinerWrapper`` wraps its Beam-free combiners): the
accumulator is the mechanism's flat ``int64`` count array, so it merges in
any order, works with ``with_fanout`` and inside windows.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np

from kvldp.mechanisms.base import Mechanism


class MechanismCombineFn(beam.CombineFn):
    """``ReportBatch``es -> the mechanism's count array."""

    def __init__(self, mechanism: Mechanism):
        self._mechanism = mechanism

    def create_accumulator(self):
        # A fresh array every call: runners may hold several at once.
        return self._mechanism.new_counts()

    def add_input(self, counts, reports):
        return self._mechanism.accumulate(counts, reports)

    def merge_accumulators(self, accumulators):
        return self._mechanism.merge(accumulators)

    def extract_output(self, counts):
        return counts


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


class Accumulate(beam.PTransform):
    """``PCollection[ReportBatch] -> PCollection[counts]`` (one per window).

    ``fanout`` adds an intermediate combine level so no single worker merges
    every batch; ``windowed=True`` for non-global windows (no default value).
    """

    def __init__(self, mechanism: Mechanism, fanout: int | None = None, windowed: bool = False,
                 label: str | None = None):
        super().__init__(label)
        self._mechanism = mechanism
        self._fanout = fanout
        self._windowed = windowed

    def expand(self, reports):
        combine = beam.CombineGlobally(MechanismCombineFn(self._mechanism))
        if self._fanout:
            combine = combine.with_fanout(self._fanout)
        if self._windowed:
            combine = combine.without_defaults()
        return reports | "CombineCounts" >> combine


class Calibrate(beam.PTransform):
    """``PCollection[counts] -> PCollection[Estimates]``."""

    def __init__(self, mechanism: Mechanism, label: str | None = None):
        super().__init__(label)
        self._mechanism = mechanism

    def expand(self, counts):
        return counts | "Estimate" >> beam.Map(self._mechanism.estimate)
