"""Accuracy metrics of the papers' evaluations.

* MSE of frequency / mean over a key set (PCKV §6: all keys or the top-k);
* NCR, the normalised cumulative rank of the top-``t`` keys (KSKV §5, after
  Wang et al.): the ``j``-th most frequent true key scores ``t - j + 1``;
  an estimated top-``t`` set scores the sum of its keys' scores over the
  maximum ``t(t+1)/2``;
* MSE over the intersection of the true and the estimated top-``t`` sets
  (KSKV §5: only keys the mechanism found);
* coverage of the standard errors: the share of keys whose truth lies within
  ``±z s.e.`` of the estimate; of intervals: the share within ``[lo, hi]``.

Null (NaN) estimates -- keys a mechanism cannot estimate -- are left out of
the MSEs and the coverage and counted apart (``null_count``).
"""
from __future__ import annotations

import numpy as np


def top_keys(frequency: np.ndarray, t: int) -> np.ndarray:
    """Indices of the ``t`` largest values (ties broken by key order)."""
    return np.argsort(-np.asarray(frequency), kind="stable")[:t]


def ncr(true_frequency: np.ndarray, est_frequency: np.ndarray, t: int) -> float:
    t = min(t, len(true_frequency))
    score = np.zeros(len(true_frequency))
    score[top_keys(true_frequency, t)] = np.arange(t, 0, -1)
    return float(score[top_keys(est_frequency, t)].sum() / (t * (t + 1) / 2))


def mse(estimate: np.ndarray, truth: np.ndarray, keys=None) -> float:
    """Mean squared error over ``keys`` (all by default), skipping undefined
    truths and null (NaN) estimates."""
    estimate, truth = np.asarray(estimate, float), np.asarray(truth, float)
    keys = np.arange(len(truth)) if keys is None else np.asarray(keys)
    keys = keys[np.isfinite(truth[keys]) & np.isfinite(estimate[keys])]
    return float(np.mean((estimate[keys] - truth[keys]) ** 2)) if len(keys) else float("nan")


def null_count(estimate: np.ndarray, truth: np.ndarray, keys=None) -> int:
    """Keys of ``keys`` with a defined truth but a null (NaN) estimate."""
    estimate, truth = np.asarray(estimate, float), np.asarray(truth, float)
    keys = np.arange(len(truth)) if keys is None else np.asarray(keys)
    return int(np.sum(np.isfinite(truth[keys]) & ~np.isfinite(estimate[keys])))


def null_statuses(estimate: np.ndarray, status: np.ndarray) -> dict[str, int]:
    """``{status: keys}`` of the null (NaN) estimates: why each was left out."""
    null = ~np.isfinite(np.asarray(estimate, float))
    names, counts = np.unique(np.asarray(status, dtype=object)[null].astype(str), return_counts=True)
    return {str(n): int(c) for n, c in zip(names, counts, strict=True)}


def coverage(estimate: np.ndarray, se: np.ndarray, truth: np.ndarray, keys=None, z: float = 1.96):
    """``(share covered, keys scored, keys with s.e. == 0)``: among ``keys``
    with a defined truth and a non-null estimate and s.e., the share whose
    truth lies within ``estimate ± z se``. Keys with a null estimate or s.e.
    are not scored (see :func:`null_count`)."""
    estimate, se, truth = (np.asarray(x, float) for x in (estimate, se, truth))
    keys = np.arange(len(truth)) if keys is None else np.asarray(keys)
    keys = keys[np.isfinite(truth[keys]) & np.isfinite(estimate[keys]) & np.isfinite(se[keys])]
    zero = int(np.sum(se[keys] == 0))
    if not len(keys):
        return float("nan"), 0, zero
    covered = np.abs(estimate[keys] - truth[keys]) <= z * se[keys]
    return float(np.mean(covered)), len(keys), zero


def top_t_intersection(true_frequency, est_frequency, t: int) -> np.ndarray:
    return np.intersect1d(top_keys(true_frequency, t), top_keys(est_frequency, t))


def interval_coverage(lo: np.ndarray, hi: np.ndarray, truth: np.ndarray, keys=None):
    """``(share covered, keys scored)``: among ``keys`` with a defined truth
    and a non-null interval, the share whose truth lies in ``[lo, hi]``."""
    lo, hi, truth = (np.asarray(x, float) for x in (lo, hi, truth))
    keys = np.arange(len(truth)) if keys is None else np.asarray(keys)
    keys = keys[np.isfinite(truth[keys]) & np.isfinite(lo[keys]) & np.isfinite(hi[keys])]
    if not len(keys):
        return float("nan"), 0
    return float(np.mean((lo[keys] <= truth[keys]) & (truth[keys] <= hi[keys]))), len(keys)
