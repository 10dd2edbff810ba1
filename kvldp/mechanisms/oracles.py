"""Frequency oracles: GRR, SUE, OUE and OLH (Wang et al., USENIX Security 2017).

Building blocks of the key-value mechanisms (SPEC.md §5). Each oracle is a
frozen parameter object derived once from ``(d, eps)`` with

* ``perturb(items, rng)`` -- one report per item (vectorised);
* ``support(reports)`` -- per item, how many reports support it;
* ``estimate(support, n)`` -- unbiased counts ``(C - n q) / (p - q)``;
* ``variance(n, f)`` -- exact variance of the frequency estimate,
  ``[q(1-q) + f (p(1-p) - q(1-q))] / (n (p-q)^2)`` (Wang et al. §4, Eq. (2)
  plus its ``f`` term).

Notation: ``p`` = probability a report supports the true item, ``q`` =
probability it supports a given other item.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import ClassVar

import numpy as np

from .base import Reports
from .randomness import bernoulli_positions

# OLH universal hashing ((a x + b) mod P) mod g with the Mersenne prime 2^31-1:
# a*x < 2^62 fits in uint64, and item indices must stay below P.
_HASH_PRIME = (1 << 31) - 1


def _check(d: int, epsilon: float):
    if int(d) < 2:
        raise ValueError(f"a frequency oracle needs a domain of at least 2 items, got {d}")
    if not math.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon}")


def randomized_response(items: np.ndarray, d: int, p: float, rng: np.random.Generator):
    """The one GRR draw every mechanism uses: keep each item of ``[0, d)``
    w.p. ``p``, else report a uniformly random *other* item. Returns
    ``(kept, reports)`` (PCKV-GRR perturbs the value depending on ``kept``)."""
    items = np.asarray(items, dtype=np.int64)
    kept = rng.random(len(items)) < p
    other = rng.integers(0, d - 1, size=len(items))
    return kept, np.where(kept, items, other + (other >= items))


@dataclasses.dataclass(frozen=True)
class _Oracle:
    d: int
    epsilon: float

    def __post_init__(self):
        _check(self.d, self.epsilon)

    @property
    def p(self) -> float:
        raise NotImplementedError

    @property
    def q(self) -> float:
        raise NotImplementedError

    def estimate(self, support: np.ndarray, n: int) -> np.ndarray:
        """Unbiased item counts from the support counts."""
        return (np.asarray(support, dtype=np.float64) - n * self.q) / (self.p - self.q)

    def variance(self, n: int, f) -> np.ndarray:
        """Exact variance of ``estimate(...)/n`` for an item of frequency ``f``."""
        p, q = self.p, self.q
        f = np.asarray(f, dtype=np.float64)
        return (q * (1 - q) + f * (p * (1 - p) - q * (1 - q))) / (n * (p - q) ** 2)


@dataclasses.dataclass(frozen=True)
class GRR(_Oracle):
    """Generalised randomised response (k-RR): keep w.p. ``e^eps/(e^eps+d-1)``,
    else a uniformly random *other* item. Report = the item."""

    @property
    def p(self) -> float:
        return math.exp(self.epsilon) / (math.exp(self.epsilon) + self.d - 1)

    @property
    def q(self) -> float:
        return 1.0 / (math.exp(self.epsilon) + self.d - 1)

    def perturb(self, items: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return randomized_response(items, self.d, self.p, rng)[1]

    def support(self, reports: np.ndarray) -> np.ndarray:
        return np.bincount(reports, minlength=self.d)


_CHUNK = 1 << 20      # positions per step of a loop that would otherwise make temporaries of them all


@dataclasses.dataclass(frozen=True)
class _UnaryEncoding(_Oracle):
    """Unary encoding: one-hot of the item, bit ``1`` kept w.p. ``p``, each
    ``0`` set w.p. ``q``. The report is the sorted list of set positions (CSR:
    ``offsets``, ``positions``), drawn sparsely in O(d q) per user."""

    def perturb(self, items: np.ndarray, rng: np.random.Generator):
        items = np.asarray(items, dtype=np.int64)
        n = len(items)
        # zero-bits: n*(d-1) slots, each set w.p. q; slot j of user i is item
        # j + (j >= item_i), so positions stay sorted within a user.
        # In place, two arrays of the positions at a time: at q ~ 0.1 and 3^10
        # cells a batch draws ~20M of them, and each int64 array is 160 MB
        # (five at once were 0.79 GB of IOH-SUE's batch).
        pos = bernoulli_positions(n * (self.d - 1), self.q, rng)
        owner = np.empty_like(pos)
        np.divmod(pos, self.d - 1, out=(owner, pos))
        for s in range(0, len(pos), _CHUNK):
            pos[s:s + _CHUNK] += pos[s:s + _CHUNK] >= items[owner[s:s + _CHUNK]]
        keep = rng.random(n) < self.p
        sizes = np.bincount(owner, minlength=n) + keep
        owner *= self.d                 # owner * d + position: sorted, where each kept item goes
        owner += pos
        at = np.searchsorted(owner, (np.arange(n) * self.d + items)[keep])
        del owner
        positions = np.insert(pos, at, items[keep])
        return np.concatenate([[0], np.cumsum(sizes)]), positions

    def support(self, positions: np.ndarray) -> np.ndarray:
        return np.bincount(positions, minlength=self.d)

    def draw_support(self, items: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """``support(perturb(items)[1])`` drawn from its distribution without
        making a report (simulations only): every bit of every report is
        independent, so item ``i``'s support is ``Binomial(N_i, p) +
        Binomial(n - N_i, q)``, ``N_i`` the items equal to ``i``. O(d) draws
        instead of O(n d q)."""
        items = np.asarray(items, dtype=np.int64)
        held = np.bincount(items, minlength=self.d)
        return rng.binomial(held, self.p) + rng.binomial(len(items) - held, self.q)


@dataclasses.dataclass(frozen=True)
class SUE(_UnaryEncoding):
    """Symmetric unary encoding (basic RAPPOR): ``p = e^(eps/2)/(e^(eps/2)+1)``,
    ``q = 1 - p``."""

    @property
    def p(self) -> float:
        return math.exp(self.epsilon / 2) / (math.exp(self.epsilon / 2) + 1)

    @property
    def q(self) -> float:
        return 1.0 / (math.exp(self.epsilon / 2) + 1)


@dataclasses.dataclass(frozen=True)
class OUE(_UnaryEncoding):
    """Optimised unary encoding: ``p = 1/2``, ``q = 1/(e^eps+1)``."""

    @property
    def p(self) -> float:
        return 0.5

    @property
    def q(self) -> float:
        return 1.0 / (math.exp(self.epsilon) + 1)


@dataclasses.dataclass(frozen=True)
class OLH(_Oracle):
    """Optimised local hashing: each user draws a universal hash
    ``H(x) = ((a x + b) mod P) mod g`` with ``g = round(e^eps) + 1`` and
    reports ``(a, b, GRR_g(H(item)))``. An item is supported when it hashes to
    the reported value: ``p = e^eps/(e^eps+g-1)``, ``q = 1/g``."""

    @property
    def g(self) -> int:
        return max(2, round(math.exp(self.epsilon)) + 1)

    @property
    def p(self) -> float:
        return math.exp(self.epsilon) / (math.exp(self.epsilon) + self.g - 1)

    @property
    def q(self) -> float:
        return 1.0 / self.g

    def __post_init__(self):
        super().__post_init__()
        if self.d >= _HASH_PRIME:
            raise ValueError(f"OLH supports domains below {_HASH_PRIME}, got {self.d}")

    def hash(self, a, b, items) -> np.ndarray:
        a = np.asarray(a, dtype=np.uint64)
        b = np.asarray(b, dtype=np.uint64)
        x = np.asarray(items, dtype=np.uint64)
        return ((a * x + b) % np.uint64(_HASH_PRIME) % np.uint64(self.g)).astype(np.int64)

    def perturb(self, items: np.ndarray, rng: np.random.Generator):
        items = np.asarray(items, dtype=np.int64)
        n = len(items)
        a = rng.integers(1, _HASH_PRIME, size=n, dtype=np.int64)
        b = rng.integers(0, _HASH_PRIME, size=n, dtype=np.int64)
        return a, b, randomized_response(self.hash(a, b, items), self.g, self.p, rng)[1]

    def support(self, a, b, values, chunk: int = 4096) -> np.ndarray:
        """Support counts, evaluating every report's hash on every item in
        chunks of reports (O(n d) work, O(chunk d) memory)."""
        out = np.zeros(self.d, dtype=np.int64)
        items = np.arange(self.d, dtype=np.uint64)
        for s in range(0, len(values), chunk):
            h = self.hash(np.asarray(a[s:s + chunk])[:, None], np.asarray(b[s:s + chunk])[:, None], items[None, :])
            out += (h == np.asarray(values[s:s + chunk])[:, None]).sum(axis=0)
        return out


@dataclasses.dataclass(frozen=True)
class OLHReportBatch(Reports):
    """OLH reports of a batch (``olh_report.avsc``): user ``i`` sent its hash
    ``(a[i], b[i])`` and the perturbed hashed value ``values[i]``."""

    schema: ClassVar[str] = "olh_report"

    a: np.ndarray
    b: np.ndarray
    values: np.ndarray
    batch_id: int = 0

    def __post_init__(self):
        for name in ("a", "b", "values"):
            object.__setattr__(self, name, np.asarray(getattr(self, name), dtype=np.int64))
        if not len(self.a) == len(self.b) == len(self.values):
            raise ValueError("a, b and values must have one entry per report")

    @property
    def n_reports(self) -> int:
        return len(self.values)

    def records(self) -> Iterator[dict]:
        for a, b, y in zip(self.a.tolist(), self.b.tolist(), self.values.tolist(), strict=True):
            yield {"a": a, "b": b, "y": y}

    @classmethod
    def from_records(cls, records: Sequence[dict], batch_id: int = 0, **shape) -> OLHReportBatch:
        return cls([r["a"] for r in records], [r["b"] for r in records], [r["y"] for r in records], batch_id)

    @classmethod
    def empty(cls, batch_id: int = 0, **shape) -> OLHReportBatch:
        return cls([], [], [], batch_id)
