"""Client-side perturbation as a batched DoFn, for every mechanism and round.

One element is a ``UserBatch`` (thousands to hundreds of thousands of users);
the DoFn calls the protocol's ``perturb_round`` once per batch with a
generator derived from the run seed, the batch's id and the round, so a
retried bundle emits exactly the same reports and element order never
matters. The collector's state the round starts from (the broadcast of
the previous round) is a singleton side input, or a constant for round 1.
"""
from __future__ import annotations

from collections.abc import Callable

import apache_beam as beam
from apache_beam.pvalue import AsSingleton

from kvldp.mechanisms.base import Reports, UserBatch
from kvldp.mechanisms.privacy.randomness import batch_rng
from kvldp.mechanisms.protocol import Protocol, ProtocolState
from kvldp.runtime import tally
from kvldp.storage.ledger import LedgerGate
from kvldp.transforms.coders import NDArray  # (importing it registers the coders)
from kvldp.transforms.context import element_context


@beam.typehints.with_output_types(Reports)
class PerturbFn(beam.DoFn):
    """``UserBatch`` -> round ``round_index``'s reports of the round's
    participants, with ``batch_rng(seed, batch_id, round)`` (nothing once the
    protocol has stopped). ``gate``: the perturbing side's privacy ledger
    (storage/ledger.py); a user it refuses sits the collection out and is
    counted (``users_sat_out``). ``rebuild``: the elements are a generated
    dataset's batch recipes, and ``rebuild(*recipe)`` makes the batch (only
    when the round runs: a stopped protocol's later rounds make nothing)."""

    def __init__(self, protocol: Protocol, seed: int, round_index: int = 0, gate: LedgerGate | None = None,
                 rebuild: Callable[..., UserBatch] | None = None):
        self._protocol, self._seed, self._round, self._gate = protocol, seed, round_index, gate
        self._rebuild = rebuild
        self._users = tally.counter("users_perturbed")
        self._reports = tally.counter("reports_emitted")
        self._sat_out = tally.counter("users_sat_out")

    def process(self, users: UserBatch, state: ProtocolState | None = None):
        if state is None:
            state = self._protocol.initial_state()
        if state.stopped:
            return
        if self._rebuild is not None:
            users = self._rebuild(*users)
        with element_context(f"user batch {users.batch_id} ({users.n_users} users), round {self._round + 1}"):
            rng = batch_rng(self._seed, users.batch_id, round_index=self._round)
            users = self._protocol.participants(self._round, users, state)
            if self._gate is not None:       # the ledger: who may still spend this collection
                users, decision = self._gate.admit(self._protocol, users)
                self._sat_out.inc(decision.sat_out)
            out = self.client_step(users, rng, state)
        self._users.inc(users.n_users)
        self._reports.inc(self.reports_in(out))
        yield out

    def client_step(self, users: UserBatch, rng, state: ProtocolState):
        return self._protocol.perturb_round(self._round, users, rng, state)

    @staticmethod
    def reports_in(out) -> int:
        return out.n_reports


@beam.typehints.with_output_types(NDArray)
class DrawCountsFn(PerturbFn):
    """``kvldp simulate --draw-counts``: ``UserBatch`` -> the counts its
    round's reports would add up to, drawn from their distribution
    (``Protocol.draw_round_counts``) with the generator ``PerturbFn`` would
    use. No report is made, so none is counted (``reports_emitted``)."""

    def client_step(self, users: UserBatch, rng, state: ProtocolState):
        return self._protocol.draw_round_counts(self._round, users, rng, state)

    @staticmethod
    def reports_in(out) -> int:
        return 0


def state_arg(state):
    """A state given as a value stays a constant; as a PCollection (one
    element, computed by the previous round) it becomes a singleton side input."""
    return AsSingleton(state) if isinstance(state, beam.PCollection) else state


class Perturb(beam.PTransform):
    """``PCollection[UserBatch] -> PCollection[Reports]`` of one round.

    ``state``: what the round starts from -- a ``ProtocolState``, a
    one-element PCollection of it, or ``None`` for a fresh protocol."""

    def __init__(self, protocol: Protocol, seed: int, round_index: int = 0, state=None, label: str | None = None,
                 gate: LedgerGate | None = None):
        super().__init__(label)
        self._fn = PerturbFn(protocol, seed, round_index, gate)
        self._state = protocol.initial_state() if state is None else state

    def expand(self, users):
        return users | "PerturbBatches" >> beam.ParDo(self._fn, state_arg(self._state))
