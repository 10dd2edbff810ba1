"""The Mechanism interface and the batch types every mechanism speaks.

A mechanism is three pure functions over NumPy arrays (DESIGN.md):

* ``perturb(users, rng) -> ReportBatch`` -- the client step, vectorised over a
  batch of users;
* ``accumulate(counts, reports)`` / ``merge(counts...)`` -- the collector's
  sufficient statistics, one flat ``int64`` array whose element 0 is the
  number of reports, so any runner may add them up in any order;
* ``estimate(counts) -> Estimates`` -- calibration.

This module never imports Beam: a device-side or server-side client can use
the mechanisms without it.
"""
from __future__ import annotations

import abc
import dataclasses
from typing import Any, ClassVar, Iterable, Mapping, Sequence

import numpy as np


@dataclasses.dataclass(frozen=True)
class UserBatch:
    """A batch of users in CSR form.

    User ``i`` holds the pairs ``keys[offsets[i]:offsets[i+1]]`` with values
    ``values[...]`` in ``[-1, 1]``; keys of one user are distinct. ``batch_id``
    identifies the batch for seeding (never element order, DESIGN.md).
    """

    offsets: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    batch_id: int = 0

    def __post_init__(self):
        object.__setattr__(self, "offsets", np.asarray(self.offsets, dtype=np.int64))
        object.__setattr__(self, "keys", np.asarray(self.keys, dtype=np.int64))
        object.__setattr__(self, "values", np.asarray(self.values, dtype=np.float64))
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0:
            raise ValueError("offsets must be a 1-D array starting at 0")
        if self.offsets[-1] != len(self.keys) or len(self.keys) != len(self.values):
            raise ValueError("offsets[-1], len(keys) and len(values) must agree")

    @property
    def n_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def owners(self) -> np.ndarray:
        """Index of the user holding each pair."""
        return np.repeat(np.arange(self.n_users), self.sizes)

    def subset(self, mask: np.ndarray) -> "UserBatch":
        """The users where ``mask`` is true, in order (same batch id)."""
        mask = np.asarray(mask, dtype=bool)
        sizes = self.sizes[mask]
        pairs = np.repeat(mask, self.sizes)
        return UserBatch(np.concatenate([[0], np.cumsum(sizes)]), self.keys[pairs], self.values[pairs],
                         self.batch_id)

    @classmethod
    def single_pair(cls, keys, values, batch_id: int = 0) -> "UserBatch":
        """One pair per user."""
        keys = np.asarray(keys)
        return cls(np.arange(len(keys) + 1), keys, values, batch_id)

    @classmethod
    def concat(cls, batches: Sequence["UserBatch"], batch_id: int = 0) -> "UserBatch":
        sizes = np.concatenate([b.sizes for b in batches]) if batches else np.zeros(0, np.int64)
        return cls(
            np.concatenate([[0], np.cumsum(sizes)]),
            np.concatenate([b.keys for b in batches]) if batches else np.zeros(0),
            np.concatenate([b.values for b in batches]) if batches else np.zeros(0),
            batch_id,
        )


@dataclasses.dataclass(frozen=True)
class ReportBatch:
    """A batch of randomised reports.

    Each report is a list of ``(position, symbol)`` entries:
    ``positions[offsets[i]:offsets[i+1]]`` with a small ``int8`` symbol per
    entry in ``signs`` whose meaning is the mechanism's (PCKV: the value's
    sign; PrivKV/KVUE: state - 1; F2M: ±(1 + key bit); KVOH: a 3-bit mask). PCKV-UE
    sends the non-zero entries of its ternary vector (positions sorted, so
    the list order says nothing about which key was sampled); PCKV-GRR sends
    exactly one entry.
    """

    offsets: np.ndarray
    positions: np.ndarray
    signs: np.ndarray
    batch_id: int = 0

    def __post_init__(self):
        object.__setattr__(self, "offsets", np.asarray(self.offsets, dtype=np.int64))
        object.__setattr__(self, "positions", np.asarray(self.positions, dtype=np.int32))
        object.__setattr__(self, "signs", np.asarray(self.signs, dtype=np.int8))
        if self.offsets[-1] != len(self.positions) or len(self.positions) != len(self.signs):
            raise ValueError("offsets[-1], len(positions) and len(signs) must agree")

    @property
    def n_reports(self) -> int:
        return len(self.offsets) - 1

    @classmethod
    def concat(cls, batches: Sequence["ReportBatch"], batch_id: int = 0) -> "ReportBatch":
        sizes = np.concatenate([np.diff(b.offsets) for b in batches])
        return cls(
            np.concatenate([[0], np.cumsum(sizes)]),
            np.concatenate([b.positions for b in batches]),
            np.concatenate([b.signs for b in batches]),
            batch_id,
        )

    def equals(self, other: "ReportBatch") -> bool:
        return (
            np.array_equal(self.offsets, other.offsets)
            and np.array_equal(self.positions, other.positions)
            and np.array_equal(self.signs, other.signs)
        )


@dataclasses.dataclass(frozen=True)
class Estimates:
    """Calibrated per-key estimates (arrays of length d).

    ``frequency``/``mean`` are the post-processed (clipped) estimates;
    ``frequency_raw``/``mean_raw`` the unclipped ones; ``*_se`` plug-in
    standard errors from the mechanism's variance.
    """

    frequency: np.ndarray
    mean: np.ndarray
    frequency_raw: np.ndarray
    mean_raw: np.ndarray
    frequency_se: np.ndarray
    mean_se: np.ndarray
    n_reports: int
    mechanism: str
    epsilon: float

    @property
    def d(self) -> int:
        return len(self.frequency)


MAX_EPSILON = 30.0


def validated_domain(d: int, epsilon: float) -> tuple[int, float]:
    """``(d, epsilon)`` checked: at least one key, ``0 < epsilon <= MAX_EPSILON``."""
    if int(d) < 1:
        raise ValueError(f"the key domain needs at least one key, got d={d}")
    if not np.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon}")
    if epsilon > MAX_EPSILON:
        # e^eps overflows float64 near 709, and well before that every
        # perturbation probability rounds to 0 or 1 (no privacy at all).
        raise ValueError(f"epsilon {epsilon} is beyond {MAX_EPSILON}: the perturbation would be deterministic")
    return int(d), float(epsilon)


class Mechanism(abc.ABC):
    """A key-value LDP mechanism: perturb, accumulate/merge, estimate."""

    name: ClassVar[str]

    def __init__(self, d: int, epsilon: float):
        self.d, self.epsilon = validated_domain(d, epsilon)

    # -- client ---------------------------------------------------------
    @abc.abstractmethod
    def perturb(self, users: UserBatch, rng: np.random.Generator) -> ReportBatch:
        """Randomise each user of the batch into one report."""

    # -- collector ------------------------------------------------------
    @property
    @abc.abstractmethod
    def counts_size(self) -> int:
        """Length of the flat count array (element 0 counts reports)."""

    def new_counts(self) -> np.ndarray:
        return np.zeros(self.counts_size, dtype=np.int64)

    @abc.abstractmethod
    def accumulate(self, counts: np.ndarray, reports: ReportBatch) -> np.ndarray:
        """Add a batch of reports into ``counts`` (in place) and return it."""

    def merge(self, counts: Iterable[np.ndarray]) -> np.ndarray:
        out = self.new_counts()
        for c in counts:
            out += c
        return out

    @abc.abstractmethod
    def estimate(self, counts: np.ndarray) -> Estimates:
        """Calibrate the counts into per-key estimates."""

    def theoretical_variance(self, n: int, f, m):
        """``(Var f_hat, Var m_hat)`` per key from the paper's closed forms at
        the true ``(f, m)``, or ``None`` where the mechanism has none."""
        return None

    # -- description ----------------------------------------------------
    def config(self) -> Mapping[str, Any]:
        """The public parameters that pin the report distribution.

        The collector checks reports against these (a mismatch would make
        every estimate wrong).
        """
        return {"mechanism": self.name, "d": self.d, "epsilon": self.epsilon}

    @property
    def report_domain(self) -> int:
        """Number of distinct positions a report may carry."""
        return self.d

    @property
    def estimate_keys(self) -> list[int]:
        """Dictionary indices of the keys ``estimate`` reports on (all of them,
        unless the mechanism works on a chosen subset, as IOH)."""
        return list(range(self.d))

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "mechanism")
        return f"{type(self).__name__}({args})"
