"""Multi-round protocols (PrivKVM, PrivKVM+, KS-GRR, KS-Adap) in a stream.

Round r's reports fall in one event-time window. That window's panes
calibrate round r from the state after round r-1; its on-time pane
finalises round r: the state after it becomes the broadcast the devices of
round r+1 perturb with (``broadcast.avsc``, the same file ``kvldp collect``
writes between split rounds), and its id (``envelope.broadcast_id``) is what
their messages must cite. The chain of states crosses windows, so it lives
in one stateful DoFn in the global window, fed one element per pane.

What is refused, as a dead letter with the number of batches (never
silently): reports of a round already finalised or not yet open (a round
spread over two windows: its second window), reports citing another
broadcast than the collector's latest, another layout than round 1's, and
anything after the protocol has stopped. Late batches are refused by the
lateness gate: a multi-round stream has no allowed lateness, because a
round's broadcast, once published, cannot change.
"""
from __future__ import annotations

import dataclasses
import json
import typing

import apache_beam as beam
from apache_beam.coders import coders
from apache_beam.transforms import window
from apache_beam.transforms.userstate import ReadModifyWriteStateSpec

from kvldp.mechanisms.protocol import Collection
from kvldp.runtime.tally import JobCounter
from kvldp.schemas import envelope
from kvldp.schemas.records import broadcast_records
from kvldp.transforms.collector import RoundCombineFn, advance
from kvldp.transforms.global_combine import CombineWithoutDefaults
from kvldp.transforms.streaming import DEAD_LETTER, DeadLetterOutput, Pane, PaneCounters

ROUNDS = "rounds"
CHAIN = ReadModifyWriteStateSpec("chain", coders.PickleCoder())
CHAIN_STATE = beam.DoFn.StateParam(CHAIN)      # Beam's idiom: state is declared as a default argument


class RoundsCombineFn(beam.CombineFn):
    """``RoundBatch``es -> ``{(round, broadcast, layout): [counts, batches]}``:
    a window's reports counted per round and per what they were made with,
    so the chain can take the right ones and refuse the rest by name. Each
    key's counts are the collector's own (``collector.RoundCombineFn`` of
    its round)."""

    def __init__(self, protocol):
        self._protocol = protocol
        self._rounds = [RoundCombineFn(protocol, r) for r in range(protocol.max_rounds)]

    def create_accumulator(self):
        return {}

    def add_input(self, acc, batch):
        key, fn = (batch.round_index, batch.broadcast, batch.layout), self._round_fn(batch.round_index)
        counts, n = acc.get(key) or (fn.create_accumulator(), 0)
        acc[key] = (fn.add_input(counts, batch.reports), n + 1)
        return acc

    def merge_accumulators(self, accumulators):
        out: dict = {}
        for acc in accumulators:
            for key, (counts, n) in acc.items():
                if key in out:
                    out[key] = (self._round_fn(key[0]).merge_accumulators([out[key][0], counts]), out[key][1] + n)
                else:
                    out[key] = (counts, n)
        return out

    def extract_output(self, acc):
        return acc

    def _round_fn(self, round_index: int) -> RoundCombineFn:
        # a round beyond the protocol's is refused by the chain; its counts still need a combine
        return (self._rounds[round_index] if round_index < len(self._rounds)
                else RoundCombineFn(self._protocol, round_index))


@dataclasses.dataclass(frozen=True)
class RoundOutcome:
    """A finalised round: its window, the state after it, the broadcast's
    records and id, and the budget spent so far."""

    round: int
    window_start_ms: int
    window_end_ms: int
    n_reports: int
    state: typing.Any
    records: list
    broadcast_id: str

    def summary(self, protocol) -> dict:
        return {"round": self.round, "window_start_ms": self.window_start_ms, "window_end_ms": self.window_end_ms,
                "n_reports": self.n_reports, "epsilon_spent": float(self.state.epsilon_spent),
                "epsilon": float(protocol.epsilon), "stopped": bool(self.state.stopped),
                "broadcast_id": self.broadcast_id, "collection": self.state.collection.to_json(),
                "ledger": protocol.ledger.rows()}


class _PaneHeadFn(beam.DoFn):
    """Take each pane's window and timing with it into the global window."""

    def process(self, acc, w=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        yield "chain", (Pane.of(w, pane, None), acc)


class ChainRoundsFn(beam.DoFn):
    """One element per pane -> the pane's estimates (calibrated from the
    last finalised state), and on an on-time pane the next ``RoundOutcome``."""

    def __init__(self, protocol, collection_id: str, key_names, job: str):
        self._protocol, self._collection_id, self._names = protocol, collection_id, list(key_names)
        self._panes = PaneCounters(job)
        self._refused, self._finalised = JobCounter(job, "batches_refused"), JobCounter(job, "rounds_finalized")
        self._stopped, self._dead = JobCounter(job, "protocol_stopped"), DeadLetterOutput(job)

    def process(self, element, chain=CHAIN_STATE):
        _, (head, acc) = element
        state, latest = chain.read() or (None, "")
        for (r, broadcast, layout), (counts, n) in sorted(acc.items()):
            why = self._refusal(state, latest, r, broadcast, layout)
            if why:
                self._refused.inc(n)
                yield self._dead({
                    "reason": why[0], "detail": f"{n} batches of round {r + 1} in window {head.name}: {why[1]}",
                    "attributes": {envelope.ROUND: str(r + 1), envelope.BROADCAST: broadcast},
                    "data_base64": "", "processing_time_ms": 0})
                continue
            start = state or self._protocol.initial_state(Collection(self._collection_id, layout))
            after = advance(self._protocol, r, start, counts)
            pane = dataclasses.replace(head, estimates=self._protocol.estimates(after), round=r + 1)
            self._panes.count(pane)
            yield pane
            if pane.timing == "ON_TIME":
                records = broadcast_records(after, self._protocol, self._names)
                state, latest = after, envelope.broadcast_id(records)
                chain.write((state, latest))
                self._finalised.inc()
                if after.stopped:
                    self._stopped.inc()
                yield beam.pvalue.TaggedOutput(ROUNDS, RoundOutcome(
                    r + 1, head.window_start_ms, head.window_end_ms, pane.n_reports, after, records, latest))

    def _refusal(self, state, latest: str, r: int, broadcast: str, layout: str) -> tuple[str, str] | None:
        done = 0 if state is None else state.rounds_done
        if state is not None and state.stopped:
            return "protocol ended", f"the protocol stopped after round {done}"
        if r != done:
            return "round out of order", (f"round {r + 1} was finalised in an earlier window" if r < done
                                          else f"the collection is at round {done + 1}")
        if r > 0 and broadcast != latest:
            return "stale broadcast", f"perturbed with broadcast {broadcast}, the collector's is {latest}"
        if state is not None and layout != state.collection.layout:
            return "layout", f"batched as {layout!r}, round 1 as {state.collection.layout!r}"
        return None


class ChainRounds(beam.PTransform):
    """Windowed ``RoundBatch``es of a multi-round protocol ->
    ``{"panes": Pane, "rounds": RoundOutcome, "dead_letter": dict}``."""

    def __init__(self, protocol, collection_id: str, key_names, job: str, label: str | None = None):
        super().__init__(label)
        self._protocol, self._collection_id, self._names, self._job = protocol, collection_id, key_names, job

    def expand(self, batches):
        chained = (batches
                   | "CountRounds" >> CombineWithoutDefaults(RoundsCombineFn(self._protocol))
                   | "PaneHead" >> beam.ParDo(_PaneHeadFn()).with_output_types(tuple[str, typing.Any])
                   | "GlobalWindow" >> beam.WindowInto(window.GlobalWindows())
                   | "Chain" >> beam.ParDo(ChainRoundsFn(self._protocol, self._collection_id, self._names,
                                                         self._job)).with_outputs(ROUNDS, DEAD_LETTER, main="panes"))
        return {"panes": chained.panes, ROUNDS: chained[ROUNDS], DEAD_LETTER: chained[DEAD_LETTER]}


def round_summary_json(outcome: RoundOutcome, protocol) -> str:
    return json.dumps(outcome.summary(protocol), sort_keys=True, indent=1)
