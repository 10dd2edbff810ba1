"""The collector: accumulate a round's reports into counts, then calibrate.

``RoundCombineFn`` wraps a protocol's ``accumulate_round``/``merge_round``
as a Beam CombineFn (as TFT's ``_CombinerWrapper`` wraps its Beam-free
combiners): the accumulator is the round's flat ``int64`` count array, so it
merges in any order, works with ``with_fanout`` and inside windows.
``Advance`` calibrates the counts into the state after the round.
"""
from __future__ import annotations

import apache_beam as beam
import numpy as np

from kvldp.mechanisms.base import Estimates
from kvldp.mechanisms.protocol import Protocol, ProtocolState
from kvldp.transforms.coders import ArrayPayloadCoder, NDArray
from kvldp.transforms.global_combine import CombineAll, CombineWithoutDefaults
from kvldp.transforms.perturb import state_arg


@beam.typehints.with_output_types(NDArray)
class RoundCombineFn(beam.CombineFn):
    """Round ``round_index``'s reports -> its count array."""

    def __init__(self, protocol: Protocol, round_index: int = 0):
        self._protocol, self._round = protocol, round_index

    def create_accumulator(self):
        # A fresh array every call: runners may hold several at once.
        return self._protocol.new_round_counts(self._round)

    def add_input(self, counts, reports):
        return self._protocol.accumulate_round(self._round, counts, reports)

    def merge_accumulators(self, accumulators):
        return self._protocol.merge_round(self._round, accumulators)

    def extract_output(self, counts):
        return counts

    def get_accumulator_coder(self):
        return ArrayPayloadCoder()


@beam.typehints.with_output_types(NDArray)
class DrawnCountsCombineFn(RoundCombineFn):
    """Round ``round_index``'s counts drawn per batch (``DrawCountsFn``) -> their sum."""

    def add_input(self, counts, drawn):
        counts += drawn
        return counts


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


class Accumulate(beam.PTransform):
    """``PCollection[Reports] -> PCollection[counts]`` (one per window).

    ``fanout`` adds an intermediate combine level so no single worker merges
    every batch; ``windowed=True`` for non-global windows (no default value).
    """

    def __init__(self, protocol: Protocol, round_index: int = 0, fanout: int | None = None, windowed: bool = False,
                 label: str | None = None):
        super().__init__(label)
        self._fn = RoundCombineFn(protocol, round_index)
        self._fanout, self._windowed = fanout, windowed

    def expand(self, reports):
        combine = CombineWithoutDefaults if self._windowed else CombineAll
        return reports | "CombineCounts" >> combine(self._fn, self._fanout)


def next_state(counts, previous, protocol: Protocol, round_index: int):
    return protocol.next_state(round_index, previous, counts)


class Advance(beam.PTransform):
    """``PCollection[counts] -> PCollection[ProtocolState]``: the state after
    round ``round_index``, from the state ``previous`` it started from (a
    value, a one-element PCollection, or ``None`` for a fresh protocol)."""

    def __init__(self, protocol: Protocol, round_index: int = 0, previous=None, label: str | None = None):
        super().__init__(label)
        self._protocol, self._round = protocol, round_index
        self._previous = protocol.initial_state() if previous is None else previous

    def expand(self, counts):
        return counts | "NextState" >> (beam.Map(next_state, state_arg(self._previous), self._protocol, self._round)
                                        .with_output_types(ProtocolState))


class Calibrate(beam.PTransform):
    """``PCollection[counts] -> PCollection[Estimates]`` (``Advance``, then the
    state's estimates)."""

    def __init__(self, protocol: Protocol, round_index: int = 0, previous=None, label: str | None = None):
        super().__init__(label)
        self._protocol, self._round, self._previous = protocol, round_index, previous

    def expand(self, counts):
        return (counts
                | "Advance" >> Advance(self._protocol, self._round, self._previous)
                | "Estimates" >> beam.Map(self._protocol.estimates).with_output_types(Estimates))
