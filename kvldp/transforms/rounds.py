"""A protocol's rounds as one pipeline of sequential stages.

Round ``r`` is perturb -> the collector's step (``collector.CollectStep``:
accumulate -> calibrate -> advance); the ``ProtocolState`` after
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
a stage without input; ``runtime/local_runner.py``). Measured at 10^6 users, each
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
from kvldp.mechanisms.protocol import Collection, Protocol, ProtocolState, check_count_draw
from kvldp.transforms.collector import COUNTS, FINAL, CollectStep
from kvldp.transforms.perturb import DrawCountsFn, PerturbFn
from kvldp.transforms.spread import Positioned, positioned, spread


@dataclasses.dataclass(frozen=True)
class UserRecipes:
    """A generated dataset's users as recipes: ``specs``, a PCollection of
    its batch specs, and ``rebuild(*spec) -> UserBatch`` (``Dataset.batch``)."""

    specs: beam.PCollection
    rebuild: Callable[..., UserBatch]


# The state a round's clients see once the protocol ended before it: stopped, so they report nothing.
ENDED = ProtocolState(0, None, True, 0.0, None)


class GatedRound(beam.PTransform):
    """Round ``round_index`` of a protocol that runs only while it goes on:
    ``users -> {"going", FINAL, COUNTS}`` (module docstring).
    ``previous``: round 1's initial state (a value), or the previous round's
    ``"going"`` (a PCollection of at most one state). ``recipes``: later
    rounds make their users from these batch recipes instead of reading
    ``users``. ``draw_counts``: each batch's counts are drawn directly
    (``DrawCountsFn``; simulations only)."""

    def __init__(self, protocol: Protocol, round_index: int, seed: int, previous, fanout: int | None = None,
                 recipes: UserRecipes | None = None, label: str | None = None, draw_counts: bool = False):
        super().__init__(label)
        self._protocol, self._round, self._seed = protocol, round_index, seed
        self._previous, self._fanout, self._recipes = previous, fanout, recipes
        self._draw = draw_counts

    def expand(self, users):
        first = not isinstance(self._previous, beam.PCollection)
        state = self._previous if first else AsSingleton(self._previous, default_value=ENDED)
        rebuild = None
        if not first and self._recipes is not None:
            rebuild = self._recipes.rebuild
            # emitted only when the round runs: the trigger is the state it starts from
            recipes = beam.FlatMap(positioned, AsList(self._recipes.specs)).with_output_types(Positioned)
            users = spread(self._previous | "Recipes" >> recipes)
        # the DoFn itself (not the Perturb composite), so the stage that reads the previous state is Round{r}/Perturb
        fn = (DrawCountsFn if self._draw else PerturbFn)(self._protocol, self._seed, self._round, rebuild=rebuild)
        reports = users | "Perturb" >> beam.ParDo(fn, state)
        out = reports | "Collect" >> CollectStep(self._protocol, self._round, self._previous, self._fanout,
                                                 split=True, drawn=self._draw)
        return {"going": out["state"], FINAL: out[FINAL], COUNTS: out[COUNTS]}


class RunProtocol(beam.PTransform):
    """``PCollection[UserBatch]`` -> ``{"state": the final ProtocolState}``,
    one element, and for a single-round protocol ``"counts"``, its round's
    counts (a multi-round protocol's counts are per round: ``"state"`` is
    what it ends with); the users' groups come from ``Collection.from_seed(seed)``.
    ``later_rounds``: the same users as recipes, which rounds after the
    first read instead. ``draw_counts``: draw each batch's counts instead of
    making its reports (``Protocol.draw_round_counts``; simulations only)."""

    def __init__(self, protocol: Protocol, seed: int, fanout: int | None = None,
                 later_rounds: UserRecipes | None = None, label: str | None = None, draw_counts: bool = False):
        super().__init__(label)
        if draw_counts:
            check_count_draw(protocol)
        self._protocol, self._seed, self._fanout, self._later = protocol, seed, fanout, later_rounds
        self._draw = draw_counts

    def expand(self, users):
        protocol = self._protocol
        going, finals = protocol.initial_state(Collection.from_seed(self._seed)), []
        for r in range(protocol.max_rounds):
            out = users | f"Round{r + 1}" >> GatedRound(protocol, r, self._seed, going, self._fanout, self._later,
                                                        draw_counts=self._draw)
            going = out["going"]
            finals.append(out[FINAL])
        if protocol.max_rounds == 1:
            return {"state": finals[0], "counts": out[COUNTS]}
        return {"state": finals | "FinalState" >> beam.Flatten()}
