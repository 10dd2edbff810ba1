"""Multi-round protocols as one pipeline of sequential stages.

Round ``r`` is perturb -> combine -> calibrate; the calibrated
``ProtocolState`` of round ``r`` is a singleton side input of round
``r+1``'s perturbation (the broadcast) and of its calibration (the
collector's memory), as Beam's tf-idf example feeds one stage's global
result into the next. A protocol that stops early (PrivKVM+) still has all
``max_rounds`` stages in the graph; after the stop they emit no reports and
pass the state through, so no budget is spent.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import AsSingleton

from kvldp.mechanisms.protocol import Collection, Protocol, ProtocolState
from kvldp.mechanisms.randomness import batch_rng


class ProtocolPerturbFn(beam.DoFn):
    """``UserBatch`` -> round ``r``'s ``ReportBatch`` (none once stopped)."""

    def __init__(self, protocol: Protocol, round_index: int, seed: int):
        self._protocol, self._round, self._seed = protocol, round_index, seed
        self._users = Metrics.counter("kvldp", "users_perturbed")
        self._reports = Metrics.counter("kvldp", "reports_emitted")

    def process(self, users, state: ProtocolState):
        if state.stopped:
            return
        rng = batch_rng(self._seed, users.batch_id, round_index=self._round)
        users = self._protocol.participants(self._round, users, state)
        reports = self._protocol.perturb(self._round, users, rng, state)
        self._users.inc(users.n_users)
        self._reports.inc(reports.n_reports)
        yield reports


class ProtocolCombineFn(beam.CombineFn):
    """Round ``r``'s reports -> its count array."""

    def __init__(self, protocol: Protocol, round_index: int):
        self._protocol, self._round = protocol, round_index

    def create_accumulator(self):
        return self._protocol.new_counts(self._round)

    def add_input(self, counts, reports):
        return self._protocol.accumulate(self._round, counts, reports)

    def merge_accumulators(self, accumulators):
        return self._protocol.merge(self._round, accumulators)

    def extract_output(self, counts):
        return counts


def advance_state(counts, state, protocol: Protocol, round_index: int) -> ProtocolState:
    return protocol.next_state(round_index, state, counts)


class RunRound(beam.PTransform):
    """``users`` + previous state -> the state after round ``round_index``."""

    def __init__(self, protocol: Protocol, round_index: int, seed: int, state, label: str | None = None):
        super().__init__(label)
        self._protocol, self._round, self._seed, self._state = protocol, round_index, seed, state

    def expand(self, users):
        p, r, state = self._protocol, self._round, AsSingleton(self._state)
        reports = users | "Perturb" >> beam.ParDo(ProtocolPerturbFn(p, r, self._seed), state)
        counts = reports | "Accumulate" >> beam.CombineGlobally(ProtocolCombineFn(p, r))
        return counts | "Calibrate" >> beam.Map(advance_state, state, p, r)


class RunProtocol(beam.PTransform):
    """``PCollection[UserBatch]`` -> the final ``ProtocolState`` (one element)."""

    def __init__(self, protocol: Protocol, seed: int, label: str | None = None):
        super().__init__(label)
        self._protocol, self._seed = protocol, seed

    def expand(self, users):
        first = self._protocol.initial_state(Collection.from_seed(self._seed))
        state = users.pipeline | "InitialState" >> beam.Create([first])
        for r in range(self._protocol.max_rounds):
            state = users | f"Round{r + 1}" >> RunRound(self._protocol, r, self._seed, state)
        return state
