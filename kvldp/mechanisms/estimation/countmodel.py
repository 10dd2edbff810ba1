"""The count model behind a mechanism's estimates: what post-processing needs
to know about the noise besides the estimates themselves.

Every single-round key-value mechanism here reduces key ``k``'s reports to
counts ``C[:, k]`` over ``c`` symbols (PCKV, KS-UE: ``+1``, ``-1``, 0 at
position ``k``; KVUE: the three states; PrivKV's LPP: ``<1,+1>``,
``<1,-1>``, ``<0,0>``; …). Given the key's frequency ``f`` and mean ``m``
they are, to first order, ``Multinomial(M_k, pi(f, m))`` with the mixture

    pi(f, m) = s (1+m)/2 h+ + s (1-m)/2 h- + (1 - s) h0,   s = f / l,

``h+``/``h-`` the symbol distribution of a report about a pair the user
holds with discretised value ``+1``/``-1``, ``h0`` that of any other report,
``M_k`` the reports that can land on key ``k`` (``n`` for PCKV and KS-UE, the
users who sampled ``k`` for PrivKV, KVUE, F2M) and ``l`` the padding length
(a holder samples its pair with probability ``1/l``). The paper's estimators
are functions of the counts (``frequency_of``, ``mean_of``).

For the mechanisms whose frequency estimator counts one group of symbols
(``present``: PCKV's non-zero entries, PrivKV's key bit 1, KVUE's held
states, F2M's key bit 1) the model factorises exactly:

    S_k = sum_{i in present} C_ik ~ Binomial(M_k, P(f)),     P(f) linear in f,
    C_plus,k | S_k ~ Binomial(S_k, rho(f, m)),                rho = pi_plus / P,

(``plus``: the symbol of a present report with value ``+1``). The first
carries all the information about ``f``, the second (given ``f``) about
``m`` -- and, for PrivKV, the fake values of non-holders, so its biased mean
is modelled, not ignored (Ye et al. Theorem 5.3). ``frequency_loglik`` and
``split_loglik`` are these exact log-likelihoods, the input of empirical
Bayes (``empirical_bayes.py``) and of the likelihood-ratio intervals
(``intervals.py``).

``variance`` (delta method, ``variance.py``) and ``sample`` (fresh counts
and the paper's estimates on them: a parametric bootstrap) serve the
mechanisms without that structure and the tests.

Ignored: the weak dependence between keys (a report lands on one key, so
two keys' counts are slightly negatively correlated; PCKV-UE's positions
are independent given the sampled key) and, for users holding more than
``l`` pairs, that the estimand is ``l E[1{k in S}/|S|]`` rather than ``f``
(the model describes what the estimator estimates).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
from collections.abc import Callable

import numpy as np

from kvldp.mechanisms import special
from kvldp.mechanisms.estimation.variance import mixture, multinomial_delta_variance


def _symbols(x, d: int) -> np.ndarray:
    """A symbol distribution as ``(c, d)``: one column per key (one shared
    column, a read-only broadcast view, when every key has the same: a copy
    per key was 72 MB of a PCKV model at d = 10^6)."""
    x = np.asarray(x, dtype=np.float64)
    return np.broadcast_to(x[:, None], (len(x), d)) if x.ndim == 1 else x


def binomial_loglik(successes, trials, probability, constant: bool = True) -> np.ndarray:
    """``log Binomial(successes; trials, probability)`` (broadcast), with
    ``0 log 0 = 0`` and ``-inf`` where the probability rules the count out;
    ``constant=False`` drops ``log(trials choose successes)``, which does
    not depend on the probability."""
    s, t = np.asarray(successes, dtype=np.float64), np.asarray(trials, dtype=np.float64)
    p = np.clip(np.asarray(probability, dtype=np.float64), 0.0, 1.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(s > 0, s * np.log(p), 0.0) + np.where(t - s > 0, (t - s) * np.log1p(-p), 0.0)
        if constant:
            out = out + special.gammaln(t + 1) - special.gammaln(s + 1) - special.gammaln(t - s + 1)
    return np.where(np.isnan(out), -np.inf, out)


def binomial_loglik_rows(successes, trials, probability) -> np.ndarray:
    """``binomial_loglik(s[:, None, ...], t[:, None, ...], probability[None],
    constant=False)`` -- one row of counts per key against one table of
    probabilities that every key shares -- bit for bit, with the logarithms
    taken once per table cell instead of per key and cell, and no temporary
    of the output's size but one: the posterior means of a large domain
    (Book-Crossing: 45,000 distinct keys x ~400 x 101 cells) spent half
    their time in this function's passes over memory."""
    s = np.asarray(successes, dtype=np.float64)
    c = np.asarray(trials, dtype=np.float64) - s
    p = np.clip(np.asarray(probability, dtype=np.float64), 0.0, 1.0)
    rows = (-1,) + (1,) * p.ndim
    with np.errstate(divide="ignore", invalid="ignore"):
        log_p, log_q = np.log(p), np.log1p(-p)
        out = s.reshape(rows) * log_p
        out[~(s > 0)] = 0.0                 # 0 log 0 = 0, as binomial_loglik's where
        other = c.reshape(rows) * log_q
        other[~(c > 0)] = 0.0
    out += other
    del other
    # a NaN cell (a probability of 0/0) is -inf wherever a count meets it, as binomial_loglik's isnan
    nan = np.isnan(p).ravel()
    if nan.any():
        flat = out.reshape(len(s), -1)
        flat[np.ix_(np.flatnonzero((s > 0) | (c > 0)), np.flatnonzero(nan))] = -np.inf
    return out


_DISTRIBUTIONS = ("holder_plus", "holder_minus", "non_holder")


@dataclasses.dataclass(frozen=True, eq=False)
class CountModel:
    """Per-key multinomial model of a mechanism's report counts (module doc).

    ``counts``: the observed ``(c, d)`` symbol counts (their column sums are
    ``M_k``); ``holder_plus``/``holder_minus``/``non_holder``: symbol
    distributions, ``(c,)`` or ``(c, d)``; ``frequency_of``/``mean_of``: the
    paper's raw (unclipped) estimators on a ``(c, K)`` stack of counts (any
    number ``K`` of columns, each column's total its ``M``); ``padding``:
    ``l``; ``present``/``plus``: the symbol indices of the factorisation
    (``None``: the mechanism does not factorise); ``total``/``total_variance``:
    the estimated number of pairs per user that the frequencies add up to and
    its variance (default: the sum of the raw frequencies; given, it is
    ``independent_total``, information the keys' counts do not hold)."""

    counts: np.ndarray
    holder_plus: np.ndarray
    holder_minus: np.ndarray
    non_holder: np.ndarray
    frequency_of: Callable[[np.ndarray], np.ndarray]
    mean_of: Callable[[np.ndarray], np.ndarray]
    padding: int = 1
    present: tuple[int, ...] | None = None
    plus: int | None = None
    total: float | None = None
    total_variance: float | None = None
    later_rounds: tuple = ()
    fake: np.ndarray | None = None      # the non-holders' fake value per key it was built from (PrivKVM's rounds)
    independent_total: bool = dataclasses.field(init=False, default=False)

    # A distribution every key shares pickles as its one column (a pickled
    # broadcast view would be the whole (c, d) copy again, between every stage).
    def __getstate__(self):
        state = dict(self.__dict__)
        for name in _DISTRIBUTIONS:
            dist = state[name]
            if dist.ndim == 2 and dist.strides[1] == 0:
                state[name] = np.ascontiguousarray(dist[:, 0])
        return state

    def __setstate__(self, state):
        d = state["counts"].shape[1]
        for name in _DISTRIBUTIONS:
            state[name] = _symbols(state[name], d)
        self.__dict__.update(state)

    def __post_init__(self):
        counts = np.asarray(self.counts, dtype=np.float64)
        if counts.ndim != 2:
            raise ValueError("counts must be (symbols, keys)")
        object.__setattr__(self, "counts", counts)
        d = counts.shape[1]
        for name in _DISTRIBUTIONS:
            object.__setattr__(self, name, _symbols(getattr(self, name), d))
            dist = getattr(self, name)
            if dist.shape != counts.shape or not np.allclose(dist.sum(axis=0), 1.0):
                raise ValueError(f"{name} must be a distribution over the {counts.shape[0]} symbols of every key")
        if self.present is not None:
            present = tuple(int(i) for i in self.present)
            object.__setattr__(self, "present", present)
            if self.plus not in present:
                raise ValueError("plus must be one of the present symbols")
            if not np.allclose(self.holder_plus[list(present)].sum(axis=0),
                               self.holder_minus[list(present)].sum(axis=0)):
                raise ValueError("a holder's chance of a present symbol must not depend on its value")
        # a total given by the mechanism measures what the keys' counts do not
        object.__setattr__(self, "independent_total", self.total is not None)
        if self.total is None:
            x = self.raw_frequency
            ok = self.totals > 0
            var = self.frequency_variance(np.clip(np.nan_to_num(x), 0.0, 1.0))
            object.__setattr__(self, "total", float(np.sum(x[ok])))
            object.__setattr__(self, "total_variance", float(np.sum(var[ok])))

    # -- shape ----------------------------------------------------------------
    @property
    def d(self) -> int:
        return self.counts.shape[1]

    @property
    def symbols(self) -> int:
        return self.counts.shape[0]

    @property
    def totals(self) -> np.ndarray:
        """``M_k``: the reports that can land on each key."""
        return self.counts.sum(axis=0)

    @property
    def factorises(self) -> bool:
        return self.present is not None

    @property
    def raw_frequency(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(self.totals > 0, self.frequency_of(self.counts), np.nan)

    # -- the mixture --------------------------------------------------------------
    def probabilities(self, f, m, keys=None) -> np.ndarray:
        """``pi_k(f, m)``, shape ``(c,) + f.shape``; ``f``, ``m`` of shape
        ``(K,)`` or ``(K, J…)`` (values per key) for the ``K`` keys ``keys``
        (indices; default every key), clipped into ``[0, 1]`` and ``[-1, 1]``."""
        f = np.clip(np.nan_to_num(np.asarray(f, dtype=np.float64)), 0.0, 1.0)
        m = np.clip(np.nan_to_num(np.asarray(m, dtype=np.float64)), -1.0, 1.0)
        f, m = np.broadcast_arrays(f, m)
        dists = (self.holder_plus, self.holder_minus, self.non_holder)
        if keys is not None:
            dists = tuple(x[:, keys] for x in dists)
        if f.shape[0] != dists[0].shape[1]:
            raise ValueError(f"parameters for {f.shape[0]} keys, the model has {dists[0].shape[1]}")
        extra = (1,) * (f.ndim - 1)
        hp, hm, h0 = (x.reshape(x.shape + extra) for x in dists)
        return mixture(hp, hm, h0, f, m, self.padding)

    def expected(self, f, m) -> np.ndarray:
        """Expected counts ``M_k pi_k(f, m)``."""
        pi = self.probabilities(f, m)
        return pi * self.totals.reshape((self.d,) + (1,) * (pi.ndim - 2))

    def _flat(self, fn, f, m):
        """A stack function at the expected counts of every (key, value)."""
        pi = self.probabilities(f, m)
        shape = pi.shape[1:]
        counts = self.expected(f, m).reshape(self.symbols, -1)
        return fn(counts, pi.reshape(self.symbols, -1)).reshape(shape)

    def variance(self, f, m):
        """``(Var f_hat, Var m_hat)`` of the raw estimators at true ``(f, m)``
        (delta method over the multinomial); NaN where ``M_k = 0``."""
        return self.frequency_variance(f), self.mean_variance(f, m)

    def frequency_variance(self, f) -> np.ndarray:
        """``Var f_hat`` at true ``f`` (a holder's report is as likely to
        count for the frequency with either value, so ``m`` does not enter)."""
        f = np.asarray(f, dtype=np.float64)
        return self._flat(lambda c, p: multinomial_delta_variance(self.frequency_of, c, p), f, np.zeros_like(f))

    def mean_variance(self, f, m) -> np.ndarray:
        return self._flat(lambda c, p: multinomial_delta_variance(self.mean_of, c, p), f, m)

    def mean_response(self, f, m) -> np.ndarray:
        """The mean estimator at the expected counts: ``m`` for an unbiased or
        consistent estimator, the attenuated mean for PrivKV's."""
        with np.errstate(divide="ignore", invalid="ignore"):
            return self._flat(lambda c, p: self.mean_of(c), f, m)

    # -- the factorised likelihood --------------------------------------------------
    def _require_factorised(self):
        if not self.factorises:
            raise ValueError("this count model does not factorise into a key count and a value split")

    @property
    def present_counts(self) -> np.ndarray:
        """``S_k``: the reports that count for the frequency."""
        self._require_factorised()
        return self.counts[list(self.present)].sum(axis=0)

    @property
    def plus_counts(self) -> np.ndarray:
        self._require_factorised()
        return self.counts[self.plus]

    def present_probability(self, f) -> np.ndarray:
        """``P(f)``: the chance that one of the ``M_k`` reports is present, per
        key (``f`` of shape ``(d,)`` or ``(d, J)``)."""
        self._require_factorised()
        f = np.asarray(f, dtype=np.float64)
        return self.probabilities(f, np.zeros_like(f))[list(self.present)].sum(axis=0)

    def plus_share(self, f, m) -> np.ndarray:
        """``rho(f, m)``: the chance that a present report is ``plus``."""
        self._require_factorised()
        pi = self.probabilities(f, m)
        with np.errstate(divide="ignore", invalid="ignore"):
            return pi[self.plus] / pi[list(self.present)].sum(axis=0)

    def frequency_loglik(self, grid, keys=None) -> np.ndarray:
        """``log P(S_k | f = grid_j)`` for ``keys`` (indices; default every
        key), shape ``(len(keys), J)`` (exact binomial)."""
        self._require_factorised()
        keys = np.arange(self.d) if keys is None else np.asarray(keys)
        f = np.broadcast_to(np.asarray(grid, dtype=np.float64), (len(keys), len(grid)))
        P = self.probabilities(f, 0.0, keys)[list(self.present)].sum(axis=0)
        return binomial_loglik(self.present_counts[keys][:, None], self.totals[keys][:, None], P)

    def with_round(self, later: CountModel) -> CountModel:
        """This model with a later round's value counts multiplied into the
        mean's likelihood (``split_loglik``): PrivKVM's rounds ask the same
        users again with the collector's broadcast mean as the non-holders'
        fake value (a per-key ``non_holder``), so each round's split
        ``C_plus | S`` is a binomial in the same ``(f, m)``. The frequency's
        likelihood stays this model's (round 1: PrivKVM's later key bits are
        fair coins)."""
        out = copy.copy(self)
        out.__dict__.pop("shared", None)
        object.__setattr__(out, "later_rounds", (*self.later_rounds, later))
        return out

    @functools.cached_property
    def shared(self) -> bool:
        """Every key has the same symbol distributions (then ``rho`` is one
        function of ``(f, m)`` for all keys); never with later rounds (their
        fake values are per key)."""
        if self.later_rounds:
            return False
        return all(np.allclose(x, x[:, :1]) for x in (self.holder_plus, self.holder_minus, self.non_holder))

    def split_loglik(self, keys, f_grid, m_grid) -> np.ndarray:
        """``log P(C_plus,k | S_k, f_j, m_i)`` for ``keys`` (indices), shape
        ``(len(keys), J_f, J_m)`` (exact binomial, without the constant
        ``log(S_k choose C_plus,k)``)."""
        self._require_factorised()
        keys = np.asarray(keys)
        f_grid, m_grid = np.asarray(f_grid, dtype=np.float64), np.asarray(m_grid, dtype=np.float64)
        f, m = f_grid[None, :, None], m_grid[None, None, :]
        if self.shared:      # one (1, J_f, J_m) table of rho serves every key
            cols = [x[:, :1].reshape(-1, 1, 1, 1) for x in (self.holder_plus, self.holder_minus, self.non_holder)]
        else:
            cols = [x[:, keys].reshape(self.symbols, -1, 1, 1)
                    for x in (self.holder_plus, self.holder_minus, self.non_holder)]
        rho = self._rho_of(mixture(*cols, f, m, self.padding))
        if self.shared:
            return binomial_loglik_rows(self.plus_counts[keys], self.present_counts[keys], rho[0])
        plus = self.plus_counts[keys][:, None, None]
        present = self.present_counts[keys][:, None, None]
        out = binomial_loglik(plus, present, rho, constant=False)
        for later in self.later_rounds:
            out += later.split_loglik(keys, f_grid, m_grid)
        return out

    def _rho_of(self, pi: np.ndarray) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            return pi[self.plus] / pi[list(self.present)].sum(axis=0)

    # -- the parametric bootstrap -----------------------------------------------------
    def sample_counts(self, f, m, rng: np.random.Generator, size: int) -> np.ndarray:
        """``size`` draws of the counts at ``(f, m)`` (the observed ``M_k``),
        shape ``(size, c, d)``."""
        pi = np.clip(self.probabilities(f, m).T, 0.0, None)        # (d, c)
        pi /= pi.sum(axis=1, keepdims=True)
        totals = np.rint(self.totals).astype(np.int64)
        draws = rng.multinomial(totals, pi, size=(size, self.d))   # (size, d, c)
        return np.transpose(draws, (0, 2, 1)).astype(np.float64)

    def sample(self, f, m, rng: np.random.Generator, size: int):
        """``(f*, m*)``: the paper's raw estimates on ``size`` fresh draws of
        the counts at ``(f, m)``, each ``(size, d)``."""
        counts = self.sample_counts(f, m, rng, size)
        flat = np.transpose(counts, (1, 0, 2)).reshape(self.symbols, -1)
        with np.errstate(divide="ignore", invalid="ignore"):
            return (self.frequency_of(flat).reshape(size, self.d), self.mean_of(flat).reshape(size, self.d))
