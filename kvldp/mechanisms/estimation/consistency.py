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
  the one shift ``delta`` that makes ``sum y = T``. It is the Euclidean
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


def project(x, total: float, weights=None) -> np.ndarray:
    """``argmin_y sum_k w_k (y_k - x_k)^2`` subject to ``y >= 0`` and
    ``sum y = total`` (``weights`` default 1: Norm-Sub). Exact: with
    ``lam`` the multiplier of the sum, ``y_k = max(x_k - lam/w_k, 0)``; the
    breakpoints ``lam = w_k x_k`` are sorted and the one piece whose sum is
    ``total`` is solved for ``lam``."""
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
    if total == 0:
        return np.zeros_like(x)
    breaks = w * x
    order = np.argsort(-breaks, kind="stable")
    # with the j+1 largest breakpoints active: sum = cx_j - lam * cinv_j
    cx = np.cumsum(x[order])
    cinv = np.cumsum(1.0 / w[order])
    lam = (cx - total) / cinv
    nxt = np.append(breaks[order][1:], -np.inf)
    # lam of the piece must lie in [next breakpoint, this breakpoint]
    fits = np.flatnonzero(lam >= nxt)
    j = fits[0] if len(fits) else len(x) - 1
    return np.maximum(x - lam[j] / w, 0.0)


def norm_sub(x, total: float) -> np.ndarray:
    """Norm-Sub: ``max(x - delta, 0)`` summing to ``total`` (the Euclidean
    projection onto the scaled simplex, :func:`project` with equal weights)."""
    return project(x, total)


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
