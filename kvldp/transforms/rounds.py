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
import inspect
from collections.abc import Callable

import apache_beam as beam
from apache_beam.pvalue import AsList, AsSingleton

from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.protocol import Collection, Protocol, ProtocolState, check_count_draw
from kvldp.transforms.accumulate import DrawnCountsCombineFn, RoundCombineFn
from kvldp.transforms.coders import NDArray
from kvldp.transforms.global_combine import CombineWithoutDefaults, inject_default
from kvldp.transforms.perturb import DrawCountsFn, PerturbFn
from kvldp.transforms.spread import Positioned, positioned, spread


class CollectRound(beam.PTransform):
    """The collector's half of a round: ``reports -> {"counts", "state"}``
    (``previous``: the state the round started from)."""

    def __init__(self, protocol: Protocol, round_index: int, previous, fanout: int | None = None,
                 label: str | None = None):
        super().__init__(label)
        self._protocol, self._round, self._previous, self._fanout = protocol, round_index, previous, fanout

    def expand(self, reports):
        out = calibrate_round(reports, self._protocol, self._round, self._previous, self._fanout)
        return {"counts": out[COUNTS], "state": out.state}


@dataclasses.dataclass(frozen=True)
class UserRecipes:
    """A generated dataset's users as recipes: ``specs``, a PCollection of
    its batch specs, and ``rebuild(*spec) -> UserBatch`` (``Dataset.batch``)."""

    specs: beam.PCollection
    rebuild: Callable[..., UserBatch]


FINAL, COUNTS = "final", "counts"

# Whether this Beam types a ParDo's tagged outputs (``with_output_types(main, **tagged)``; 2.62 has the
# main output's only): without it the tagged outputs are ``Any``, which Beam's fallback coder pickles
# -- the same values, without ``ArrayPayloadCoder``'s size estimate.
TYPED_TAGS = "tagged_type_hints" in inspect.signature(beam.PTransform.with_output_types).parameters

# The state a round's clients see once the protocol ended before it: stopped, so they report nothing.
ENDED = ProtocolState(0, None, True, 0.0, None)


class AdvanceFn(beam.DoFn):
    """The state round ``round_index`` started from (the main input; or an
    Impulse's element, for a constant ``start``) and the round's combined
    counts (a side list of at most one; none: no reports, the combine's
    value for no input) -> the state after the round, and its counts on
    ``COUNTS``. ``split``: the state goes to the main output only while the
    protocol goes on, to ``FINAL`` once it has stopped or run its last round
    (module docstring); else always to the main output."""

    def __init__(self, protocol: Protocol, round_index: int, combine_fn: beam.CombineFn,
                 start: ProtocolState | None = None, split: bool = False):
        self._protocol, self._round, self._fn = protocol, round_index, combine_fn
        self._start, self._split = start, split

    def process(self, previous, combined: list):
        if self._start is not None:
            previous = self._start
        counts = inject_default(None, combined, self._fn)
        state = self._protocol.next_state(self._round, previous, counts)
        yield beam.pvalue.TaggedOutput(COUNTS, counts)
        if self._split and (state.stopped or self._round + 1 >= self._protocol.max_rounds):
            yield beam.pvalue.TaggedOutput(FINAL, state)
        else:
            yield state


def calibrate_round(reports, protocol: Protocol, round_index: int, previous, fanout: int | None = None,
                    split: bool = False, drawn: bool = False):
    """The collector's half of round ``round_index``: ``reports`` combined
    into the round's counts (``fanout``: an intermediate combine level), then
    calibrated from ``previous`` -- a state (``None``: a fresh protocol's) or
    a PCollection of at most one -- by ``AdvanceFn``. Its outputs: ``state``
    (the main one), ``FINAL`` (with ``split``) and ``COUNTS``.

    The combine's value for no input is made in the calibration rather than
    by ``CombineGlobally``'s defaults (``Create([None])``, then a Map that
    injects it: ``global_combine.py``): one step fewer, and a calibration
    whose main input is empty -- a round after the protocol stopped -- runs
    not at all. ``drawn``: the elements are counts drawn per batch
    (``DrawCountsFn``), not reports."""
    combine_fn = (DrawnCountsCombineFn if drawn else RoundCombineFn)(protocol, round_index)
    combined = reports | "Accumulate" >> CombineWithoutDefaults(combine_fn, fanout)
    if isinstance(previous, beam.PCollection):
        start, constant = previous, None
    else:
        start = reports.pipeline | "Start" >> beam.Impulse()
        constant = protocol.initial_state() if previous is None else previous
    advance = AdvanceFn(protocol, round_index, combine_fn, constant, split)
    calibrate = beam.ParDo(advance, AsList(combined))
    calibrate = (calibrate.with_output_types(ProtocolState, **{FINAL: ProtocolState, COUNTS: NDArray})
                 if TYPED_TAGS else calibrate.with_output_types(ProtocolState))
    return start | "Calibrate" >> calibrate.with_outputs(FINAL, COUNTS, main="state")


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
        out = calibrate_round(reports, self._protocol, self._round, self._previous, self._fanout, split=True,
                              drawn=self._draw)
        return {"going": out.state, FINAL: out[FINAL], COUNTS: out[COUNTS]}


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
