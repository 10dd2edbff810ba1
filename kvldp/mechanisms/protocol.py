"""The one mechanism interface: a protocol of rounds linked by a broadcast.

Every mechanism is a ``Protocol``; a single-round one (PCKV, PrivKV, …) is a
``Mechanism``, i.e. a one-round protocol that implements the round steps
with its ``perturb``/``accumulate``/``estimate``. So one perturb DoFn, one
CombineFn, one round transform and one local runner serve them all, and
each is written once against the round steps:

* ``perturb_round(r, users, rng, state) -> Reports`` -- the client step,
  vectorised over a batch of users (``participants`` picks who reports);
* ``accumulate_round(r, counts, reports)`` / ``merge_round`` -- the
  collector's sufficient statistics, one flat ``int64`` array whose element
  0 is the number of reports, so any runner may add them up in any order;
* ``advance(r, state, counts) -> ProtocolState`` -- calibration into the
  state the next round (or the final estimates) starts from;
* ``output_probabilities`` -- the exact report distribution, for the audit.

A protocol's round ``r`` perturbs every user with what the collector
broadcast after round ``r-1`` (``ProtocolState.broadcast``, e.g. per-key
means), the collector accumulates the round's reports into counts, and
``advance`` calibrates them into the next state. The state is plain NumPy
and Python, so the Beam layer can carry it from stage to stage as a side
input; a protocol that decides its number of rounds from the data
(PrivKVM+) sets ``stopped``, after which rounds spend no budget and no user
reports.

A protocol that splits users into groups (KS-GRR, KS-Adap) must give every
round the same split, or a user lands in two groups and spends eps twice.
The split is a function of a per-collection key (``Collection``) that round
1 fixes and every later round reads back from the state, never of a
per-invocation seed.
"""
from __future__ import annotations

import abc
import dataclasses
import hashlib
import json
import secrets
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

import numpy as np

from kvldp.mechanisms.base import Estimates, ReportBatch, Reports, UserBatch, validated_domain
from kvldp.mechanisms.params import NoOptions, Options
from kvldp.mechanisms.privacy.accountant import Accountant, LongitudinalBudget, Share
from kvldp.mechanisms.privacy.randomness import STREAM_GROUP, batch_rng


@dataclasses.dataclass(frozen=True)
class Collection:
    """What every round of one collection must agree on.

    ``id`` (128 bits, hex) keys the assignment of users to groups; it is
    public (the collector learns the groups anyway from who reports when) and
    independent of the perturbation seed, which stays secret. ``layout``
    says how users were batched (their identity is (batch, position)), so a
    later round that batches differently is refused instead of silently
    regrouping users.
    """

    id: str
    layout: str = ""

    def __post_init__(self):
        try:
            ok = len(self.id) == 32 and int(self.id, 16) >= 0
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ValueError(f"a collection id is 32 hex digits, got {self.id!r}")

    @classmethod
    def fresh(cls, layout: str = "") -> Collection:
        """A new collection id from the OS's CSPRNG."""
        return cls(secrets.token_hex(16), layout)

    @classmethod
    def from_seed(cls, seed: int, layout: str = "") -> Collection:
        """The id a seeded run uses: SHA-256 of the seed under a domain tag, so
        split rounds reproduce the one-pipeline run while the id reveals
        nothing about the (secret) seed."""
        digest = hashlib.sha256(b"kvldp/collection/" + int(seed).to_bytes(16, "big", signed=False)).hexdigest()
        return cls(digest[:32], layout)

    @property
    def key(self) -> int:
        return int(self.id, 16)

    def to_json(self) -> str:
        return json.dumps({"id": self.id, "layout": self.layout}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Collection | None:
        if not text:
            return None
        raw = json.loads(text)
        return cls(raw["id"], raw.get("layout", ""))


@dataclasses.dataclass(frozen=True)
class ProtocolState:
    """What the collector knows after ``rounds_done`` rounds."""

    __hash__ = None                       # compared by value (arrays inside), never hashed

    rounds_done: int
    broadcast: np.ndarray | None          # per-key values the next round's clients use
    stopped: bool
    epsilon_spent: float
    estimates: Estimates | None
    extra: tuple = ()                     # protocol-level values, as (name, number) pairs
    collection: Collection | None = None  # fixed by round 1, carried by every later state

    def get(self, name: str, default=None):
        return dict(self.extra).get(name, default)

    def __eq__(self, other):   # arrays inside: compare by value (tests, Beam matchers)
        if not isinstance(other, ProtocolState):
            return NotImplemented
        return (self.rounds_done == other.rounds_done and self.stopped == other.stopped
                and self.epsilon_spent == other.epsilon_spent and self.collection == other.collection
                and _eq(self.broadcast, other.broadcast) and self.extra == other.extra
                and _eq(None if self.estimates is None else self.estimates.frequency,
                        None if other.estimates is None else other.estimates.frequency))


def _eq(a, b) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and np.array_equal(a, b, equal_nan=True))


class Protocol(abc.ABC):
    """A key-value LDP protocol over ``max_rounds`` potential rounds."""

    name: ClassVar[str]
    options_type: ClassVar[type[Options]] = NoOptions   # what it can be told besides d, epsilon (params.py)
    report_type: ClassVar[type[Reports]] = ReportBatch
    broadcast_kind: ClassVar[str] = ""    # what ``ProtocolState.broadcast`` holds (broadcast.avsc)
    d: int
    epsilon: float
    max_rounds: int
    ledger: Accountant

    # Disjoint user groups (shares summing to 1) and the group of each round;
    # None: every user takes part in every round.
    group_shares: tuple[float, ...] | None = None
    round_groups: tuple[int, ...] = ()

    def initial_state(self, collection: Collection | None = None) -> ProtocolState:
        return ProtocolState(0, None, False, 0.0, None, collection=collection)

    def participants(self, round_index: int, users: UserBatch, state: ProtocolState) -> UserBatch:
        """The users of ``users`` who take part in round ``round_index``: their
        group under ``state.collection`` (the same in every round)."""
        if self.group_shares is None:
            return users
        if state.collection is None:
            raise ValueError(f"{self.name} splits users into groups: its state needs the collection "
                             "(fixed by round 1) that assigns them")
        groups = assign_groups(state.collection.key, users.batch_id, users.n_users, self.group_shares)
        return users.subset(groups == self.round_groups[round_index])

    def next_state(self, round_index: int, state: ProtocolState, counts: np.ndarray) -> ProtocolState:
        """``advance``, keeping the collection: what every runner calls."""
        return dataclasses.replace(self.advance(round_index, state, counts), collection=state.collection)

    # -- client ---------------------------------------------------------
    @abc.abstractmethod
    def perturb_round(self, round_index: int, users: UserBatch, rng: np.random.Generator,
                      state: ProtocolState) -> Reports:
        """Round ``round_index``'s client step given the collector's state."""

    def round_report_type(self, round_index: int) -> type[Reports]:
        """The report type of round ``round_index`` (``report_type`` unless
        rounds differ)."""
        return self.report_type

    @abc.abstractmethod
    def output_probabilities(self, pairs: Sequence[tuple[int, float]], round_index: int = 0,
                             state: ProtocolState | None = None) -> np.ndarray:
        """Exact probability of every possible report of round ``round_index``
        (one fixed enumeration, the same for every user) for a user holding
        ``pairs`` ``[(key, v), …]``, given the state the round starts from:
        what the exact privacy audit compares across users. Small domains
        only."""

    def report_shape(self, round_index: int = 0) -> dict:
        """What the report type's ``from_records`` needs besides the records."""
        return {}

    def reports_from_records(self, round_index: int, records: Sequence[dict], batch_id: int = 0) -> Reports:
        return self.round_report_type(round_index).from_records(records, batch_id, **self.report_shape(round_index))

    def empty_reports(self, round_index: int, batch_id: int = 0) -> Reports:
        return self.round_report_type(round_index).empty(batch_id, **self.report_shape(round_index))

    # -- simulation -----------------------------------------------------
    # Whether ``draw_round_counts`` can stand in for the clients and the accumulation.
    can_draw_counts: ClassVar[bool] = False

    def draw_round_counts(self, round_index: int, users: UserBatch, rng: np.random.Generator,
                          state: ProtocolState) -> np.ndarray:
        """Round ``round_index``'s counts of ``users`` -- what
        ``accumulate_round(r, new_round_counts(r), perturb_round(r, users, rng, state))``
        returns -- drawn from that same distribution without making a report
        (``kvldp simulate --draw-counts``). A simulation's shortcut only: no
        client ever sends counts, and nothing that collects reports calls it."""
        raise NotImplementedError(no_count_draw(self.name))

    # -- collector ------------------------------------------------------
    @abc.abstractmethod
    def round_counts_size(self, round_index: int) -> int:
        """Length of round ``round_index``'s count array."""

    def new_round_counts(self, round_index: int) -> np.ndarray:
        return np.zeros(self.round_counts_size(round_index), dtype=np.int64)

    @abc.abstractmethod
    def accumulate_round(self, round_index: int, counts: np.ndarray, reports: Reports) -> np.ndarray:
        """Add reports of round ``round_index`` into ``counts`` (in place)."""

    def check_reports(self, round_index: int, reports: Reports) -> None:
        """Raise ``ValueError`` if ``reports`` hold a value no honest client
        makes (a PCKV sign of 0, a position past the domain, …): they are
        counted once into scratch counts, so the checks are exactly the
        count's own. The collector calls it where it can still refuse one
        file or message (a dead letter, a one-line error naming the file)
        instead of failing the combine that sums everyone's reports.
        Entries a client never sends (a position listed twice) are refused
        too: with them one report could add more than 1 to a count."""
        reports.check_entries()
        self.accumulate_round(round_index, self.new_round_counts(round_index), reports)

    def merge_round(self, round_index: int, counts) -> np.ndarray:
        out = self.new_round_counts(round_index)
        for c in counts:
            out += c
        return out

    @abc.abstractmethod
    def advance(self, round_index: int, state: ProtocolState, counts: np.ndarray) -> ProtocolState:
        """Calibrate round ``round_index``'s counts into the next state
        (returns ``state`` unchanged once the protocol has stopped)."""

    def estimates(self, state: ProtocolState) -> Estimates:
        if state.estimates is None:
            raise ValueError("the protocol has not completed a round")
        return state.estimates

    def theoretical_variance(self, n: int, f, m):
        """``(Var f_hat, Var m_hat)`` per key from the paper's closed forms at
        the true ``(f, m)``, or ``None`` where there are none."""
        return

    # -- description ----------------------------------------------------
    @property
    def estimate_keys(self) -> Sequence[int]:
        """Dictionary indices of the keys the estimates are about (all of
        them, unless the mechanism works on a chosen subset, as IOH). A
        ``range``, not a list: it travels pickled inside the graph's DoFns,
        where d = 10^6 indices made 715 kB of bz2 per DoFn."""
        return range(self.d)

    def config(self, round_index: int | None = None) -> Mapping[str, Any]:
        """Public parameters that pin a round's report distribution (the
        collector checks reports against them)."""
        out = {"mechanism": self.name, "d": self.d, "epsilon": self.epsilon, "max_rounds": self.max_rounds}
        if round_index is not None:
            out["round"] = round_index + 1
        return out

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "mechanism")
        return f"{type(self).__name__}({args})"


class Mechanism(Protocol):
    """A single-round protocol: ``perturb``, ``accumulate``/``merge``, ``estimate``.

    Its one round perturbs every user, and ``advance`` calibrates the counts
    into a final, stopped state that spent the whole budget."""

    max_rounds: ClassVar[int] = 1

    def __init__(self, d: int, epsilon: float):
        self.d, self.epsilon = validated_domain(d, epsilon)
        self.ledger = Accountant.of(self.epsilon, self.budget_shares(), self.longitudinal_budget())

    def longitudinal_budget(self) -> LongitudinalBudget | None:
        """The two-layer pair of a longitudinal mechanism (``kv/longitudinal.py``); else none."""
        return None

    def budget_shares(self) -> list[Share]:
        """How the report spends epsilon: the whole budget on the pair, unless
        the mechanism splits it (PrivKV's key/value, F2M's halves), in which
        case its probabilities are computed from these shares."""
        return [Share(0, "pair", self.epsilon)]

    # -- client ---------------------------------------------------------
    @abc.abstractmethod
    def perturb(self, users: UserBatch, rng: np.random.Generator) -> Reports:
        """Randomise each user of the batch into one report."""

    def perturb_round(self, round_index, users, rng, state=None) -> Reports:
        return self.perturb(users, rng)

    def draw_counts(self, users: UserBatch, rng: np.random.Generator) -> np.ndarray:
        """``accumulate(new_counts(), perturb(users, rng))`` in distribution,
        without the reports (``Protocol.draw_round_counts``; only where
        ``can_draw_counts``)."""
        raise NotImplementedError(no_count_draw(self.name))

    def draw_round_counts(self, round_index, users, rng, state=None) -> np.ndarray:
        return self.draw_counts(users, rng)

    # -- collector ------------------------------------------------------
    @property
    @abc.abstractmethod
    def counts_size(self) -> int:
        """Length of the flat count array (element 0 counts reports)."""

    def round_counts_size(self, round_index: int = 0) -> int:
        return self.counts_size

    def new_counts(self) -> np.ndarray:
        return self.new_round_counts(0)

    @abc.abstractmethod
    def accumulate(self, counts: np.ndarray, reports: Reports) -> np.ndarray:
        """Add a batch of reports into ``counts`` (in place) and return it."""

    def accumulate_round(self, round_index, counts, reports) -> np.ndarray:
        return self.accumulate(counts, reports)

    def merge(self, counts) -> np.ndarray:
        return self.merge_round(0, counts)

    @abc.abstractmethod
    def estimate(self, counts: np.ndarray) -> Estimates:
        """Calibrate the counts into per-key estimates."""

    def advance(self, round_index, state, counts) -> ProtocolState:
        return ProtocolState(1, None, True, self.ledger.spent(), self.estimate(counts))

    # -- description ----------------------------------------------------
    def config(self, round_index: int | None = None) -> Mapping[str, Any]:
        """The public parameters that pin the report distribution (one
        round: the same for every ``round_index``)."""
        return {"mechanism": self.name, "d": self.d, "epsilon": self.epsilon}

    @property
    def report_domain(self) -> int:
        """Number of distinct positions a report may carry."""
        return self.d


def no_count_draw(name: str) -> str:
    return f"{name} cannot draw its counts without making reports"


def check_count_draw(protocol: Protocol) -> None:
    """Refuse to draw counts for a protocol that has no such draw (``can_draw_counts``)."""
    if not protocol.can_draw_counts:
        raise ValueError(no_count_draw(protocol.name))


def assign_groups(key: int, batch_id: int, n_users: int, shares) -> np.ndarray:
    """Stable group of every user of a batch: a pure function of (collection
    key, batch, position), so the groups are disjoint, cover everyone, and
    every round (and a retried bundle) sees the same assignment."""
    u = batch_rng(key, batch_id, STREAM_GROUP).random(n_users)
    return np.searchsorted(np.cumsum(shares)[:-1], u, side="right").astype(np.int8)
