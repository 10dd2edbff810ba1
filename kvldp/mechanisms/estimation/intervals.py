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
  binomial likelihood-ratio interval for ``P`` with the maximum likelihood
  restricted to ``f >= 0``, mapped to ``f`` (exact root-finding). Near the
  boundary ``f = 0`` -- every key of a large domain at small epsilon -- the
  fixed ``chi2_1`` cut would cover 97.5 %, not 95 %: the cut is Feldman and
  Cousins' (Phys. Rev. D 57, 1998), the 95 % quantile of the deviance when
  the truth is ``delta`` standard deviations above the boundary
  (``feldman_cousins_cut``: 2.71 at the boundary, 3.84 far from it), so the
  coverage is 95 % for every ``f``;
* mean: ``C_plus,k | S_k ~ Binomial(S_k, rho(f, m))``, the frequency a
  nuisance integrated over its empirical Bayes posterior (``postprocess.py``):
  the likelihood-ratio interval of ``log sum_j P(f_j | S_k) L_k(f_j, m)``.
  Not the profile ``max_f``: on a large domain the keys with the largest
  noise in ``S_k`` look frequent, the profile takes that frequency at face
  value and the absence of a value signal then pins ``m`` near 0
  (measured on Clothing: 55-75 % coverage for the keys whose profile
  interval was informative); the posterior knows those frequencies are
  mostly noise. For PrivKV's biased mean ``rho`` includes the fake values of
  non-holders, so the interval is about the true mean, not about what the
  biased estimator estimates.

A mean interval that spans all of ``[-1, 1]`` says that the reports hold no
information about the key's mean: ``postprocess.py`` reports it as null
with status ``uninformative`` rather than print a vacuous (100 %) interval.

Without a factorising count model (multi-round protocols, KVOH, IOH) the
interval is the paper's ``raw ± z s.e.`` (Wald), clipped into the range.
"""
from __future__ import annotations

import functools

import numpy as np

from kvldp.mechanisms import special
from kvldp.mechanisms.estimation.countmodel import CountModel, binomial_loglik

LEVEL = 0.95
BISECTIONS = 60
FC_DELTAS = np.linspace(0.0, 8.0, 161)     # distances from the boundary of the Feldman–Cousins table


def critical_deviance(level: float = LEVEL) -> float:
    """``chi2_1(level)``: 3.841 for 95 %."""
    return float(2.0 * special.gammaincinv(0.5, level))        # chi2(1)'s quantile, as scipy.stats.chi2.ppf


def _fc_coverage(delta, cut):
    """``P(deviance <= cut)`` for ``X ~ N(delta, 1)``, ``delta >= 0``, the
    deviance taken at the maximum likelihood restricted to ``>= 0``:
    ``(X - delta)^2`` for ``X >= 0``, ``delta^2 - 2 X delta`` for ``X < 0``
    (vectorised)."""
    delta, cut = np.broadcast_arrays(np.asarray(delta, dtype=np.float64), np.asarray(cut, dtype=np.float64))
    root, ndtr = np.sqrt(cut), special.ndtr
    above = ndtr(root) - ndtr(np.maximum(-root, -delta))
    with np.errstate(divide="ignore", invalid="ignore"):
        below = np.where(delta > 0, np.maximum(0.0, ndtr(-delta) - ndtr(-(delta * delta + cut) / (2 * delta))), 0.5)
    return above + below


@functools.lru_cache(maxsize=8)
def _fc_table(level: float) -> np.ndarray:
    lo, hi = np.zeros(len(FC_DELTAS)), np.full(len(FC_DELTAS), 30.0)
    for _ in range(80):
        mid = (lo + hi) / 2
        short = _fc_coverage(FC_DELTAS, mid) < level
        lo, hi = np.where(short, mid, lo), np.where(short, hi, mid)
    return hi


def feldman_cousins_cut(delta, level: float = LEVEL) -> np.ndarray:
    """The deviance cut with coverage ``level`` when the truth lies ``delta``
    standard deviations above a boundary (Feldman & Cousins 1998, normal
    case): ``chi2_1`` at ``2 level - 1`` (2.71 for 95 %) on the boundary,
    ``chi2_1(level)`` (3.84) far from it."""
    return np.interp(np.asarray(delta, dtype=np.float64), FC_DELTAS, _fc_table(float(level)))


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
    Mk = np.where(ok, M, 1.0)

    def excess(p):
        """Deviance minus the Feldman–Cousins cut at ``p`` (<= 0: inside)."""
        delta = (p - p0) / np.sqrt(np.maximum(p * (1 - p), 1e-300) / Mk)
        return 2 * (best - binomial_loglik(S, M, p, constant=False)) - feldman_cousins_cut(delta, level)

    # P is increasing in f (a holder reports "present" more often than a non-holder)
    low_p = np.where(excess(p0) <= 0, p0, _bisect(excess, p0, phat, 0.0, inside_at_lo=False))
    high_p = np.where(excess(p1) <= 0, p1, _bisect(excess, phat, p1, 0.0, inside_at_lo=True))
    slope = p1 - p0
    with np.errstate(divide="ignore", invalid="ignore"):
        lo, hi = (low_p - p0) / slope, (high_p - p0) / slope
    lo, hi = np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)
    return np.where(ok, lo, np.nan), np.where(ok, hi, np.nan)


def grid_intervals(loglik: np.ndarray, m_grid: np.ndarray, level: float = LEVEL):
    """``(lo, hi)`` per key from a log-likelihood ``(d, J_m)`` over
    ``m_grid``: where the deviance ``2 (max - loglik)`` crosses
    ``chi2_1(level)``, interpolated linearly between the grid values on
    either side of the crossing (the hull of the values inside when the
    deviance dips below the cut more than once); the grid's ends where it
    does not cross. (No Feldman–Cousins correction at the bounds ``±1``: the
    likelihood of a mean is far from normal where it reaches both, and the
    corrections tried measured 0.86-0.94 coverage; the plain cut is
    conservative there, 0.96-0.98 on synthetic GG.)"""
    m_grid = np.asarray(m_grid, dtype=np.float64)
    dev = 2 * (np.max(loglik, axis=1, keepdims=True) - loglik)
    cut = critical_deviance(level)
    excess = dev - cut
    inside = excess <= 0
    rows = np.arange(len(dev))
    first = np.argmax(inside, axis=1)
    last = len(m_grid) - 1 - np.argmax(inside[:, ::-1], axis=1)

    def crossing(out, inn):
        e_out, e_in = excess[rows, out], excess[rows, inn]
        with np.errstate(divide="ignore", invalid="ignore"):
            t = np.where(np.isfinite(e_out) & (e_out > e_in), e_out / (e_out - e_in), 1.0)
        return m_grid[out] + np.clip(t, 0.0, 1.0) * (m_grid[inn] - m_grid[out])

    lo = np.where(first > 0, crossing(np.maximum(first - 1, 0), first), m_grid[0])
    hi = np.where(last < len(m_grid) - 1, crossing(np.minimum(last + 1, len(m_grid) - 1), last), m_grid[-1])
    return lo, hi


# ``-scipy.special.ndtri((1 - 0.95) / 2)`` bit for bit (tests/test_intervals.py checks): the default level's z,
# so that raw estimates' Wald intervals -- every run's, ``--postprocess raw`` included -- do not
# import scipy.special (0.27 s of a fresh process) for one number
_WALD_Z = {0.95: 1.959963984540054}


def wald_z(level: float = LEVEL) -> float:
    """The two-sided normal quantile ``z`` of ``level`` (``-ndtri((1 - level)/2)``)."""
    z = _WALD_Z.get(level)
    return z if z is not None else float(-special.ndtri((1 - level) / 2))


def wald_intervals(raw, se, low: float, high: float, level: float = LEVEL):
    """The paper's ``raw ± z s.e.``, clipped into ``[low, high]`` (NaN where
    either is null)."""
    z = wald_z(level)
    raw, se = np.asarray(raw, dtype=np.float64), np.asarray(se, dtype=np.float64)
    return np.clip(raw - z * se, low, high), np.clip(raw + z * se, low, high)
