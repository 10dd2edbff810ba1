"""Confidence intervals for each key's true frequency and mean that stay
honest whatever post-processing did to the point estimate.

Post-processing (``postprocess.py``) trades a little bias for a lot of
variance: an empirical Bayes estimate is pulled towards the other keys, a
Norm-Sub estimate shifted or cut to 0. The paper's ``estimate ± 1.96 s.e.``
around such an estimate covers the truth less often than it says. The
intervals here do not depend on the post-processing at all: they are the
keys' likelihood-ratio (Wilks) intervals under the count model
(``countmodel.py``), from each key's own reports,

    {theta : 2 [max log L_k - log L_k(theta)] <= chi2_1(level)},

so they cover each key's truth at the nominal rate (asymptotically, for
every key: no average over keys, no assumption about the prior), whatever
estimate is printed next to them. Like a score (Wilson) interval and unlike
``estimate ± 1.96 s.e.`` they use the variance at each candidate value, not
at the estimate, and respect the parameter space, so they stay honest near
``f = 0`` and for the sparse keys of a large domain.

* frequency: ``S_k ~ Binomial(M_k, P(f))``, ``P`` affine in ``f``: the
  binomial likelihood-ratio interval for ``P`` restricted to
  ``[P(0), P(1)]``, mapped to ``f`` (exact root-finding);
* mean: ``C_plus,k | S_k ~ Binomial(S_k, rho(f, m))``, the frequency a
  nuisance: the profile likelihood-ratio interval
  ``max_f log L_k(f, m)`` over grids of ``f`` and ``m``. For PrivKV's biased
  mean ``rho`` includes the fake values of non-holders, so the interval is
  about the true mean, not about what the biased estimator estimates.

A mean interval that spans all of ``[-1, 1]`` says that the reports hold no
information about the key's mean: ``postprocess.py`` reports it as null
with status ``uninformative`` rather than print a vacuous (100 %) interval.

Without a factorising count model (multi-round protocols, KVOH, IOH) the
interval is the paper's ``raw ± z s.e.`` (Wald), clipped into the range.
"""
from __future__ import annotations

import numpy as np
from scipy.stats import chi2, norm

from .countmodel import CountModel, binomial_loglik

LEVEL = 0.95
BISECTIONS = 60


def critical_deviance(level: float = LEVEL) -> float:
    """``chi2_1(level)``: 3.841 for 95 %."""
    return float(chi2.ppf(level, 1))


def _bisect(deviance, lo, hi, target, inside_at_lo: bool):
    """Per element, the point in ``[lo, hi]`` where ``deviance`` crosses
    ``target``; ``inside_at_lo``: the side where it is below ``target``."""
    lo, hi = np.array(lo, dtype=np.float64), np.array(hi, dtype=np.float64)
    for _ in range(BISECTIONS):
        mid = (lo + hi) / 2
        inside = deviance(mid) <= target
        if inside_at_lo:
            lo, hi = np.where(inside, mid, lo), np.where(inside, hi, mid)
        else:
            lo, hi = np.where(inside, lo, mid), np.where(inside, mid, hi)
    return lo if inside_at_lo else hi


def frequency_intervals(model: CountModel, level: float = LEVEL):
    """``(lo, hi)`` per key: the binomial likelihood-ratio interval of ``f``
    (module doc); NaN for keys without reports."""
    S, M = model.present_counts, model.totals
    ok = M > 0
    d = model.d
    p0 = model.present_probability(np.zeros(d))
    p1 = model.present_probability(np.ones(d))
    phat = np.clip(np.where(ok, S / np.where(ok, M, 1.0), 0.0), np.minimum(p0, p1), np.maximum(p0, p1))
    best = binomial_loglik(S, M, phat, constant=False)
    target = critical_deviance(level)

    def deviance(p):
        return 2 * (best - binomial_loglik(S, M, p, constant=False))

    # P is increasing in f (a holder reports "present" more often than a non-holder)
    low_p = np.where(deviance(p0) <= target, p0, _bisect(deviance, p0, phat, target, inside_at_lo=False))
    high_p = np.where(deviance(p1) <= target, p1, _bisect(deviance, phat, p1, target, inside_at_lo=True))
    slope = p1 - p0
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = (low_p - p0) / slope, (high_p - p0) / slope
    lo, hi = np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
    return np.where(ok, lo, np.nan), np.where(ok, hi, np.nan)


def profile_mean_intervals(profile: np.ndarray, m_grid: np.ndarray, level: float = LEVEL):
    """``(lo, hi)`` per key from the profile log-likelihood ``(d, J_m)`` over
    ``m_grid``: the hull of the grid values within ``chi2_1(level)/2`` of the
    maximum, widened by half a grid step on each side (inside ``[-1, 1]``) so
    that the grid's resolution cannot make the interval too short."""
    m_grid = np.asarray(m_grid, dtype=np.float64)
    dev = 2 * (np.max(profile, axis=1, keepdims=True) - profile)
    inside = dev <= critical_deviance(level)
    half = (m_grid[1] - m_grid[0]) / 2 if len(m_grid) > 1 else 0.0
    first = np.argmax(inside, axis=1)
    last = len(m_grid) - 1 - np.argmax(inside[:, ::-1], axis=1)
    lo = np.maximum(m_grid[first] - half, m_grid[0])
    hi = np.minimum(m_grid[last] + half, m_grid[-1])
    return lo, hi


def wald_intervals(raw, se, low: float, high: float, level: float = LEVEL):
    """The paper's ``raw ± z s.e.``, clipped into ``[low, high]`` (NaN where
    either is null)."""
    z = float(norm.isf((1 - level) / 2))
    raw, se = np.asarray(raw, dtype=np.float64), np.asarray(se, dtype=np.float64)
    return np.clip(raw - z * se, low, high), np.clip(raw + z * se, low, high)
