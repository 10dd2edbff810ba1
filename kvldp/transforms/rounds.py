"""A protocol's rounds as one pipeline of sequential stages.

Round ``r`` is perturb -> combine -> advance; the ``ProtocolState`` after
round ``r`` is a singleton side input of round ``r+1``'s perturbation (the
broadcast), as Beam's tf-idf example feeds one stage's global result into
the next. A single-round mechanism is the one-stage case.

A protocol that may stop early (PrivKVM+) has all ``max_rounds`` rounds in
the graph, but the state flows only while the protocol goes on: a round's
calibration emits the next state on its main output while the protocol goes
on, and on ``FINAL`` once it has stopped or run its last round. The next
round's calibration takes that going-on state as its *main* input, and a
generated dataset's next round takes its batch recipes from it (the recipes
are a side input, spread over the workers by ``spread.spread``), so after the
stop every stage of the later rounds has no input at all: no report is made
and no budget spent, and a runner has nothing to run (the local runner skips
a stage without input; ``local_runner.py``). Measured at 10^6 users, each
of PrivKVM+'s nine rounds after its stop cost ~34 ms of stages (perturb
~18, merge ~6, calibrate ~10) when they ran empty.

Every round reads the same users. The runner stores a PCollection that
several stages read, so the users of a file are kept between rounds (their
later perturbations see the stop as a stopped state, ``ENDED``); a
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
from apache_beam.pvalue import AsList, AsSingleton

from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.protocol import Collection, Protocol, ProtocolState
from kvldp.transforms.accumulate import Accumulate, Advance, RoundCombineFn
from kvldp.transforms.global_combine import combine_without_defaults, inject_default
from kvldp.transforms.perturb import PerturbFn, state_arg
from kvldp.transforms.spread import Positioned, spread


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
    round ``round_index`` (the clients' half, then ``CollectRound``)."""

    def __init__(self, protocol: Protocol, round_index: int, seed: int, previous, fanout: int | None = None,
                 label: str | None = None):
        super().__init__(label)
        self._protocol, self._round, self._seed = protocol, round_index, seed
        self._previous, self._fanout = previous, fanout

    def expand(self, users):
        # the DoFn itself (not the Perturb composite), so the stage that reads the previous state is Round{r}/Perturb
        fn = PerturbFn(self._protocol, self._seed, self._round)
        reports = users | "Perturb" >> beam.ParDo(fn, state_arg(self._previous))
        # the collector's steps inline, so the stages read Round{r}/Perturb, /Accumulate, /Calibrate
        return {"reports": reports, **collect_steps(reports, self._protocol, self._round, self._previous, self._fanout)}


FINAL = "final"

# The state a round's clients see once the protocol ended before it: stopped, so they report nothing.
ENDED = ProtocolState(0, None, True, 0.0, None)


class AdvanceFn(beam.DoFn):
    """The state round ``round_index`` started from (the main input; round 1:
    an Impulse's element, for ``start``) and the round's combined counts (a
    side list of at most one; none: no reports, the combine's value for no
    input) -> the state after the round: the main output while the protocol
    goes on, ``FINAL`` once it has stopped or run its last round."""

    def __init__(self, protocol: Protocol, round_index: int, combine_fn: beam.CombineFn,
                 start: ProtocolState | None = None):
        self._protocol, self._round, self._fn, self._start = protocol, round_index, combine_fn, start

    def process(self, previous, combined: list):
        if self._start is not None:
            previous = self._start
        counts = inject_default(None, combined, self._fn)
        state = self._protocol.next_state(self._round, previous, counts)
        if state.stopped or self._round + 1 >= self._protocol.max_rounds:
            yield beam.pvalue.TaggedOutput(FINAL, state)
        else:
            yield state


def recipes_once(_going, specs: list):
    """The round's batch recipes, keyed by their position (emitted only when
    the round runs: ``_going`` is the state it starts from)."""
    return enumerate(specs)


class GatedRound(beam.PTransform):
    """Round ``round_index`` of a protocol that runs only while it goes on:
    ``users -> {"going", FINAL}`` (module docstring).
    ``previous``: round 1's initial state (a value), or the previous round's
    ``"going"`` (a PCollection of at most one state). ``recipes``: later
    rounds make their users from these batch recipes instead of reading
    ``users``."""

    def __init__(self, protocol: Protocol, round_index: int, seed: int, previous, fanout: int | None = None,
                 recipes: UserRecipes | None = None, label: str | None = None):
        super().__init__(label)
        self._protocol, self._round, self._seed = protocol, round_index, seed
        self._previous, self._fanout, self._recipes = previous, fanout, recipes

    def expand(self, users):
        first = not isinstance(self._previous, beam.PCollection)
        state = self._previous if first else AsSingleton(self._previous, default_value=ENDED)
        rebuild = None
        if not first and self._recipes is not None:
            rebuild = self._recipes.rebuild
            recipes = beam.FlatMap(recipes_once, AsList(self._recipes.specs)).with_output_types(Positioned)
            users = spread(self._previous | "Recipes" >> recipes)
        fn = PerturbFn(self._protocol, self._seed, self._round, rebuild=rebuild)
        reports = users | "Perturb" >> beam.ParDo(fn, state)
        combine_fn = RoundCombineFn(self._protocol, self._round)
        combined = reports | "Accumulate" >> combine_without_defaults(combine_fn, self._fanout)
        start = users.pipeline | "Start" >> beam.Impulse() if first else self._previous
        advance = AdvanceFn(self._protocol, self._round, combine_fn, self._previous if first else None)
        out = start | "Calibrate" >> beam.ParDo(advance, AsList(combined)).with_outputs(FINAL, main="going")
        return {"going": out.going, FINAL: out[FINAL]}


class RunProtocol(beam.PTransform):
    """``PCollection[UserBatch]`` -> ``{"state": the final ProtocolState}``,
    one element, and for a single-round protocol ``"counts"``, its round's
    counts (a multi-round protocol's counts are per round: ``"state"`` is
    what it ends with); the users' groups come from ``Collection.from_seed(seed)``.
    ``later_rounds``: the same users as recipes, which rounds after the
    first read instead."""

    def __init__(self, protocol: Protocol, seed: int, fanout: int | None = None,
                 later_rounds: UserRecipes | None = None, label: str | None = None):
        super().__init__(label)
        self._protocol, self._seed, self._fanout, self._later = protocol, seed, fanout, later_rounds

    def expand(self, users):
        protocol = self._protocol
        initial = protocol.initial_state(Collection.from_seed(self._seed))
        if protocol.max_rounds == 1:
            out = users | "Round1" >> RunRound(protocol, 0, self._seed, initial, self._fanout)
            return {"state": out["state"], "counts": out["counts"]}
        going, finals = initial, []
        for r in range(protocol.max_rounds):
            out = users | f"Round{r + 1}" >> GatedRound(protocol, r, self._seed, going, self._fanout, self._later)
            going = out["going"]
            finals.append(out[FINAL])
        return {"state": finals | "FinalState" >> beam.Flatten()}
