"""PrivKV, PrivKV-A and PrivKVM with virtual iterations (single real round).

Ye, Hu, Meng, Zheng, "PrivKV: Key-Value Data Collection with Local
Differential Privacy", IEEE S&P 2019 (``shared/papers/ye2019-privkv.txt``),
and Sun et al. 2019 §III for PrivKV-A; SPEC.md §1.

Client, LPP(S, eps1, eps2) (Alg. 2-3): draw ``j`` uniformly from ``K``;
a holder of ``<j, v>`` reports ``<1, VPP(v)>`` w.p. ``p1 = e^eps1/(e^eps1+1)``
else ``<0, 0>``; a non-holder reports ``<0, 0>`` w.p. ``p1`` else
``<1, VPP(m~)>``, where ``VPP(v) = Disc(v)`` kept w.p. ``p2 = e^eps2/(e^eps2+1)``.
``m~`` is uniform on ``[-1, 1]`` (PrivKV), the collector's broadcast mean
(PrivKVM rounds >= 2) or 1 (virtual iterations, PrivKVM+). The report is
``(j, s)`` with ``s in {+1, -1}`` for ``<1, ±1>`` and ``s = 0`` for ``<0, 0>``;
privacy ``eps1 + eps2``.

Counts per key: ``M1 = #<1,+1>``, ``M_1 = #<1,-1>``, ``M0 = #<0,0>``, ``M``
their sum (the users who sampled the key, about ``n/d``).

Standard errors. The frequency's is exact for this linear estimator,
``sqrt(f'(1-f')/M)/(2 p1 - 1)``, with ``f' = f p1 + (1-f)(1-p1)`` at the
estimate clipped into ``[0, 1]`` (so never below the key bit's noise floor
``p1 (1-p1)``). PrivKV-A's mean: the delta method over the per-key
multinomial at the LPP model's report distribution for the clipped
``(f, m)`` (``variance.multinomial_delta_variance``).

The means of PrivKV, PrivKVM-VI (and PrivKVM, PrivKVM+) are **biased**:
every key bit of 1 from a non-holder brings a fake value into the mean
(Theorem 5.3: ``E[m] = theta E[m~] + (1 - theta) m``, ``theta`` the share of
non-holders among them), by several of the estimator's own s.d. at
``n = 10^5`` (measured: ``|bias|/sd`` median 2.8-4.6 for PrivKV, coverage of
a correct-spread +-1.96 s.e. interval 0.24-0.38). They carry no standard
error (``mean_status = "biased"``). A mean is null where the estimated
frequency is <= 0 (no holder to average over) or the key had no reports.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from kvldp.mechanisms.base import Estimates, ReportBatch, UserBatch, with_statuses
from kvldp.mechanisms.estimation.countmodel import CountModel
from kvldp.mechanisms.estimation.variance import mixture_probabilities, multinomial_delta_variance
from kvldp.mechanisms.frequency.sampling import discretise, uniform_key_sampling
from kvldp.mechanisms.frequency.symbols import accumulate_symbols, symbol_stack
from kvldp.mechanisms.params import Options, key_share_option, rounds_option
from kvldp.mechanisms.privacy.accountant import Share
from kvldp.mechanisms.protocol import Mechanism

FAKE_UNIFORM = "uniform"


def rr_keep(eps: float) -> float:
    """``e^eps / (e^eps + 1)``: the keep probability of randomised response."""
    return 1.0 / (1.0 + math.exp(-eps))


def lpp_perturb(users: UserBatch, d: int, p1: float, p2: float, fake, rng: np.random.Generator) -> ReportBatch:
    """LPP over a batch. ``fake``: ``"uniform"`` (a fresh uniform ``m~`` per
    user) or an array of per-key ``m~`` (the broadcast)."""
    n = users.n_users
    j, held, values = uniform_key_sampling(users, d, rng)
    fake_values = (rng.uniform(-1.0, 1.0, size=n) if isinstance(fake, str)
                   else np.asarray(fake, dtype=np.float64)[j])
    x = discretise(np.where(held, values, fake_values), rng)
    v_star = np.where(rng.random(n) < p2, x, -x)
    keep = rng.random(n) < p1
    key_bit = np.where(held, keep, ~keep)
    return ReportBatch(np.arange(n + 1), j, np.where(key_bit, v_star, 0).astype(np.int8), users.batch_id)


def lpp_output_probabilities(pairs, d: int, p1: float, p2: float, fake) -> np.ndarray:
    """Exact probability of every LPP report ``(j, s)``, ``s in (-1, 0, +1)``
    (flattened ``j``-major), for a user holding ``pairs`` ``[(key, v), …]``.

    A uniform fake ``m~`` discretises to a fair coin; a broadcast ``m~_j`` to
    ``+1`` w.p. ``(1 + m~_j)/2``.
    """
    held = dict(pairs)
    out = np.zeros((d, 3))
    for j in range(d):
        v = held.get(j)
        if v is None:
            up = 0.5 if isinstance(fake, str) else (1 + float(np.asarray(fake)[j])) / 2
            key1 = 1 - p1
        else:
            up, key1 = (1 + v) / 2, p1
        plus = up * p2 + (1 - up) * (1 - p2)
        out[j] = [key1 * (1 - plus), 1 - key1, key1 * plus]
    return out.ravel() / d


LPP_SYMBOLS = (1, -1, 0)      # <1,+1>, <1,-1>, <0,0>


def lpp_accumulate(counts: np.ndarray, reports: ReportBatch, d: int) -> np.ndarray:
    """Add LPP reports into ``[n, M1[d], M_1[d], M0[d]]``."""
    return accumulate_symbols(counts, reports, d, LPP_SYMBOLS)


def lpp_split(counts: np.ndarray, d: int) -> np.ndarray:
    """``(3, d)`` float stack ``[M1, M_1, M0]``."""
    return symbol_stack(counts, d, 3)


def privkv_frequency(stack: np.ndarray, p1: float) -> np.ndarray:
    """Alg. 4: ``f = (p1 - 1 + f')/(2 p1 - 1)`` with ``f' = (M1 + M_1)/M``."""
    M = stack.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        f_prime = np.where(M > 0, (stack[0] + stack[1]) / M, 0.0)
    return (p1 - 1.0 + f_prime) / (2.0 * p1 - 1.0)


def privkv_mean(stack: np.ndarray, p2: float, clip: bool = True) -> np.ndarray:
    """Alg. 4: ``n* = ((p2-1) N + n')/(2 p2 - 1)``, clipped into ``[0, N]``,
    ``m = (n1* - n2*)/N`` with ``N = M1 + M_1`` (0 where ``N = 0``)."""
    n1, n2 = stack[0], stack[1]
    N = n1 + n2
    n1s = ((p2 - 1.0) * N + n1) / (2.0 * p2 - 1.0)
    n2s = ((p2 - 1.0) * N + n2) / (2.0 * p2 - 1.0)
    if clip:
        n1s, n2s = np.clip(n1s, 0.0, N), np.clip(n2s, 0.0, N)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(N > 0, (n1s - n2s) / N, 0.0)


def privkv_a_counts(stack: np.ndarray, p1: float, p2: float):
    """Sun et al. 2019 §III: unbiased ``N1*``, ``N_1*`` (holders with
    discretised +1 / -1 among the ``M`` users who sampled the key)."""
    M1, M_1 = stack[0], stack[1]
    M = stack.sum(axis=0)
    a, b = 2 * p1 - 1, 2 * p2 - 1
    den = 2 * p1 * a * b
    N1 = ((p1 * b + a) * M1 + (p1 * b - a) * M_1 - p1 * b * (1 - p1) * M) / den
    N_1 = ((p1 * b - a) * M1 + (p1 * b + a) * M_1 - p1 * b * (1 - p1) * M) / den
    return N1, N_1, M


def lpp_probabilities(f, m, p1: float, p2: float, fake_mean=0.0) -> np.ndarray:
    """``(3, d)`` distribution of a key's LPP reports ``[<1,+1>, <1,-1>, <0,0>]``
    when a share ``f`` of its samplers hold it with mean ``m`` (clipped into
    ``[0, 1]``, ``[-1, 1]``) and non-holders' fake values average
    ``fake_mean`` (0 for PrivKV's uniform ``m~``, the broadcast otherwise)."""
    up = (1.0 + np.asarray(fake_mean, dtype=np.float64)) / 2.0
    fake_plus = up * p2 + (1.0 - up) * (1.0 - p2)
    non_holder = np.stack(np.broadcast_arrays((1 - p1) * fake_plus, (1 - p1) * (1 - fake_plus),
                                              np.full_like(fake_plus, p1)))
    return mixture_probabilities(f, m, [p1 * p2, p1 * (1 - p2), 1 - p1], [p1 * (1 - p2), p1 * p2, 1 - p1],
                                 non_holder)


def lpp_frequency_variance(f, M, p1: float) -> np.ndarray:
    """Exact ``Var f_hat = f'(1-f')/(M (2 p1 - 1)^2)``, ``f' = f p1 + (1-f)(1-p1)``,
    at ``f`` clipped into ``[0, 1]``: ``>= p1 (1 - p1)/(M (2p1-1)^2) > 0``
    (NaN where ``M = 0``)."""
    f = np.clip(np.nan_to_num(np.asarray(f, dtype=np.float64)), 0.0, 1.0)
    fp = f * p1 + (1 - f) * (1 - p1)
    M = np.asarray(M, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(M > 0, fp * (1 - fp) / (M * (2 * p1 - 1) ** 2), np.nan)


def lpp_frequency(stack: np.ndarray, p1: float):
    """``(f_raw, M)``: Alg. 4's frequency, NaN for keys without reports."""
    M = stack.sum(axis=0)
    return np.where(M > 0, privkv_frequency(stack, p1), np.nan), M


@dataclasses.dataclass(frozen=True)
class LPPOptions(Options):
    """PrivKV, PrivKV-A."""

    key_share: float = key_share_option()


@dataclasses.dataclass(frozen=True)
class PrivKVMVirtualOptions(Options):
    rounds: int = rounds_option(6)
    key_share: float = key_share_option()


class _LPPMechanism(Mechanism):
    """One LPP round with key budget ``eps1 = key_share eps`` and value budget
    ``eps2 = eps - eps1``; counts ``[n, M1[d], M_1[d], M0[d]]``."""
    options_type = LPPOptions

    fake = FAKE_UNIFORM

    def __init__(self, d: int, epsilon: float, key_share: float = 0.5):
        if not 0.0 < key_share < 1.0:
            raise ValueError(f"key_share must be in (0, 1), got {key_share}")
        self.key_share = float(key_share)
        super().__init__(d, epsilon)
        self.eps1 = self.ledger.round_epsilon(0, "key")
        self.eps2 = self.ledger.round_epsilon(0, "value")
        self.p1, self.p2 = rr_keep(self.eps1), rr_keep(self.eps2)

    def budget_shares(self) -> list[Share]:
        """LPP's sequential composition: ``eps1 = key_share eps`` on the key
        bit, ``eps2 = eps - eps1`` on the value."""
        eps1 = self.epsilon * self.key_share
        return [Share(0, "key", eps1), Share(0, "value", self.epsilon - eps1)]

    def config(self, round_index: int | None = None) -> Mapping:
        return {**super().config(), "key_share": self.key_share}

    def perturb(self, users: UserBatch, rng: np.random.Generator) -> ReportBatch:
        return lpp_perturb(users, self.d, self.p1, self.p2, self.fake, rng)

    @property
    def counts_size(self) -> int:
        return 1 + 3 * self.d

    def accumulate(self, counts: np.ndarray, reports: ReportBatch) -> np.ndarray:
        return lpp_accumulate(counts, reports, self.d)

    mean_biased = True        # PrivKV's and PrivKVM-VI's means; PrivKV-A overrides

    def _estimates(self, stack, m, m_raw, mean_se=None) -> Estimates:
        """Round 1's frequency (Alg. 4) with its exact s.e., and the mean
        ``m`` (clipped) / ``m_raw`` with ``mean_se`` (None for the biased means)."""
        f_raw, M = lpp_frequency(stack, self.p1)
        with np.errstate(invalid="ignore"):
            not_positive = ~(f_raw > 0)
        return with_statuses(
            np.clip(f_raw, 0.0, 1.0), np.clip(m, -1.0, 1.0), f_raw, np.where(M > 0, m_raw, np.nan),
            np.sqrt(lpp_frequency_variance(f_raw, M, self.p1)),
            np.full(self.d, np.nan) if mean_se is None else mean_se,
            n_reports=int(stack.sum()), mechanism=self.name, epsilon=self.epsilon,
            no_reports=M == 0, mean_not_estimable=not_positive, mean_biased=self.mean_biased,
            count_model=self.count_model(stack))

    def frequency_of(self, stack: np.ndarray) -> np.ndarray:
        return privkv_frequency(stack, self.p1)

    def mean_of(self, stack: np.ndarray) -> np.ndarray:
        """The raw (unclipped) mean estimator on a ``[M1, M_1, M0]`` stack."""
        return self._m(stack)

    def _m(self, stack, clip=False):
        return privkv_mean(stack, self.p2, clip=clip)

    def count_model(self, stack: np.ndarray) -> CountModel:
        """LPP (module doc): of the ``M_k`` users who sampled ``k``, a holder
        reports ``<1, v*>`` w.p. ``p1`` with ``v*`` its value kept w.p. ``p2``,
        a non-holder ``<1, VPP(m~)>`` w.p. ``1 - p1`` (``m~`` uniform: a fair
        coin after ``Disc``; ``m~ = 1`` for virtual iterations)."""
        p1, p2 = self.p1, self.p2
        up = 0.5 if isinstance(self.fake, str) else (1.0 + float(np.mean(self.fake))) / 2.0
        fake_plus = up * p2 + (1 - up) * (1 - p2)
        return CountModel(stack, [p1 * p2, p1 * (1 - p2), 1 - p1], [p1 * (1 - p2), p1 * p2, 1 - p1],
                          [(1 - p1) * fake_plus, (1 - p1) * (1 - fake_plus), p1], self.frequency_of, self.mean_of,
                          present=(0, 1), plus=0)

    def output_probabilities(self, pairs, round_index: int = 0, state=None) -> np.ndarray:
        """Exact report distribution (privacy audits): see :func:`lpp_output_probabilities`."""
        return lpp_output_probabilities(pairs, self.d, self.p1, self.p2, self.fake)


class PrivKV(_LPPMechanism):
    """PrivKV (Ye et al. Alg. 2-4): LPP with ``eps1 = eps2 = eps/2`` by default,
    frequency and mean by Algorithm 4 with counts clipped into ``[0, N]``."""

    name = "privkv"

    def estimate(self, counts: np.ndarray) -> Estimates:
        stack = lpp_split(counts, self.d)
        N = stack[0] + stack[1]
        m_raw = np.where(N > 0, privkv_mean(stack, self.p2, clip=False), np.nan)
        return self._estimates(stack, privkv_mean(stack, self.p2, clip=True), m_raw)


class PrivKVA(_LPPMechanism):
    """PrivKV-A: PrivKV's reports, Sun et al.'s unbiased count estimators
    ``N1*``, ``N_1*``: ``f = (N1* + N_1*)/M``, ``m = (N1* - N_1*)/(N1* + N_1*)``;
    the default output clips the counts into ``[0, M]`` (the raw ratio mean
    is heavy-tailed when few users hold the key)."""

    name = "privkv-a"

    def _f(self, stack, clip=False):
        N1, N_1, M = privkv_a_counts(stack, self.p1, self.p2)
        if clip:
            N1, N_1 = np.clip(N1, 0, M), np.clip(N_1, 0, M)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(M > 0, (N1 + N_1) / M, 0.0)

    def _m(self, stack, clip=False):
        N1, N_1, M = privkv_a_counts(stack, self.p1, self.p2)
        if clip:
            N1, N_1 = np.clip(N1, 0, M), np.clip(N_1, 0, M)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(N1 + N_1 != 0, (N1 - N_1) / (N1 + N_1), 0.0)

    mean_biased = False

    def estimate(self, counts: np.ndarray) -> Estimates:
        """Frequency as PrivKV's (the same linear estimator); mean = ratio of
        the unbiased counts (clipped into ``[0, M]``), s.e. by the delta
        method at the LPP model for the clipped ``(f, m)``."""
        stack = lpp_split(counts, self.d)
        f_raw = self._f(stack)
        m_raw = np.where(f_raw != 0, self._m(stack), np.nan)
        probs = lpp_probabilities(f_raw, m_raw, self.p1, self.p2)
        mean_se = np.sqrt(multinomial_delta_variance(self._m, stack, probs))
        return self._estimates(stack, self._m(stack, clip=True), m_raw, mean_se)


def virtual_iterations(m1: np.ndarray, f: np.ndarray, p: float, m_tilde, c: int) -> np.ndarray:
    """Alg. 7 / Theorem 6.1: ``theta = (f p - f - p + 1)/(2 f p - f - p + 1)``,
    ``m^(c) = m~ + (m^(1) - m~)(1 - theta^c)/(1 - theta)`` (``c`` terms of the
    geometric series, ``= c`` in the limit ``theta -> 1``)."""
    f = np.asarray(f, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        theta = (f * p - f - p + 1.0) / (2.0 * f * p - f - p + 1.0)
        # the limit c only where theta is 1 to rounding: the closed form is
        # accurate until 1 - theta nears machine precision
        series = np.where(np.abs(1.0 - theta) < 1e-12, float(c), (1.0 - theta ** c) / (1.0 - theta))
    return m_tilde + (m1 - m_tilde) * series


class PrivKVMVirtual(_LPPMechanism):
    """PrivKVM with virtual iterations ("1r(c-1)v", Alg. 7): one real LPP
    round with ``eps1 = eps2 = eps/2`` and ``m~ = 1`` for every key; the
    collector predicts round ``c``'s mean from round 1's frequency and mean."""

    name = "privkvm-vi"
    options_type = PrivKVMVirtualOptions

    def __init__(self, d: int, epsilon: float, rounds: int = 6, key_share: float = 0.5):
        super().__init__(d, epsilon, key_share)
        if int(rounds) != rounds or rounds < 1:
            raise ValueError(f"rounds (c) must be a whole number >= 1, got {rounds}")
        self.rounds = int(rounds)
        self.fake = np.ones(self.d)

    def config(self, round_index: int | None = None) -> Mapping:
        return {**super().config(), "rounds": self.rounds}

    def _m(self, stack, clip=False):
        f = privkv_frequency(stack, self.p1)
        if clip:
            f = np.clip(f, 0.0, 1.0)
        return virtual_iterations(privkv_mean(stack, self.p2, clip=clip), f, self.p1, 1.0, self.rounds)

    def estimate(self, counts: np.ndarray) -> Estimates:
        """Alg. 7 on the clipped ``(f, m^(1))`` (then clipped); raw: on the raw
        ones. Biased (towards ``m~ = 1`` by ``theta^c (1 - m)``): no s.e.; null
        where ``f <= 0`` (the extrapolation would run to a boundary value)."""
        stack = lpp_split(counts, self.d)
        return self._estimates(stack, self._m(stack, clip=True), self._m(stack))
