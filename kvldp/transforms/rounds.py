"""A protocol's rounds as one pipeline of sequential stages.

Round ``r`` is perturb -> combine -> advance; the ``ProtocolState`` after
round ``r`` is a singleton side input of round ``r+1``'s perturbation (the
broadcast) and of its calibration (the collector's memory), as Beam's
tf-idf example feeds one stage's global result into the next. A
single-round mechanism is the one-stage case. A protocol that stops early
(PrivKVM+) still has all ``max_rounds`` stages in the graph; after the stop
they emit no reports and pass the state through, so no budget is spent.

Every round reads the same users. The runner stores a PCollection that
several stages read, so the users of a file are kept between rounds; a
generated dataset's users are instead made again in each round from their
batch recipes (``UserRecipes``): a few bytes per batch to keep, nothing to
make once the protocol has stopped. At 10^7 users, moving the stored users
to each round's stage cost ~0.4 s a round (copies into the runner's data
channel) where making them costs ~0.05 s.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import apache_beam as beam

from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.protocol import Collection, Protocol
from kvldp.transforms.accumulate import Accumulate, Advance
from kvldp.transforms.perturb import PerturbFn, state_arg


def collect_steps(reports, protocol: Protocol, round_index: int, previous, fanout: int | None = None) -> dict:
    """``reports -> {"counts", "state"}``: accumulate, then calibrate into the
    state after the round."""
    counts = reports | "Accumulate" >> Accumulate(protocol, round_index, fanout)
    return {"counts": counts, "state": counts | "Calibrate" >> Advance(protocol, round_index, previous)}


class CollectRound(beam.PTransform):
    """The collector's half of a round: ``reports -> {"counts", "state"}``
    (``previous``: the state the round started from)."""

    def __init__(self, protocol: Protocol, round_index: int, previous, fanout: int | None = None,
                 label: str | None = None):
        super().__init__(label)
        self._protocol, self._round, self._previous, self._fanout = protocol, round_index, previous, fanout

    def expand(self, reports):
        return collect_steps(reports, self._protocol, self._round, self._previous, self._fanout)


@dataclasses.dataclass(frozen=True)
class UserRecipes:
    """A generated dataset's users as recipes: ``specs``, a PCollection of
    its batch specs, and ``rebuild(*spec) -> UserBatch`` (``Dataset.batch``)."""

    specs: beam.PCollection
    rebuild: Callable[..., UserBatch]


class RunRound(beam.PTransform):
    """``users`` + the previous state -> ``{"reports", "counts", "state"}`` of
    round ``round_index`` (the clients' half, then ``CollectRound``);
    ``rebuild``: ``users`` are batch recipes that this makes into batches."""

    def __init__(self, protocol: Protocol, round_index: int, seed: int, previous, fanout: int | None = None,
                 rebuild: Callable[..., UserBatch] | None = None, label: str | None = None):
        super().__init__(label)
        self._protocol, self._round, self._seed = protocol, round_index, seed
        self._previous, self._fanout, self._rebuild = previous, fanout, rebuild

    def expand(self, users):
        # the DoFn itself (not the Perturb composite), so the stage that reads the previous state is Round{r}/Perturb
        fn = PerturbFn(self._protocol, self._seed, self._round, rebuild=self._rebuild)
        reports = users | "Perturb" >> beam.ParDo(fn, state_arg(self._previous))
        # the collector's steps inline, so the stages read Round{r}/Perturb, /Accumulate, /Calibrate
        return {"reports": reports, **collect_steps(reports, self._protocol, self._round, self._previous, self._fanout)}


class RunProtocol(beam.PTransform):
    """``PCollection[UserBatch]`` -> ``{"state": the final ProtocolState,
    "counts": the last round's counts}`` (one element each); the users'
    groups come from ``Collection.from_seed(seed)``. ``later_rounds``: the
    same users as recipes, which rounds after the first read instead."""

    def __init__(self, protocol: Protocol, seed: int, fanout: int | None = None,
                 later_rounds: UserRecipes | None = None, label: str | None = None):
        super().__init__(label)
        self._protocol, self._seed, self._fanout, self._later = protocol, seed, fanout, later_rounds

    def expand(self, users):
        state = self._protocol.initial_state(Collection.from_seed(self._seed))
        for r in range(self._protocol.max_rounds):
            source, rebuild = users, None
            if r > 0 and self._later is not None:
                source, rebuild = self._later.specs, self._later.rebuild
            out = source | f"Round{r + 1}" >> RunRound(self._protocol, r, self._seed, state, self._fanout, rebuild)
            state = out["state"]
        return {"state": state, "counts": out["counts"]}
