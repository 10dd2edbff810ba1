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

from kvldp.mechanisms.base import Reports
from kvldp.mechanisms.privacy.randomness import bernoulli_positions

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


_CHUNK = 1 << 20      # slots per step of a loop that would otherwise make temporaries of them all
DIVMOD_BELOW = 16     # slots a user below which skip_items divides (measured break-even: ~16)


def skip_items(slots: np.ndarray, items: np.ndarray, width: int):
    """Sparse unary encoding's layout, in place: ``slots`` are the sorted
    indices of set slots of ``n = len(items)`` users, ``width`` slots each,
    where slot ``j`` of user ``i`` is position ``j + (j >= items[i])`` of
    its report (every position but its own item's); they become those
    positions. Returns ``(starts, at)``: the index of each user's first slot
    (``n + 1`` of them: CSR offsets of the slots) and of its first slot past
    its item, where the item goes to keep the report sorted.

    The shift is a running sum of steps at those ``2n`` boundaries, added a
    chunk at a time: an int64 ``divmod`` of every slot made the unary
    encoding 2.4x slower than its random draws (IOH-SUE, 3^10 cells: ~20M
    slots a batch), and a step array of them all is one more 160 MB array
    that the kernel maps and zero-fills afresh for every batch (above glibc's
    32 MiB mmap threshold: ``runtime/process.py``). With fewer than
    ``DIVMOD_BELOW`` slots a user the boundaries' sort costs more than the
    divmod (IOH-OUE at 27 cells: 5.7 ms a batch against 0.3), which then
    does it (``_skip_items_by_divmod``; the same result)."""
    n = len(items)
    if len(slots) < DIVMOD_BELOW * n:
        return _skip_items_by_divmod(slots, items, width)
    starts = np.searchsorted(slots, np.arange(n + 1, dtype=np.int64) * width)
    at = np.searchsorted(slots, np.arange(n, dtype=np.int64) * width + items)
    # at each next user's first slot: back by ``width`` and its item not passed yet; past a user's item: +1
    where = np.concatenate([starts[1:n], at])
    delta = np.concatenate([np.full(max(n - 1, 0), -width - 1, dtype=np.int64), np.ones(n, dtype=np.int64)])
    order = np.argsort(where, kind="stable")
    where, delta = where[order], delta[order]
    step = np.empty(min(len(slots), _CHUNK), dtype=np.int64)
    carry = 0
    for s in range(0, len(slots), _CHUNK):
        e = min(len(slots), s + _CHUNK)
        lo, hi = np.searchsorted(where, [s, e])
        chunk = step[:e - s]
        chunk[:] = 0
        np.add.at(chunk, where[lo:hi] - s, delta[lo:hi])
        np.cumsum(chunk, out=chunk)
        chunk += carry
        slots[s:e] += chunk
        carry = int(chunk[-1])
    return starts, at


def _skip_items_by_divmod(slots: np.ndarray, items: np.ndarray, width: int):
    """``skip_items`` by one ``divmod`` of every slot: ~8 ns a slot, where
    ``skip_items``' running sum takes ~1.3 ns a slot and ~110 ns a user."""
    n = len(items)
    owner = np.empty_like(slots)
    np.divmod(slots, width, out=(owner, slots))
    before = slots < items[owner]
    slots += ~before
    starts = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=n))])
    return starts, starts[:-1] + np.bincount(owner[before], minlength=n)


@dataclasses.dataclass(frozen=True)
class _UnaryEncoding(_Oracle):
    """Unary encoding: one-hot of the item, bit ``1`` kept w.p. ``p``, each
    ``0`` set w.p. ``q``. The report is the sorted list of set positions (CSR:
    ``offsets``, ``positions``), drawn sparsely in O(d q) per user."""

    def perturb(self, items: np.ndarray, rng: np.random.Generator):
        items = np.asarray(items, dtype=np.int64)
        n = len(items)
        # zero-bits: n (d-1) slots, each set w.p. q (every position but the item's)
        zeros_set = bernoulli_positions(n * (self.d - 1), self.q, rng)
        keep = rng.random(n) < self.p
        starts, at = skip_items(zeros_set, items, self.d - 1)
        positions = np.insert(zeros_set, at[keep], items[keep])
        return np.concatenate([[0], np.cumsum(np.diff(starts) + keep)]), positions

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


SUPPORT_CELLS = 1 << 18      # (report, item) hash evaluations a step of OLH's support: 2 MB a temporary, in cache


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

    def support(self, a, b, values, chunk: int | None = None) -> np.ndarray:
        """Support counts, evaluating every report's hash on every item in
        chunks of reports (O(n d) work, O(chunk d) memory: ``chunk`` default
        ``SUPPORT_CELLS // d`` reports: a fixed 4,096 made each of the hash's
        temporaries 11 GB at 340,542 keys, and at 5,000 keys took 37 ns a
        cell out of cache against 5.2 in it)."""
        out = np.zeros(self.d, dtype=np.int64)
        chunk = chunk or max(1, SUPPORT_CELLS // self.d)
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
