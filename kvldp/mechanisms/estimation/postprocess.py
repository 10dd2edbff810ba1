"""Post-processing of calibrated estimates: beyond the papers' estimators.

The papers' estimators are unbiased, but at small epsilon and large domains
most of their error is noise that the other keys can remove. A
post-processing is a function of the collector's output only, so it costs
no privacy. ``PostProcess`` names one, ``FREQ[+shrink]``:

* frequency (``FREQ``):
  ``raw`` -- the paper's estimate as the mechanism clips it;
  ``norm-sub``, ``project``, ``base-cut`` -- Wang et al.'s consistency
  methods (NDSS 2020, ``consistency.py``) towards ``T``, the estimated
  number of pairs per user (``CountModel.total``: for PCKV and KS-UE from the
  dummy keys of padding-and-sampling, else the sum of the raw estimates);
  ``eb`` -- empirical Bayes (``empirical_bayes.py``): the posterior mean
  under a log-spline prior fitted to all keys, with the exact binomial
  likelihood of each key's count (``countmodel.py``) and, for PCKV and
  KS-UE, the total their dummy keys measure as an observation of the
  prior's mean;
* ``shrink`` -- means by empirical Bayes shrinkage towards the pooled mean:
  a normal prior ``N(mu, tau^2)`` on ``[-1, 1]`` whose centre and spread
  are integrated over their posterior given all keys
  (``empirical_bayes.hierarchical_normal_posterior``), each key's
  likelihood the exact binomial of its value split given its frequency,
  integrated over that frequency's posterior. A key weighs in by the
  precision of its own reports (James–Stein / Efron–Morris). PrivKV's
  biased mean is modelled (the fake values are in the likelihood), so it is
  corrected as it is shrunk.

An empirical Bayes estimate is pulled towards the other keys, so it may lie outside
its interval (below), which is from the key's own reports (docs/postprocessing.md).

The default, ``auto``, moves each estimate from the paper's towards
``eb``'s (frequency) and ``shrink``'s (unbiased means) by a limit chosen by
estimates of the risk over all keys and over the top keys (``risk.py``, issue
43: ``eb+shrink`` made the top 50 worse at eps 4), then Norm-Sub where its frequencies sum to far
more than the total (``risk.keep_total``); a candidate set's estimates stay the paper's.

Every post-processed output carries 95 % intervals ``frequency_lo/hi``,
``mean_lo/hi`` that do not depend on the post-processing: the
likelihood-ratio intervals of ``intervals.py`` from each key's own reports,
honest for every key. A mean whose interval would be all of ``[-1, 1]``
has a null interval and status ``uninformative``. ``raw`` reproduces the
mechanism's output field for field and adds the paper's ``raw ± 1.96 s.e.``
as its interval.

Mechanisms without a factorising count model (multi-round protocols, KVOH,
IOH) fall back to a normal likelihood with the estimates' own standard
errors (frequencies) and the closed-form James–Stein shrinkage (unbiased
means); their intervals are the paper's ``raw ± 1.96 s.e.`` (PrivKVM's
rounds have a model: ``CountModel.with_round``). Every estimate stays as it
is when fewer than ``MIN_KEYS`` keys are estimated (IOH's few chosen keys).
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from kvldp.mechanisms.base import (
    STATUS_BIASED,
    STATUS_FREQUENCY_NOT_POSITIVE,
    STATUS_NOT_CANDIDATE,
    STATUS_OK,
    STATUS_UNINFORMATIVE,
    Estimates,
)
from kvldp.mechanisms.estimation import consistency, empirical_bayes, risk, truncation
from kvldp.mechanisms.estimation.countmodel import CountModel
from kvldp.mechanisms.estimation.empirical_bayes import fit_sample
from kvldp.mechanisms.estimation.intervals import LEVEL, frequency_intervals, grid_intervals, wald_intervals

RAW = "raw"
NORM_SUB = "norm-sub"
PROJECT = "project"
BASE_CUT = "base-cut"
EB = "eb"
SHRINK = "shrink"
AUTO = "auto"
FREQUENCY_METHODS = (RAW, NORM_SUB, PROJECT, BASE_CUT, EB, AUTO)
MEAN_METHODS = (RAW, SHRINK, AUTO)

MEAN_GRID = np.linspace(-1.0, 1.0, 101)
MAX_LINEAR_GRID = 300      # frequency grid: points of its linear part (steps of a quarter s.d.)
GEOMETRIC_GRID = 150       # … and of its geometric part from 1/n (resolves tiny frequencies)
ROW_CELLS = 4_000_000      # keys x grid cells per block of a likelihood (32 MB of float64)
MIN_KEYS = 10              # fewer estimated keys: too few to fit a prior to, the estimates stay as they are
CARRIER_MIN_CV = 0.1       # the frequency prior's carrier: coefficient of variation at least this (never a point mass)


@dataclasses.dataclass(frozen=True)
class PostProcess:
    """A post-processing: a frequency method and a mean method (module doc)."""

    frequency: str = RAW
    mean: str = RAW

    def __post_init__(self):
        if self.frequency not in FREQUENCY_METHODS:
            raise ValueError(f"unknown frequency post-processing {self.frequency!r}; known: {FREQUENCY_METHODS}")
        if self.mean not in MEAN_METHODS:
            raise ValueError(f"unknown mean post-processing {self.mean!r}; known: {MEAN_METHODS}")

    @classmethod
    def parse(cls, text: str) -> PostProcess:
        """``raw``, ``norm-sub``, ``shrink``, ``eb+shrink``, ``norm-sub+shrink``, ``auto``, …"""
        if str(text).strip().lower() == AUTO:
            return cls(AUTO, AUTO)
        parts = [p.strip() for p in str(text).lower().split("+") if p.strip()]
        freq = [p for p in parts if p != SHRINK]
        if (not parts or len(parts) > 2 or len(set(parts)) != len(parts) or len(freq) > 1 or AUTO in parts
                or (freq and freq[0] not in FREQUENCY_METHODS) or (RAW in parts and len(parts) > 1)):
            raise ValueError(f"a post-processing is FREQ[+shrink] (FREQ one of {', '.join(FREQUENCY_METHODS)}), "
                             f"got {text!r}")
        return cls(freq[0] if freq else RAW, SHRINK if SHRINK in parts else RAW)

    @property
    def name(self) -> str:
        if (self.frequency, self.mean) == (AUTO, AUTO):
            return AUTO
        if self.mean == RAW:
            return self.frequency
        return SHRINK if self.frequency == RAW else f"{self.frequency}+{self.mean}"

    @property
    def is_raw(self) -> bool:
        return self.frequency == RAW and self.mean == RAW

    def __str__(self) -> str:
        return self.name


DEFAULT = PostProcess(AUTO, AUTO)
CHOICES = (AUTO, RAW, NORM_SUB, PROJECT, BASE_CUT, EB, SHRINK, f"{NORM_SUB}+{SHRINK}", f"{PROJECT}+{SHRINK}",
           f"{BASE_CUT}+{SHRINK}", f"{EB}+{SHRINK}")


def parse(text) -> PostProcess:
    return text if isinstance(text, PostProcess) else PostProcess.parse(text)


def postprocess(est: Estimates, spec=DEFAULT, level: float = LEVEL) -> Estimates:
    """``est`` post-processed by ``spec`` (a ``PostProcess`` or its name),
    with intervals (module doc). ``raw`` changes no field of ``est``."""
    return postprocess_all(est, [spec], level)[0]


def postprocess_all(est: Estimates, specs, level: float = LEVEL) -> list[Estimates]:
    """``est`` post-processed by each of ``specs``; the priors and likelihoods
    are fitted once for all of them."""
    specs = [parse(s) for s in specs]
    model = est.count_model if isinstance(est.count_model, CountModel) and est.count_model.factorises else None
    estimated = est.frequency_status == STATUS_OK
    fit = _Fit(est, model, estimated, level) if estimated.sum() >= MIN_KEYS else None
    # the choices are made on the scale of the kept mass (SURE and the posterior losses are equivariant
    # under the correction's scaling), which is undone last
    return [truncation.corrected(_with_wald(est, spec if fit is not None else PostProcess(), level)
                                 if spec.is_raw or fit is None else _apply(est, spec, fit)) for spec in specs]


def _apply(est: Estimates, spec: PostProcess, fit: _Fit) -> Estimates:
    estimated = fit.ok
    frequency = fit.frequency(spec.frequency)
    mean, mean_status = (fit.shrunk_mean(spec.mean == AUTO) if spec.mean != RAW
                         else (est.mean, est.mean_status.copy()))
    f_lo, f_hi = fit.frequency_intervals()
    m_lo, m_hi = fit.mean_intervals()
    mean_status = np.asarray(mean_status, dtype=object).copy()
    gave_interval = np.isfinite(m_lo) & np.isfinite(m_hi)
    vacuous = gave_interval & (m_lo <= -1.0) & (m_hi >= 1.0)
    has_mean = np.isfinite(mean)
    mean_status[has_mean & vacuous & (mean_status == STATUS_OK)] = STATUS_UNINFORMATIVE
    m_lo, m_hi = np.where(vacuous | ~has_mean, np.nan, m_lo), np.where(vacuous | ~has_mean, np.nan, m_hi)
    return dataclasses.replace(est, frequency=np.where(estimated, frequency, est.frequency), mean=mean,
                               mean_status=mean_status, frequency_lo=f_lo, frequency_hi=f_hi, mean_lo=m_lo,
                               mean_hi=m_hi, postprocess=spec.name)


def _with_wald(est: Estimates, spec: PostProcess, level: float) -> Estimates:
    """The estimates as they are, with the paper's intervals ``raw ± z s.e.``."""
    f_lo, f_hi = wald_intervals(est.frequency_raw, est.frequency_se, 0.0, 1.0, level)
    m_lo, m_hi = wald_intervals(est.mean_raw, est.mean_se, -1.0, 1.0, level)
    f_null, m_null = ~np.isfinite(est.frequency), ~np.isfinite(est.mean) | ~np.isfinite(est.mean_se)
    return dataclasses.replace(est, frequency_lo=np.where(f_null, np.nan, f_lo),
                               frequency_hi=np.where(f_null, np.nan, f_hi), mean_lo=np.where(m_null, np.nan, m_lo),
                               mean_hi=np.where(m_null, np.nan, m_hi), postprocess=spec.name)


class _Fit:
    """The fitted priors and posteriors of one ``Estimates``, computed on
    demand. Memory does not grow with ``d`` beyond a few arrays of length
    ``d``: the priors are fitted to at most ``MAX_FIT_KEYS`` keys
    (:func:`fit_sample`) and every per-key posterior is computed for
    ``ROW_CELLS`` grid cells' worth of keys at a time."""

    def __init__(self, est: Estimates, model: CountModel | None, estimated: np.ndarray, level: float):
        self.est, self.model, self.ok, self.level = est, model, estimated, level
        self._grid = self._prior = self._f_mean = self._means = self._f_int = None
        self.frequency_choice = self.mean_choice = None

    @functools.cached_property
    def candidates_only(self) -> bool:
        """Only a candidate set is estimated (KS-Adap): ``auto`` keeps the paper's (``risk.py``)."""
        return bool(np.any(self.est.frequency_status == STATUS_NOT_CANDIDATE))

    # -- frequencies ------------------------------------------------------------
    def raw(self) -> np.ndarray:
        return np.where(self.ok, np.nan_to_num(self.est.frequency_raw), 0.0)

    @property
    def limits(self) -> tuple:
        return risk.LIMITS if self.model is not None else risk.MODEL_FREE_LIMITS

    @property
    def margin(self) -> float:
        return risk.TOP_MARGIN if self.model is not None else risk.MODEL_FREE_TOP_MARGIN

    @functools.cached_property
    def top_draws(self):
        """``risk.fit_draws``: the top keys' posterior draws, once per fit."""
        return risk.fit_draws(self)

    @property
    def eb(self) -> np.ndarray:
        """The keys empirical Bayes and Base-Cut can use: every estimated key
        with a count model, else those with a positive standard error."""
        if self.model is not None:
            return self.ok
        se = np.asarray(self.est.frequency_se, dtype=np.float64)
        return self.ok & np.isfinite(se) & (se > 0)

    @property
    def upper(self) -> float:
        """A key's frequency at most on the kept mass's scale: ``kappa``, which the truncation
        correction divides by before it cuts at 1 (a consistency step blind to it lost mass there)."""
        return min(1.0, float(self.est.kept_share))

    def total(self) -> float:
        """The total the reports measure (``consistency.measured_total``), at least 0."""
        return max(consistency.measured_total(self.est)[0], 0.0)

    def sd_at_zero(self) -> np.ndarray:
        if self.model is not None:
            return np.sqrt(self.model.frequency_variance(np.zeros(self.est.d)))
        return np.asarray(self.est.frequency_se, dtype=np.float64)

    def frequency(self, method: str) -> np.ndarray:
        ok, eb, x = self.ok, self.eb, self.raw()
        out = np.array(self.est.frequency, dtype=np.float64)
        if method == RAW:
            return out
        if method == NORM_SUB:
            out[ok] = consistency.norm_sub(x[ok], self.total(), self.upper)
        elif method == PROJECT:
            se = np.asarray(self.est.frequency_se, dtype=np.float64)[ok]
            weights = 1.0 / se ** 2 if np.all(np.isfinite(se) & (se > 0)) else None
            out[ok] = consistency.project(x[ok], self.total(), weights, self.upper)
        elif eb.sum() >= MIN_KEYS:
            if method == BASE_CUT:
                out[eb] = consistency.base_cut(x[eb], self.sd_at_zero()[eb])
            elif method == AUTO and not self.candidates_only:
                se = np.asarray(self.est.frequency_se, dtype=np.float64)[eb]
                total, top = risk.fit_total(self, out, eb), risk.fit_top_keys(self, np.flatnonzero(eb))
                out[eb], self.frequency_choice = risk.choose_limit(
                    x[eb], se ** 2, self.frequency_posterior_mean(), self.frequency_posterior_var(), 0.0, 1.0,
                    top, clipped=out[eb], total=total, limits=self.limits, margin=self.margin)
                out[eb] = risk.keep_total(out[eb], total, top, x[eb], self.sd_at_zero()[eb],
                                          1.0 if self.model is not None else risk.MODEL_FREE_TOP_MARGIN, self.upper)
            elif method != AUTO:
                out[eb] = self.frequency_posterior_mean()
        return out

    def frequency_grid(self) -> np.ndarray:
        if self._grid is None:
            eb, x = self.eb, self.raw()
            sd = self.sd_at_zero()[eb]
            n = max(int(self.est.n_reports), 1)
            hi = float(min(1.0, max(np.max(x[eb]), 0.0) + 5 * np.max(sd)))
            hi = max(hi, 10.0 / n, 4 * np.min(sd))
            step = max(np.min(sd) / 4, hi / MAX_LINEAR_GRID)
            linear = np.arange(0.0, hi + step / 2, step)
            geometric = np.geomspace(1.0 / n, hi, GEOMETRIC_GRID)
            self._grid = np.unique(np.concatenate([[0.0], linear, geometric, [hi]]))
        return self._grid

    def frequency_loglik(self, index: np.ndarray) -> np.ndarray:
        """``log P(reports of k | f = grid_j)`` for the keys ``index``: the
        count model's binomial, else a normal with the key's standard error."""
        grid = self.frequency_grid()
        if self.model is not None:
            return self.model.frequency_loglik(grid, index)
        x = self.raw()[index]
        var = np.asarray(self.est.frequency_se, dtype=np.float64)[index] ** 2
        return -0.5 * (x[:, None] - grid[None, :]) ** 2 / var[:, None]

    def distinct(self, index: np.ndarray, split: bool = False):
        """``(representatives, inverse)``: the keys ``index`` whose
        likelihoods are one function -- a count model whose symbol
        distributions every key shares, and equal counts ``(M_k, S_k)``, with
        ``split`` also ``C_plus,k`` -- computed once (a large sparse domain
        has a few hundred distinct counts among 10^6 keys), else every key."""
        model = self.model
        if model is None or not model.shared or len(index) == 0:
            return index, np.arange(len(index))
        columns = [model.totals[index], model.present_counts[index]] + ([model.plus_counts[index]] if split else [])
        _, first, inverse = np.unique(np.stack(columns, axis=1), axis=0, return_index=True, return_inverse=True)
        return index[first], inverse.ravel()

    def _blocks(self, count: int, width: int):
        """Slices of ``range(count)`` of at most ``ROW_CELLS // width`` rows."""
        rows = max(1, ROW_CELLS // max(width, 1))
        return (slice(start, min(start + rows, count)) for start in range(0, count, rows))

    def frequency_prior(self) -> np.ndarray:
        """The log-spline prior over ``frequency_grid``, fitted to the keys of
        :func:`fit_sample` (all keys of a domain up to ``MAX_FIT_KEYS``),
        each distinct likelihood once, weighted by the keys it stands for."""
        if self._prior is None:
            grid = self.frequency_grid()
            index = np.flatnonzero(self.eb)
            keys, weights = fit_sample(self.raw()[index])
            rep, inverse = self.distinct(index[keys])
            loglik = np.concatenate([self.frequency_loglik(rep[part]) for part in self._blocks(len(rep), len(grid))])
            self._prior = empirical_bayes.fit_log_spline_prior(
                loglik, grid, 1.0 / max(int(self.est.n_reports), 1), carrier=self.frequency_carrier(grid),
                mean=self.mean_constraint(grid), key_weights=np.bincount(inverse, weights, minlength=len(rep)))
        return self._prior

    def frequency_weights(self, index: np.ndarray) -> np.ndarray:
        """Posterior weights over ``frequency_grid`` of the keys ``index``."""
        return empirical_bayes.posterior_weights(self.frequency_loglik(index), self.frequency_prior())

    def frequency_posterior_mean(self) -> np.ndarray:
        """Posterior mean of the frequency of each key of ``eb`` under the fitted prior."""
        return self._frequency_moments()[0]

    def frequency_posterior_var(self) -> np.ndarray:
        """… and its posterior variance."""
        return self._frequency_moments()[1]

    def _frequency_moments(self):
        if self._f_mean is None:
            grid = self.frequency_grid()
            rep, inverse = self.distinct(np.flatnonzero(self.eb))
            out = np.empty((2, len(rep)))
            for part in self._blocks(len(rep), len(grid)):
                out[:, part] = (self.frequency_weights(rep[part]) @ np.stack([grid, grid ** 2], axis=1)).T
            mean = out[0][inverse]
            self._f_mean = mean, np.maximum(out[1][inverse] - mean ** 2, 0.0)
        return self._f_mean

    def mean_constraint(self, grid: np.ndarray) -> empirical_bayes.MeanConstraint | None:
        """The prior's mean as the mechanism's own total measures it (PCKV's
        and KS-UE's dummy keys: the variance of ``l`` keys, not ``d``):
        ``T / d`` with variance ``var(T) / d^2``; ``None`` when the total is
        only the sum of the keys' estimates (no information the fit lacks)."""
        model = self.model
        if model is None or not model.independent_total or not model.total_variance:
            return None
        d = self.est.d
        return empirical_bayes.MeanConstraint(grid, max(float(model.total), 0.0) / d,
                                              float(model.total_variance) / d ** 2)

    def frequency_carrier(self, grid: np.ndarray) -> np.ndarray:
        """The gamma distribution with the frequencies' deconvolved moments:
        mean ``T / d`` (``total``: for PCKV and KS-UE measured by the dummy
        keys, else the sum of the raw estimates; floored at 1 / (n d)),
        variance ``var(x)`` minus the mean noise variance, the moment
        estimates of James–Stein's ``tau^2``, floored at a coefficient of
        variation of ``CARRIER_MIN_CV``. Where the reports cannot resolve the
        prior's shape (a large domain at small epsilon) the fitted prior stays
        near it rather than near the grid's uniform distribution."""
        eb = self.eb
        x = self.raw()[eb]
        # floored at one user of the whole domain: a domain larger than the
        # number of users has most keys held by nobody, a mean below 1 / n
        mean = max(self.total() / self.est.d, 1.0 / (max(int(self.est.n_reports), 1) * self.est.d))
        if self.model is not None:
            noise = float(np.mean(self.model.frequency_variance(np.full(self.est.d, mean))[eb]))
        else:
            noise = float(np.mean(np.asarray(self.est.frequency_se, dtype=np.float64)[eb] ** 2))
        # never a point mass: it is a fixed point of the fit (the gradient
        # vanishes), measured on Clothing (PCKV-UE, eps 2, seed 11: the raw
        # estimates summed to -0.17) as every key's frequency ~1e-10
        return empirical_bayes.gamma_carrier(grid, mean, max(float(np.var(x)) - noise, (CARRIER_MIN_CV * mean) ** 2))

    def frequency_intervals(self):
        if self._f_int is None:
            self._f_int = self._frequency_intervals()
        return self._f_int

    def _frequency_intervals(self):
        if self.model is None:
            lo, hi = wald_intervals(self.est.frequency_raw, self.est.frequency_se, 0.0, 1.0, self.level)
        else:
            lo, hi = frequency_intervals(self.model, self.level)
        return np.where(self.ok, lo, np.nan), np.where(self.ok, hi, np.nan)

    # -- means ------------------------------------------------------------------
    def mean_loglik(self, index: np.ndarray) -> np.ndarray:
        """``log sum_j P(f_j | S_k) P(C_plus,k | S_k, f_j, m_i)``: the
        likelihood of the mean on ``MEAN_GRID`` of the keys ``index``, the
        frequency integrated over its posterior, ``(len(index), J_m)``."""
        grid, prior = self.frequency_grid(), self.frequency_prior()
        live = prior > 1e-12 * prior.max()      # grid points the posterior can reach
        with np.errstate(divide="ignore"):
            log_w = np.log(self.frequency_weights(index)[:, live])
        out = self.model.split_loglik(index, grid[live], MEAN_GRID)
        out += log_w[:, :, None]            # in place: a fresh array, and x + y == y + x bit for bit
        return empirical_bayes.logsumexp(out, axis=1, overwrite=True)

    def _mean_blocks(self, index: np.ndarray):
        """``mean_loglik`` of the keys ``index`` in blocks of ``ROW_CELLS`` cells."""
        prior = self.frequency_prior()
        live = int(np.sum(prior > 1e-12 * prior.max()))
        for part in self._blocks(len(index), live * len(MEAN_GRID)):
            yield self.mean_loglik(index[part])

    def mean_outputs(self):
        """``(shrunk mean, lo, hi)`` of the estimated keys: the hierarchical
        prior fitted to the keys of :func:`fit_sample`, then every key's
        posterior mean and likelihood-ratio interval, a block of distinct
        likelihoods at a time."""
        if self._means is None:
            index = np.flatnonzero(self.ok)
            keys, weights = fit_sample(self.raw()[index])
            rep, inverse = self.distinct(index[keys], split=True)
            hyper = empirical_bayes.normal_hyperposterior(
                self._mean_blocks(rep), MEAN_GRID, key_weights=np.bincount(inverse, weights, minlength=len(rep)))
            rep, inverse = self.distinct(index, split=True)
            post, lo, hi = np.empty((2, len(rep))), np.empty(len(rep)), np.empty(len(rep))
            done = 0
            for block in self._mean_blocks(rep):
                part = slice(done, done + len(block))
                post[:, part] = (empirical_bayes.hierarchical_weights(block, hyper)
                                 @ np.stack([MEAN_GRID, MEAN_GRID ** 2], axis=1)).T
                lo[part], hi[part] = grid_intervals(block, MEAN_GRID, self.level)
                done += len(block)
            mean = post[0][inverse]
            self._means = mean, lo[inverse], hi[inverse], np.maximum(post[1][inverse] - mean ** 2, 0.0)
        return self._means

    def shrunk_mean(self, by_risk: bool = False):
        """``(mean, mean_status)`` after shrinkage; ``by_risk``: each key group
        shrunk as far as its SURE says (``risk.py``) where the paper's mean
        is unbiased, else (biased, or no raw mean) shrunk."""
        est = self.est
        status = est.mean_status.copy()
        if self.model is None:
            return self._shrunk_without_model(status, by_risk)
        shrinkable = self.ok & np.isin(status, (STATUS_OK, STATUS_FREQUENCY_NOT_POSITIVE, STATUS_BIASED))
        mean, var = np.full(est.d, np.nan), np.full(est.d, np.nan)
        outputs = self.mean_outputs()
        mean[self.ok], var[self.ok] = outputs[0], outputs[3]
        if by_risk:
            mean = self._risk_chosen_mean(mean, var, shrinkable & (status == STATUS_OK))
        mean = np.where(shrinkable, mean, est.mean)
        status[shrinkable] = STATUS_OK
        return mean, status

    def _risk_chosen_mean(self, post_mean, post_var, unbiased):
        """``post_mean`` moved towards the paper's mean by the limit
        ``risk.choose_limit`` picks, where the paper's mean is unbiased and
        its s.e. below ``risk.INFORMATIVE_SE`` (a larger one spans [-1, 1]:
        the key's reports do not bound its mean, the normal model behind
        SURE means nothing there, and the posterior mean is kept)."""
        est, out = self.est, np.array(post_mean)
        se_all = np.asarray(est.mean_se, dtype=np.float64)
        with np.errstate(invalid="ignore"):
            informative = se_all < risk.INFORMATIVE_SE
        keys = np.flatnonzero(unbiased & np.isfinite(est.mean_raw) & informative)
        if len(keys) >= MIN_KEYS:
            se = np.asarray(est.mean_se, dtype=np.float64)[keys]
            drawn = self.eb.sum() >= MIN_KEYS
            top = risk.fit_top_keys(self, keys, post_mean[keys], post_var[keys]) if drawn else None
            out[keys], self.mean_choice = risk.choose_limit(
                est.mean_raw[keys], se ** 2, post_mean[keys], post_var[keys], -1.0, 1.0, top, clipped=est.mean[keys],
                limits=risk.MEAN_LIMITS, margin=self.margin)
        return out

    def _shrunk_without_model(self, status, by_risk: bool = False):
        est = self.est
        unbiased = self.ok & (status == STATUS_OK) & np.isfinite(est.mean) & np.isfinite(est.mean_se)
        if unbiased.sum() < MIN_KEYS or (by_risk and self.candidates_only):
            return est.mean, status
        var = np.minimum(np.asarray(est.mean_se, dtype=np.float64) ** 2, 1.0 / 3.0)
        post = empirical_bayes.normal_shrinkage(np.where(unbiased, est.mean, np.nan), np.where(unbiased, var, np.nan))
        shrunk = np.clip(post.mean, -1.0, 1.0)
        if by_risk:
            shrunk = self._risk_chosen_mean(shrunk, post.var, unbiased)
        return np.where(unbiased, shrunk, est.mean), status

    def mean_intervals(self):
        est = self.est
        if self.model is None:
            return wald_intervals(est.mean_raw, est.mean_se, -1.0, 1.0, self.level)
        _, lo_ok, hi_ok, _ = self.mean_outputs()
        lo, hi = np.full(est.d, np.nan), np.full(est.d, np.nan)
        lo[self.ok], hi[self.ok] = lo_ok, hi_ok
        return lo, hi
