"""Truth statistics of a batch of users: what a simulation compares estimates
with (never computed on the collector side of a real deployment).
"""
from __future__ import annotations

import numpy as np

from kvldp.mechanisms.base import UserBatch

TRUTH_QUANTUM = 2.0 ** -20


def exact_sums(sums: np.ndarray) -> np.ndarray:
    """``sums`` rounded to multiples of ``2^-20``, so that adding them up is
    exact in float64 (every partial sum below ``2^33`` is representable) and
    the total does not depend on the order a runner merges batches in (two
    Beam workers merge in a different grouping each run). The rounding moves
    a batch's sum by at most ``2^-21``."""
    return np.rint(np.asarray(sums, dtype=np.float64) / TRUTH_QUANTUM) * TRUTH_QUANTUM


def truth_counts(users: UserBatch, d: int) -> np.ndarray:
    """Sufficient statistics of the truth: ``[n, holders[d], value sums[d]]``
    (value sums made order-independent by :func:`exact_sums`)."""
    return np.concatenate([
        [users.n_users],
        np.bincount(users.keys, minlength=d)[:d],
        exact_sums(np.bincount(users.keys, weights=users.values, minlength=d)[:d]),
    ]).astype(np.float64)


def truth_from_counts(counts: np.ndarray, d: int):
    """``(true frequency, true mean)``; the mean is NaN for keys nobody holds."""
    n, holders, sums = counts[0], counts[1:1 + d], counts[1 + d:1 + 2 * d]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(holders > 0, sums / holders, np.nan)
    return holders / max(n, 1), mean

