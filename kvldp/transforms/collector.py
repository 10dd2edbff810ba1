"""The collector's one step: a round's reports -> counts -> the state after it.

``CollectStep`` is that step as one composite, and every collection runs
through it: the batch job's round (``kvldp collect``,
``graphs.collect_graph``), each round of a protocol run as one pipeline
(``rounds.GatedRound``) and each window of a single-round stream
(``streaming.CalibratePanes``). Its three parts:

* **accumulate** -- ``RoundCombineFn`` wraps a protocol's
  ``accumulate_round``/``merge_round`` as a Beam CombineFn (as TFT's
  ``_CombinerWrapper`` wraps its Beam-free combiners): the accumulator is
  the round's flat ``int64`` count array, so it merges in any order, works
  with ``with_fanout`` and inside windows;
* **calibrate and advance** -- ``AdvanceFn``: ``Protocol.next_state`` of the
  counts from the state the round started from (the state holds the
  calibrated estimates, ``Protocol.estimates``).

A multi-round stream's chain of rounds crosses windows, so it keeps its
states in a stateful DoFn (``stream_rounds.ChainRounds``); it counts with
the same ``RoundCombineFn`` per round and advances with the same
``advance``.
"""
from __future__ import annotations

import inspect

import apache_beam as beam
from apache_beam.pvalue import AsList

from kvldp.mechanisms.protocol import Protocol, ProtocolState
from kvldp.transforms.coders import ArrayPayloadCoder, NDArray
from kvldp.transforms.global_combine import CombineWithoutDefaults, inject_default
from kvldp.transforms.perturb import state_arg

FINAL, COUNTS = "final", "counts"

# Whether this Beam types a ParDo's tagged outputs (``with_output_types(main, **tagged)``; 2.62 has the
# main output's only): without it the tagged outputs are ``Any``, which Beam's fallback coder pickles
# -- the same values, without ``ArrayPayloadCoder``'s size estimate.
TYPED_TAGS = "tagged_type_hints" in inspect.signature(beam.PTransform.with_output_types).parameters


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


def advance(protocol: Protocol, round_index: int, previous: ProtocolState, counts) -> ProtocolState:
    """The state after round ``round_index``: its counts calibrated from the
    state the round started from (``Protocol.next_state``)."""
    return protocol.next_state(round_index, previous, counts)


class AdvanceFn(beam.DoFn):
    """The round's counts and the state it started from -> the state after
    it (main output), and its counts on ``COUNTS``.

    Global (``per_window=False``): the main input is the starting state (or
    an Impulse's element, for a constant ``start``), the counts a side list
    of at most one (none: no reports, the combine's value for no input), so
    a round whose starting state never comes -- a protocol that stopped --
    runs not at all. ``split``: the state goes to the main output only while
    the protocol goes on, to ``FINAL`` once it has stopped or run its last
    round (``rounds.py``). Per window: the main input is a window's counts,
    the starting state the side input."""

    def __init__(self, protocol: Protocol, round_index: int, combine_fn: beam.CombineFn,
                 start: ProtocolState | None = None, split: bool = False, per_window: bool = False):
        self._protocol, self._round, self._fn = protocol, round_index, combine_fn
        self._start, self._split, self._per_window = start, split, per_window

    def process(self, main, side):
        if self._per_window:
            counts, previous = main, side
        else:
            previous = main if self._start is None else self._start
            counts = inject_default(None, side, self._fn)
        state = advance(self._protocol, self._round, previous, counts)
        yield beam.pvalue.TaggedOutput(COUNTS, counts)
        if self._split and (state.stopped or self._round + 1 >= self._protocol.max_rounds):
            yield beam.pvalue.TaggedOutput(FINAL, state)
        else:
            yield state


class CollectStep(beam.PTransform):
    """``reports -> {"state", FINAL, COUNTS}``: round ``round_index``'s
    reports accumulated (``fanout``: an intermediate combine level, so no
    single worker merges every batch), calibrated and advanced from
    ``previous`` -- a state (``None``: a fresh protocol's) or a PCollection
    of at most one.

    ``split``: the state after the protocol's last round goes to ``FINAL``
    (``AdvanceFn``). ``drawn``: the elements are counts drawn per batch
    (``DrawCountsFn``), not reports. ``per_window``: one state per window
    pane of the reports (a stream's windows); else one for the whole input,
    whose combine's value for no input is made in the calibration rather
    than by ``CombineGlobally``'s defaults (``global_combine.py``): one step
    fewer, and a calibration whose main input is empty runs not at all."""

    def __init__(self, protocol: Protocol, round_index: int = 0, previous=None, fanout: int | None = None,
                 split: bool = False, drawn: bool = False, per_window: bool = False, label: str | None = None):
        super().__init__(label)
        self._protocol, self._round, self._previous, self._fanout = protocol, round_index, previous, fanout
        self._split, self._drawn, self._per_window = split, drawn, per_window

    def expand(self, reports):
        combine_fn = (DrawnCountsCombineFn if self._drawn else RoundCombineFn)(self._protocol, self._round)
        combined = reports | "Accumulate" >> CombineWithoutDefaults(combine_fn, self._fanout)
        previous = self._protocol.initial_state() if self._previous is None else self._previous
        if self._per_window:
            advance_fn = AdvanceFn(self._protocol, self._round, combine_fn, split=self._split, per_window=True)
            main, side = combined, state_arg(previous)
        elif isinstance(previous, beam.PCollection):
            advance_fn = AdvanceFn(self._protocol, self._round, combine_fn, split=self._split)
            main, side = previous, AsList(combined)
        else:
            advance_fn = AdvanceFn(self._protocol, self._round, combine_fn, previous, self._split)
            main, side = reports.pipeline | "Start" >> beam.Impulse(), AsList(combined)
        calibrate = beam.ParDo(advance_fn, side)
        calibrate = (calibrate.with_output_types(ProtocolState, **{FINAL: ProtocolState, COUNTS: NDArray})
                     if TYPED_TAGS else calibrate.with_output_types(ProtocolState))
        out = main | "Calibrate" >> calibrate.with_outputs(FINAL, COUNTS, main="state")
        return {"state": out.state, FINAL: out[FINAL], COUNTS: out[COUNTS]}
