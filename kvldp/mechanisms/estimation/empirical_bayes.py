"""Empirical Bayes: every key's estimate borrows strength from all the others.

Model (Robbins 1956; Efron, *Large-Scale Inference*, 2010, ch. 1-2): key
``k``'s reports have likelihood ``l_k(theta) = P(reports of k | theta_k = theta)``
(the count model, ``countmodel.py``), and the true values ``theta_1 … theta_d``
are draws from a prior ``g`` that the ``d`` keys' reports identify
together: ``g`` maximises ``sum_k log sum_j l_k(theta_j) g_j`` over a grid
``theta_1 … theta_J``. Each key's estimate is its posterior mean
``sum_j theta_j l_k(theta_j) g_j / sum_j l_k(theta_j) g_j``, which minimises
the mean squared error over the keys when ``g`` is right: it pulls a key
towards the values other keys have, the more the noisier its own reports.

* :func:`fit_log_spline_prior` -- ``g`` for frequencies: Efron's
  g-modelling, ``log g = Q alpha`` with ``Q`` a cubic B-spline basis (on
  ``log(theta + 1/n)``, so it resolves both a bulk of tiny frequencies and a
  few large ones) plus a point mass at 0, fitted by penalised maximum
  likelihood (``- c0 ||alpha||``; Efron, "Empirical Bayes deconvolution
  estimates", Biometrika 103(1), 2016), around a carrier (a gamma with the
  deconvolved moments) that it stays near where the reports cannot resolve
  the prior's shape. Smooth, unlike the Kiefer–Wolfowitz NPMLE (the same
  likelihood maximised over every distribution on the grid), whose few
  atoms pull precise estimates onto them (measured: 10-15 % worse than the
  paper's estimator at eps = 4 on synthetic GG, where the smooth prior is
  0-3 % better).
* :func:`hierarchical_normal_posterior` -- ``g`` for means: ``N(mu, tau^2)``
  restricted to ``[-1, 1]``: shrinkage towards the pooled mean ``mu``, each
  key weighted by the precision of its own reports (the James–Stein /
  Efron–Morris estimator, JASA 70(350), 1975, with the exact likelihood in
  place of a normal one), ``(mu, tau)`` integrated over their posterior
  rather than fixed at their maximum likelihood values.
* :func:`normal_shrinkage` -- the same in closed form for estimates that
  come with a standard error only (no count model): ``y_k ~ N(theta_k, v_k)``,
  ``theta_k ~ N(mu, tau^2)``, ``mu``/``tau^2`` by the Paule–Mandel equation
  ``sum_k (y_k - mu)^2/(tau^2 + v_k) = K - 1``; posterior mean
  ``mu + tau^2/(tau^2 + v_k) (y_k - mu)`` (Morris, JASA 78(381), 1983).
"""
from __future__ import annotations

import dataclasses

import numpy as np

from kvldp.mechanisms import special

SPLINE_DF = 12            # log-spline prior: degrees of freedom of the B-spline basis
SPLINE_PENALTY = 0.1      # c0 of the penalty c0 ||alpha|| (Efron 2016 §3 uses ~1 for a few hundred cases)


def posterior_weights(loglik: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """``P(theta_k = grid_j | reports of k)`` from ``log l_k(theta_j)`` ``(d, J)``."""
    with np.errstate(divide="ignore"):
        log = loglik + np.log(np.maximum(prior, 0.0))[None, :]
    log -= np.max(log, axis=1, keepdims=True)
    w = np.exp(log)
    return w / w.sum(axis=1, keepdims=True)


def _scaled(loglik: np.ndarray) -> np.ndarray:
    """``l_k(theta_j)`` scaled per key so that its largest value is 1."""
    return np.exp(loglik - np.max(loglik, axis=1, keepdims=True))


def spline_basis(u: np.ndarray, df: int = SPLINE_DF) -> np.ndarray:
    """Cubic B-splines with ``df`` functions over ``[min u, max u]`` (equally
    spaced knots), columns centred and scaled to unit norm (Efron 2016 §2)."""
    u = np.asarray(u, dtype=np.float64)
    lo, hi = float(u.min()), float(u.max())
    if hi <= lo:
        return np.zeros((len(u), 0))
    k = 3
    df = max(int(df), k + 1)
    inner = np.linspace(lo, hi, df - k + 1)[1:-1]
    knots = np.concatenate([[lo] * (k + 1), inner, [hi] * (k + 1)])
    # imported here: scipy.interpolate and scipy.optimize cost every command 0.2 s, and only a fitted prior uses them
    from scipy.interpolate import BSpline
    basis = BSpline.design_matrix(np.clip(u, lo, np.nextafter(hi, lo)), knots, k).toarray()
    basis -= basis.mean(axis=0)
    return basis / (np.sqrt((basis ** 2).sum(axis=0)) + 1e-300)


@dataclasses.dataclass(frozen=True)
class MeanConstraint:
    """An independent estimate of the prior's mean: ``target`` with variance
    ``variance``, at grid values ``values`` (e.g. PCKV's total number of
    pairs per user from its dummy keys, divided by ``d``)."""

    values: np.ndarray
    target: float
    variance: float


def fit_exponential_family_prior(loglik: np.ndarray, basis: np.ndarray, penalty: float = SPLINE_PENALTY,
                                 carrier: np.ndarray | None = None, mean: MeanConstraint | None = None,
                                 key_weights: np.ndarray | None = None) -> np.ndarray:
    """``g_j ∝ carrier_j exp(basis_j alpha)`` maximising ``sum_k log sum_j
    l_kj g_j - penalty ||alpha||`` (L-BFGS; the gradient is
    ``sum_k (w_k. - g) basis`` with ``w_k.`` the posterior weights, Efron
    2016 eq. (3.3)). ``carrier`` (default uniform over the grid points): the
    prior the penalty pulls towards where the reports cannot tell. ``mean``:
    an independent normal observation of ``E_g[theta]``, added to the
    log-likelihood as ``-(E_g[theta] - target)^2 / (2 variance)`` (gradient
    ``Cov_g(theta, basis)``), so a prior the keys' counts hardly tell apart
    from "everything is 0" still adds up to the total the reports measure.
    ``key_weights``: each row's weight in the log-likelihood (a weighted
    sample of a large domain's keys stands for all of them)."""
    L = _scaled(loglik)
    kw = None if key_weights is None else np.asarray(key_weights, dtype=np.float64)
    keys = L.shape[0] if kw is None else float(kw.sum())
    Q = np.asarray(basis, dtype=np.float64)
    with np.errstate(divide="ignore"):
        log_carrier = np.zeros(Q.shape[0]) if carrier is None else np.log(np.asarray(carrier, dtype=np.float64))
    if mean is not None:
        values = np.asarray(mean.values, dtype=np.float64)
        Q = np.hstack([Q, ((values - values.mean()) / (values.std() + 1e-300))[:, None]])   # lets the mean move

    def objective(alpha):
        eta = Q @ alpha + log_carrier
        g = np.exp(eta - eta.max())
        g /= g.sum()
        mix = np.maximum(L @ g, 1e-300)
        w = L * (g / 1.0)[None, :] / mix[:, None]
        if kw is not None:
            w *= kw[:, None]
        norm_a = np.sqrt(alpha @ alpha + 1e-12)
        value = float(np.log(mix).sum() if kw is None else kw @ np.log(mix)) - penalty * norm_a
        grad = (w.sum(axis=0) - keys * g) @ Q - penalty * alpha / norm_a
        if mean is not None:
            gap = float(g @ values) - mean.target
            value -= gap * gap / (2 * mean.variance)
            grad -= gap / mean.variance * (Q.T @ (g * (values - g @ values)))
        return -value, -grad

    from scipy.optimize import minimize  # imported here: see spline_basis
    result = minimize(objective, np.zeros(Q.shape[1]), jac=True, method="L-BFGS-B")
    eta = Q @ result.x + log_carrier
    g = np.exp(eta - eta.max())
    return g / g.sum()


CARRIER_FLOOR = 1e-9       # every grid point keeps this much carrier mass, so the fit can move mass there


def gamma_carrier(grid: np.ndarray, mean: float, var: float) -> np.ndarray:
    """Cell masses of the gamma distribution with ``mean`` and ``var`` on
    ``grid`` (cells between midpoints), floored at ``CARRIER_FLOOR``; a
    point mass at the grid value nearest ``mean`` when ``var`` or ``mean`` is 0."""
    grid = np.asarray(grid, dtype=np.float64)
    if mean <= 0 or var <= 0:
        mass = np.zeros(len(grid))
        mass[np.argmin(np.abs(grid - max(mean, 0.0)))] = 1.0
    else:
        edges = np.concatenate([[0.0], (grid[1:] + grid[:-1]) / 2, [np.inf]])
        cdf = special.gammainc(mean * mean / var, edges / (var / mean))       # the gamma's cdf
        mass = np.diff(cdf)
    mass = np.maximum(mass / mass.sum(), CARRIER_FLOOR)
    return mass / mass.sum()


def fit_log_spline_prior(loglik: np.ndarray, grid: np.ndarray, scale: float, df: int = SPLINE_DF,
                         penalty: float = SPLINE_PENALTY, carrier: np.ndarray | None = None,
                         mean: MeanConstraint | None = None, key_weights: np.ndarray | None = None) -> np.ndarray:
    """Efron's g-modelling prior over ``grid`` (module doc): splines in
    ``log(theta + scale)`` and an indicator of ``theta = 0`` when the grid
    starts at 0, times ``carrier``."""
    grid = np.asarray(grid, dtype=np.float64)
    basis = spline_basis(np.log(grid + scale), df)
    if grid[0] == 0:
        spike = np.zeros((len(grid), 1))
        spike[0, 0] = 1.0
        basis = np.hstack([basis, spike])
    return fit_exponential_family_prior(loglik, basis, penalty, carrier, mean, key_weights)


def truncated_normal_weights(grid: np.ndarray, mu: float, tau: float) -> np.ndarray:
    """``N(mu, tau^2)`` restricted to the grid (at least one point: as
    ``tau -> 0`` the mass goes to the grid point nearest ``mu``)."""
    grid = np.asarray(grid, dtype=np.float64)
    sd = max(tau, 1e-12)
    z = (grid - mu) / sd
    log = -z**2 / 2.0 - np.log(np.sqrt(2 * np.pi)) - np.log(sd)  # as scipy.stats.norm.logpdf
    if not np.isfinite(log).any() or tau <= 1e-12:
        w = np.zeros(len(grid))
        w[np.argmin(np.abs(grid - mu))] = 1.0
        return w
    w = np.exp(log - log.max())
    return w / w.sum()


HYPER_MU = np.linspace(-1.0, 1.0, 41)          # hyperprior grid of the normal prior's centre
HYPER_TAU = np.geomspace(0.01, 1.0, 25)        # … and of its spread


def hierarchical_normal_posterior(loglik: np.ndarray, grid: np.ndarray, mu_grid=HYPER_MU,
                                  tau_grid=HYPER_TAU) -> GridPosterior:
    """Posterior of each key over ``grid`` when ``theta_k ~ N(mu, tau^2)``
    (restricted to the grid) and ``(mu, tau)`` are not fixed at their
    maximum likelihood values but integrated over their posterior under a
    flat hyperprior on ``mu_grid`` x ``log tau_grid`` (hierarchical Bayes,
    Efron & Morris's "empirical Bayes with the prior's uncertainty"). Where
    the keys pin ``(mu, tau)`` down this is the posterior under their maximum likelihood values;
    where they hardly inform it (PrivKV's means at small
    epsilon) a spurious maximum does not decide every key's estimate.
    ``prior`` of the result: the posterior-averaged prior. The two halves,
    for keys in chunks: :func:`normal_hyperposterior` and
    :func:`hierarchical_weights`."""
    hyper = normal_hyperposterior(loglik, grid, mu_grid=mu_grid, tau_grid=tau_grid)
    return GridPosterior(np.asarray(grid, dtype=np.float64), hierarchical_weights(loglik, hyper),
                         hyper.weights @ hyper.priors)


@dataclasses.dataclass(frozen=True, eq=False)
class HyperPosterior:
    """The candidate priors ``(H, J)`` (one per ``(mu, tau)``) and their posterior weights ``(H,)``."""

    priors: np.ndarray
    weights: np.ndarray


def normal_hyperposterior(loglik, grid: np.ndarray, key_weights: np.ndarray | None = None, mu_grid=HYPER_MU,
                          tau_grid=HYPER_TAU, rows: int = 2_000) -> HyperPosterior:
    """The posterior of ``(mu, tau)`` given every key's ``loglik`` over
    ``grid`` (an array ``(d, J)``, or an iterable of row blocks of one),
    each key's log marginal weighted by ``key_weights``; summed ``rows`` keys
    at a time, so memory is ``rows x H`` whatever ``d``."""
    grid = np.asarray(grid, dtype=np.float64)
    priors = np.array([truncated_normal_weights(grid, mu, tau) for mu in mu_grid for tau in tau_grid])  # (H, J)
    blocks = [loglik] if isinstance(loglik, np.ndarray) else loglik
    log_h, done = np.zeros(len(priors)), 0
    for block in blocks:
        for start in range(0, len(block), rows):
            L = _scaled(block[start:start + rows])                  # rows scaled by exp(-max)
            log_mix = np.log(np.maximum(L @ priors.T, 1e-300))     # (rows, H)
            if key_weights is None:
                log_h += log_mix.sum(axis=0)
            else:
                log_h += np.asarray(key_weights[done + start:done + start + len(L)]) @ log_mix
        done += len(block)
    hyper = np.exp(log_h - log_h.max())
    return HyperPosterior(priors, hyper / hyper.sum())


def hierarchical_weights(loglik: np.ndarray, hyper: HyperPosterior) -> np.ndarray:
    """``P(theta_k = grid_j | data) = sum_h hyper_h L_kj prior_hj / mix_kh`` for the rows of ``loglik``."""
    L = _scaled(loglik)
    mix = np.maximum(L @ hyper.priors.T, 1e-300)                 # (rows, H)
    weights = L * ((hyper.weights[None, :] / mix) @ hyper.priors)
    return weights / weights.sum(axis=1, keepdims=True)


@dataclasses.dataclass(frozen=True, eq=False)
class GridPosterior:
    """Posterior of each key over a grid: ``weights[k, j] = P(theta_k = grid[j] | reports)``;
    ``prior``: the fitted ``g``."""

    grid: np.ndarray
    weights: np.ndarray
    prior: np.ndarray

    @property
    def mean(self) -> np.ndarray:
        return self.weights @ self.grid

    @property
    def sd(self) -> np.ndarray:
        return np.sqrt(np.maximum(self.weights @ self.grid ** 2 - self.mean ** 2, 0.0))


@dataclasses.dataclass(frozen=True)
class NormalPosterior:
    """``N(mean, var)`` per key, and the fitted prior ``N(mu, tau2)``."""

    mean: np.ndarray
    var: np.ndarray
    mu: float
    tau2: float


def normal_shrinkage(y, v, tau2_max: float = 1.0) -> NormalPosterior:
    """James–Stein / Morris shrinkage of ``y_k ~ N(theta_k, v_k)`` towards
    the pooled mean (module doc). Keys with a non-finite ``y`` or ``v`` get
    the prior; ``tau2_max`` bounds the search (1: the variance of a value
    in ``[-1, 1]``)."""
    y = np.asarray(y, dtype=np.float64)
    v = np.asarray(v, dtype=np.float64)
    ok = np.isfinite(y) & np.isfinite(v) & (v > 0)
    if ok.sum() < 2:
        raise ValueError("shrinkage needs at least two keys with an estimate and a variance")
    yo, vo = y[ok], v[ok]

    def pooled(t2):
        w = 1.0 / (t2 + vo)
        return float(np.sum(w * yo) / np.sum(w)), w

    def excess(t2):
        mu, w = pooled(t2)
        return float(np.sum(w * (yo - mu) ** 2) - (len(yo) - 1))

    if excess(0.0) <= 0:
        tau2 = 0.0
    elif excess(tau2_max) > 0:
        tau2 = tau2_max
    else:
        lo, hi = 0.0, tau2_max
        for _ in range(80):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if excess(mid) > 0 else (lo, mid)
        tau2 = (lo + hi) / 2
    mu = pooled(tau2)[0]
    shrink = np.where(ok, tau2 / (tau2 + np.where(ok, v, 1.0)), 0.0)
    mean = np.where(ok, mu + shrink * (np.where(ok, y, 0.0) - mu), mu)
    var = np.where(ok, shrink * np.where(ok, v, 0.0), tau2)
    return NormalPosterior(mean, var, mu, tau2)


MAX_FIT_KEYS = 20_000      # keys a prior is fitted to (fit_sample): all of a smaller domain
TOP_FIT_KEYS = 2_000       # … of a larger one, these largest raw estimates and a weighted sample of the rest


def fit_sample(x: np.ndarray, max_keys: int | None = None, top: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The keys a prior is fitted to, as indices into ``x`` (their raw
    estimates), and each one's weight: every key when there are at most
    ``max_keys`` (``MAX_FIT_KEYS``); else the ``top`` (``TOP_FIT_KEYS``)
    largest, weight 1 -- the few large keys a sparse domain's prior must not
    lose -- and a systematic sample of the rest in the order of their
    estimates, each standing for ``rest / sampled`` keys (a stratified
    sample across the estimates' distribution; deterministic, so a rerun
    gives the same estimates). The weighted log-likelihood estimates the
    full one without bias, and ``MAX_FIT_KEYS`` keys pin a prior down far
    more precisely than any one key's reports do."""
    max_keys = MAX_FIT_KEYS if max_keys is None else int(max_keys)
    top = TOP_FIT_KEYS if top is None else int(top)
    count = len(x)
    if count <= max_keys:
        return np.arange(count), np.ones(count)
    order = np.argsort(-np.asarray(x, dtype=np.float64), kind="stable")
    head, rest = order[:top], order[top:]
    sampled = max_keys - top
    pick = rest[np.round(np.linspace(0, len(rest) - 1, sampled)).astype(np.int64)]
    keys = np.concatenate([head, pick])
    weights = np.concatenate([np.ones(top), np.full(sampled, len(rest) / sampled)])
    return keys, weights


def logsumexp(a: np.ndarray, axis: int, overwrite: bool = False) -> np.ndarray:
    """``log sum exp`` along ``axis`` (rows of ``-inf`` give ``-inf``);
    ``overwrite``: ``a`` is a scratch array the exponentials may take (the
    same values, without two temporaries of its size). Not
    ``scipy.special.logsumexp``: scipy 1.17's does extra accuracy work that
    made it 1.9x slower on ``mean_loglik``'s blocks, the post-processing's
    hot path, for differences of 1e-14."""
    top = np.max(a, axis=axis, keepdims=True)
    top = np.where(np.isfinite(top), top, 0.0)
    if overwrite:
        shifted = np.subtract(a, top, out=a)
        np.exp(shifted, out=shifted)
    else:
        shifted = np.exp(a - top)
    with np.errstate(divide="ignore"):
        return np.squeeze(top, axis=axis) + np.log(np.sum(shifted, axis=axis))
