"""Consistent frequencies: post-processing of Wang, Lopuhaä-Zwakenberg,
Chen, Li and Cao, "Locally Differentially Private Frequency Estimation with
Consistency", NDSS 2020 (§IV).

A frequency oracle's raw estimates ``x`` are unbiased but may be negative
and need not add up to what the frequencies add up to: ``T`` = the number
of pairs per user (1 for one pair per user; for padding-and-sampling with
``l``, what the estimator estimates, ``l`` times the share of users who
sampled a real key). Each method maps ``x`` onto the consistent set
``{y : y >= 0}`` (and ``sum y = T`` where named):

* :func:`norm_sub` -- Norm-Sub (§IV-C): ``y_k = max(x_k - delta, 0)`` with
  the one shift ``delta`` that makes ``sum y = T`` (and, with an upper
  bound ``u`` on each frequency, ``min(.., u)``). It is the Euclidean
  projection of ``x`` onto the scaled simplex (§IV-D shows that constrained
  least squares gives Norm-Sub), so it never moves ``x`` further than any
  other consistent vector.
* :func:`project` -- the projection in the metric of the estimates'
  variances: ``argmin sum_k w_k (y_k - x_k)^2`` over the scaled simplex,
  ``w_k = 1/Var x_k`` (generalised least squares; ``y_k = max(x_k - lam/w_k, 0)``
  by the KKT conditions). With equal variances it is Norm-Sub; where the
  variances differ (PCKV's grows with ``f``) a noisy key absorbs more of the
  correction than a precise one.
* :func:`base_cut` -- Base-Cut (§IV-B): estimates below the significance
  threshold ``z_{1 - alpha/d} sd_k`` (``sd_k`` the estimator's s.d. at
  ``f = 0``; a one-sided test at level ``alpha`` with Bonferroni's
  correction over the ``d`` keys) become 0, the others stay as they are.
  Not consistent in the sum; the best of Wang et al.'s methods for the
  top keys of a sparse distribution.
"""
from __future__ import annotations

import math

import numpy as np

from kvldp.mechanisms import special

BASE_CUT_ALPHA = 0.05


def project(x, total: float, weights=None, upper: float | None = None) -> np.ndarray:
    """``argmin_y sum_k w_k (y_k - x_k)^2`` subject to ``0 <= y <= upper``
    and ``sum y = total`` (``weights`` default 1: Norm-Sub; ``upper``
    default none). Exact: with ``lam`` the multiplier of the sum,
    ``y_k = clip(x_k - lam/w_k, 0, upper)`` by the KKT conditions; the sum
    falls with ``lam``, piecewise linearly between the breakpoints
    ``w_k x_k`` (a key reaches 0) and ``w_k (x_k - upper)`` (it leaves its
    bound), so a bisection over the sorted breakpoints finds the piece whose
    sum is ``total``, which is solved for ``lam``.

    The bound is a key's frequency's, ``1`` (a share of users), or ``kappa``
    where the truncation correction divides by the kept share ``kappa``
    afterwards (``truncation.py``): a projection without it put Norm-Sub's
    mass on a few keys that the correction then cut at 1 (KS-GRR on
    MovieLens at eps 1: 6.2 pairs per user kept of 113 measured). A
    ``total`` above ``upper`` times the keys gives every key ``upper``
    (the nearest point the bounds allow)."""
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 1 or not len(x):
        raise ValueError("project needs a non-empty vector")
    if not np.all(np.isfinite(x)):
        raise ValueError("project needs finite estimates")
    total = float(total)
    if not math.isfinite(total) or total < 0:
        raise ValueError(f"the total must be a finite number >= 0, got {total}")
    w = np.ones_like(x) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != x.shape or not np.all(np.isfinite(w) & (w > 0)):
        raise ValueError("weights must be positive and finite, one per estimate")
    bound = np.inf if upper is None else float(upper)
    if not bound > 0:
        raise ValueError(f"the upper bound must be above 0, got {upper}")
    if total == 0:
        return np.zeros_like(x)
    if total >= bound * len(x):
        return np.full_like(x, bound)

    def summed(lam: float) -> float:
        return float(np.sum(np.clip(x - lam / w, 0.0, bound)))

    breaks = np.unique(np.concatenate([w * x, w * (x - bound)] if math.isfinite(bound) else [w * x]))
    # the last breakpoint (every key at 0) sums to 0 < total: find the last one that still reaches total
    lo, hi = -1, len(breaks) - 1            # summed(breaks[lo]) >= total > summed(breaks[hi]); -1: below all
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if summed(breaks[mid]) >= total else (lo, mid)
    # inside the piece (breaks[lo], breaks[hi]) each key is at 0, at its bound or free
    probe = breaks[hi] - 1.0 if lo < 0 else (breaks[lo] + breaks[hi]) / 2
    y = x - probe / w
    free, full = (y > 0) & (y < bound), y >= bound
    at_bound = bound * np.sum(full) if full.any() else 0.0
    lam = (np.sum(x[free]) + at_bound - total) / np.sum(1.0 / w[free]) if free.any() else breaks[lo]
    return np.clip(x - lam / w, 0.0, bound)


def norm_sub(x, total: float, upper: float | None = None) -> np.ndarray:
    """Norm-Sub: ``clip(x - delta, 0, upper)`` summing to ``total`` (the
    Euclidean projection onto the scaled simplex, cut at ``upper``:
    :func:`project` with equal weights)."""
    return project(x, total, upper=upper)


def base_cut_threshold(d: int, alpha: float = BASE_CUT_ALPHA) -> float:
    """``z_{1 - alpha/d}``: the one-sided normal quantile with Bonferroni's correction."""
    return float(-special.ndtri(alpha / max(int(d), 1)))      # the normal's upper alpha/d point


def base_cut(x, sd_at_zero, alpha: float = BASE_CUT_ALPHA) -> np.ndarray:
    """Base-Cut: ``x_k`` where it exceeds ``z_{1 - alpha/d} sd_k``, else 0."""
    x = np.asarray(x, dtype=np.float64)
    threshold = base_cut_threshold(len(x), alpha) * np.asarray(sd_at_zero, dtype=np.float64)
    return np.where(x > threshold, x, 0.0)


def measured_total(est) -> tuple[float, float]:
    """``(T, se)``: what the keys' frequencies sum to as the reports of an
    ``Estimates`` measure it -- its ``frequency_total`` where the mechanism has one
    from reports the keys' own estimates do not use (PCKV's and KS-UE's
    dummy keys, KS-GRR's round 1), else the sum of the raw estimates of the
    keys with a frequency, which clipping does not inflate, and ``sqrt`` of
    the sum of their variances."""
    if est.frequency_total is not None:
        return float(est.frequency_total), float(est.frequency_total_se)
    held = np.isfinite(np.asarray(est.frequency, dtype=np.float64))
    raw = np.asarray(est.frequency_raw, dtype=np.float64)[held]
    se = np.asarray(est.frequency_se, dtype=np.float64)[held]
    return float(np.nansum(raw)), float(np.sqrt(np.nansum(se ** 2)))
