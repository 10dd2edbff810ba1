"""PCKV: PCKV-UE and PCKV-GRR (Gu, Li, Cheng, Xiong, Cao, USENIX Security 2020).

Restated in full in ``shared/PCKV.md``; keys are 0-based, dummy keys are
``d … d+l-1`` so a report's domain has ``d' = d + l`` positions.

Client (both): padding-and-sampling picks one ``<k, x>`` with ``x = Disc(v)``
(§4.1, Alg. 1), then

* **PCKV-UE** (§4.2): a ternary vector over ``d'``; the sampled key is ``x``
  w.p. ``a p``, ``-x`` w.p. ``a (1-p)``, 0 otherwise; every other key is
  ``±1`` w.p. ``b/2`` each. Optimal (Lemma 2): ``a = 1/2``,
  ``b = 2/(e^eps+3)``, ``p = e^eps/(e^eps+1)``.
* **PCKV-GRR** (§4.3): keep the key w.p. ``a`` with value ``x`` w.p. ``p``;
  otherwise a uniformly random other key with a fair sign. Optimal
  (Lemma 3): ``a = (l(e^eps-1)+2)/(l(e^eps-1)+2d')``, ``b = (1-a)/(d'-1)``,
  ``p = (l(e^eps-1)+1)/(l(e^eps-1)+2)``.

Collector (§4.4, Alg. 4 with the improved estimation): with ``n1``/``n2``
the ``+1``/``-1`` counts of key ``k`` and ``n`` users,
``f = ((n1+n2)/n - b) l/(a-b)`` clipped into ``[1/n, 1]``, ``N = n f/l``,
``[n1*, n2*]`` solves ``[[ap-b/2, a(1-p)-b/2],[a(1-p)-b/2, ap-b/2]] n* =
[n1 - nb/2, n2 - nb/2]``, clipped into ``[0, N]`` (or ``[1, N]`` as the
authors' MATLAB does), and ``m = (n1* - n2*)/N``.

Privacy (tight composition): Theorem 2 (UE) and Theorem 3 (GRR);
``output_probabilities`` gives the exact report distribution for small
domains so a test can enumerate every pair of inputs.

Variance (Theorem 4, with ``delta = (a-b) f/l``, ``gamma = a(2p-1) f/l``):
``Var f = l^2 b(1-b)/(n(a-b)^2) + l f (1-a-b)/(n(a-b)) + (l-1) f/n`` (the
last term from the random choice of the sampled pair) and
``Var m ≲ (b+delta)/(n gamma^2) + (b(1-b)-delta) m^2/(n delta^2)``.
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from kvldp.mechanisms.base import Estimates, ReportBatch, UserBatch, with_statuses
from kvldp.mechanisms.estimation.countmodel import CountModel
from kvldp.mechanisms.frequency.oracles import randomized_response, skip_items
from kvldp.mechanisms.frequency.sampling import padding_and_sampling, padding_sampling_distribution
from kvldp.mechanisms.params import (
    Options,
    checked_kept_share,
    kept_share_config,
    kept_share_option,
    option,
    padding_option,
)
from kvldp.mechanisms.privacy.randomness import bernoulli_positions, fair_signs
from kvldp.mechanisms.protocol import Mechanism

CLIP_PAPER = "paper"      # n1*, n2* in [0, N]  (Algorithm 4)
CLIP_MATLAB = "matlab"    # n1*, n2* in [1, N]  (the authors' PCKV_UE.m / PCKV_GRR.m)
CLIP_MODES = (CLIP_PAPER, CLIP_MATLAB)


@dataclasses.dataclass(frozen=True)
class PCKVParams:
    """Perturbation probabilities of a PCKV mechanism, validated once.

    ``a``: P(sampled key reported non-zero / kept); ``b``: P(any other key
    reported non-zero); ``p``: P(value kept | key kept).
    """

    a: float
    b: float
    p: float
    d: int
    l: int

    def __post_init__(self):
        if not (0 < self.b < self.a < 1):
            raise ValueError(f"PCKV needs 0 < b < a < 1, got a={self.a}, b={self.b}")
        if not (0.5 < self.p < 1):
            raise ValueError(f"PCKV needs 1/2 < p < 1, got p={self.p}")
        if self.d < 1 or self.l < 1:
            raise ValueError(f"need d >= 1 and l >= 1, got d={self.d}, l={self.l}")

    @property
    def d_prime(self) -> int:
        return self.d + self.l

    @property
    def eps2(self) -> float:
        """Value budget ``ln(p/(1-p))``."""
        return math.log(self.p / (1 - self.p))

    @property
    def value_matrix(self):
        """Entries ``A = a p - b/2`` and ``B = a (1-p) - b/2`` of the 2x2 system."""
        return self.a * self.p - self.b / 2, self.a * (1 - self.p) - self.b / 2


@dataclasses.dataclass(frozen=True)
class PCKVOptions(Options):
    """PCKV-UE, PCKV-GRR."""

    padding: int = padding_option()
    kept_share: float = kept_share_option()
    clip: str = option(CLIP_PAPER, "PCKV: clip value counts into [0, N] (Algorithm 4) or [1, N] (the authors' "
                       "MATLAB)", choices=(CLIP_PAPER, CLIP_MATLAB), parse=str)


class _PCKV(Mechanism):
    """Shared estimator, variance and padding of the two PCKV variants."""
    options_type = PCKVOptions

    params: PCKVParams

    def __init__(self, d: int, epsilon: float, padding: int = 1, clip: str = CLIP_PAPER, kept_share: float = 1.0):
        super().__init__(d, epsilon)
        if int(padding) < 1:
            raise ValueError(f"padding length l must be >= 1, got {padding}")
        self.kept_share = checked_kept_share(kept_share)
        if clip not in CLIP_MODES:
            raise ValueError(f"clip must be one of {CLIP_MODES}, got {clip!r}")
        self.l = int(padding)
        self.clip = clip
        self.params = self.optimal_params(d, epsilon, self.l)

    @staticmethod
    def optimal_params(d: int, epsilon: float, l: int) -> PCKVParams:
        raise NotImplementedError

    def config(self, round_index: int | None = None) -> Mapping:
        # clip is the collector's choice, not a property of the reports.
        return {**super().config(), "padding": self.l, **kept_share_config(self.kept_share)}

    @property
    def report_domain(self) -> int:
        return self.params.d_prime

    # -- collector ------------------------------------------------------
    @property
    def counts_size(self) -> int:
        # [n, n1 over d' positions, n2 over d' positions]
        return 1 + 2 * self.params.d_prime

    def accumulate(self, counts: np.ndarray, reports: ReportBatch) -> np.ndarray:
        dp = self.params.d_prime
        pos = reports.positions
        if len(pos) and (pos.min() < 0 or pos.max() >= dp):
            raise ValueError(f"report position outside [0, {dp}): reports do not match {self!r}")
        if len(reports.symbols) and not np.all(np.abs(reports.symbols) == 1):
            raise ValueError(f"PCKV report signs must be +1 or -1: reports do not match {self!r}")
        # One bincount over n1's then n2's positions (the layout of counts):
        # selecting each sign's positions by a mask cost ~10 ns a position
        # (PCKV-UE at eps = 1, 340,542 keys: 119,000 of them a report).
        index = (reports.symbols < 0).astype(np.int64)
        index *= dp
        index += pos
        counts[0] += reports.n_reports
        counts[1:] += np.bincount(index, minlength=2 * dp)
        return counts

    def split_counts(self, counts: np.ndarray):
        """``(n, n1[d], n2[d])`` for the real keys."""
        dp, d = self.params.d_prime, self.d
        counts = np.asarray(counts)
        return int(counts[0]), counts[1:1 + d].astype(np.float64), counts[1 + dp:1 + dp + d].astype(np.float64)

    def estimate(self, counts: np.ndarray) -> Estimates:
        n, n1, n2 = self.split_counts(counts)
        if n == 0:
            raise ValueError("no reports to estimate from")
        P, l = self.params, self.l
        f_raw = ((n1 + n2) / n - P.b) * l / (P.a - P.b)
        f = np.clip(f_raw, 1.0 / n, 1.0)
        A, B = P.value_matrix
        r1, r2 = n1 - n * P.b / 2, n2 - n * P.b / 2
        det = A * A - B * B
        n1s, n2s = (A * r1 - B * r2) / det, (A * r2 - B * r1) / det
        N = n * f / l
        low = 0.0 if self.clip == CLIP_PAPER else np.minimum(1.0, N)
        m = (np.clip(n1s, low, N) - np.clip(n2s, low, N)) / N
        with np.errstate(divide="ignore", invalid="ignore"):
            m_raw = (n1s - n2s) / (n * f_raw / l)
        # Theorem 4 at the clipped estimates (f >= 1/n): both terms stay > 0.
        # A mean needs holders: null where f_raw <= 0 (m would be a boundary
        # value of the clipped counts over N = 1/l).
        var_f, var_m = self.variance(n, f, np.clip(m, -1.0, 1.0))
        return with_statuses(f, np.clip(m, -1.0, 1.0), f_raw, m_raw, np.sqrt(var_f), np.sqrt(var_m),
                             n_reports=n, mechanism=self.name, epsilon=self.epsilon,
                             mean_not_estimable=~(f_raw > 0), count_model=self.count_model(counts),
                             padding=self.l, kept_share=self.kept_share)

    # -- the count model (post-processing, countmodel.py) ----------------------
    def frequency_of(self, stack: np.ndarray) -> np.ndarray:
        """``f = l((n1 + n2)/n - b)/(a - b)`` on a ``(3, K)`` stack ``[n1, n2, n0]``."""
        P = self.params
        with np.errstate(divide="ignore", invalid="ignore"):
            return ((stack[0] + stack[1]) / stack.sum(axis=0) - P.b) * self.l / (P.a - P.b)

    def mean_of(self, stack: np.ndarray) -> np.ndarray:
        """The raw mean ``(n1* - n2*)/N = (n1 - n2)/((A - B) n f/l)`` on a stack."""
        A, B = self.params.value_matrix
        with np.errstate(divide="ignore", invalid="ignore"):
            return (stack[0] - stack[1]) / ((A - B) * stack.sum(axis=0) * self.frequency_of(stack) / self.l)

    def count_model(self, counts: np.ndarray) -> CountModel:
        """Position ``k`` of each of the ``n`` reports is ``+1``/``-1``/0:
        a user who sampled ``k`` (share ``f/l``) with value ``x`` reports
        ``x`` w.p. ``a p``, ``-x`` w.p. ``a(1-p)``; any other ``±1`` w.p.
        ``b/2`` each. The frequencies add up to ``l`` minus the dummy keys'
        (every user samples one of the ``d + l`` positions), which the ``l``
        dummy positions estimate with the variance of ``l`` keys, not ``d``."""
        a, b, p = self.params.a, self.params.b, self.params.p
        n, n1, n2 = self.split_counts(counts)
        dp, d = self.params.d_prime, self.d
        counts = np.asarray(counts)
        dummy = np.stack([counts[1 + d:1 + dp], counts[1 + dp + d:1 + 2 * dp]]).astype(np.float64)
        dummy = np.concatenate([dummy, [n - dummy.sum(axis=0)]])
        f_dummy = self.frequency_of(dummy)
        var_dummy = self.variance(n, np.clip(f_dummy, 0.0, 1.0), np.zeros(self.l))[0]
        return CountModel(np.stack([n1, n2, n - n1 - n2]), [a * p, a * (1 - p), 1 - a], [a * (1 - p), a * p, 1 - a],
                          [b / 2, b / 2, 1 - b], self.frequency_of, self.mean_of, self.l, present=(0, 1), plus=0,
                          total=float(self.l - f_dummy.sum()), total_variance=float(var_dummy.sum()))

    def theoretical_variance(self, n: int, f, m):
        return self.variance(n, f, np.nan_to_num(np.asarray(m, dtype=np.float64)))

    def variance(self, n: int, f, m):
        """Theorem 4's variances of ``f_hat`` (exact, unconditional) and of
        ``m_hat`` (first-order bound), per key."""
        P, l = self.params, self.l
        f = np.asarray(f, dtype=np.float64)
        m = np.asarray(m, dtype=np.float64)
        a, b, p = P.a, P.b, P.p
        var_f = l * l * b * (1 - b) / (n * (a - b) ** 2) + l * f * (1 - a - b) / (n * (a - b)) + (l - 1) * f / n
        delta = (a - b) * f / l
        gamma = a * (2 * p - 1) * f / l
        with np.errstate(divide="ignore", invalid="ignore"):
            var_m = (b + delta) / (n * gamma ** 2) + (b * (1 - b) - delta) * m ** 2 / (n * delta ** 2)
        return var_f, np.maximum(var_m, 0.0)

    # -- exact report distribution (privacy audits) -------------------------
    def sampling_distribution(self, pairs: Sequence[tuple[int, float]]) -> np.ndarray:
        """P(sampled key = k, x = ±1) for one user, shape ``(d', 2)`` with
        column 0 for ``x = -1`` and column 1 for ``x = +1``."""
        return padding_sampling_distribution(pairs, self.d, self.l)

    def all_outputs(self):
        raise NotImplementedError


class PCKVUE(_PCKV):
    """PCKV-UE: ternary unary encoding of the sampled pair (PCKV §4.2).

    Report: the sorted non-zero positions of ``y in {-1,0,1}^(d+l)`` and their
    signs. The ``d'-1`` other positions are drawn sparsely (geometric gaps
    between Bernoulli(b) successes): exact, ``O(b d')`` work per user.
    """

    name = "pckv-ue"

    @staticmethod
    def optimal_params(d: int, epsilon: float, l: int) -> PCKVParams:
        e = math.exp(epsilon)
        return PCKVParams(a=0.5, b=2.0 / (e + 3.0), p=e / (e + 1.0), d=d, l=l)

    @property
    def eps1(self) -> float:
        a, b = self.params.a, self.params.b
        return math.log(a * (1 - b) / (b * (1 - a)))

    def theorem_epsilon(self) -> float:
        """Theorem 2: ``max{eps2, eps1 + ln[2/(1 + e^-eps2)]}``."""
        e2 = self.params.eps2
        return max(e2, self.eps1 + math.log(2 / (1 + math.exp(-e2))))

    def perturb(self, users: UserBatch, rng: np.random.Generator) -> ReportBatch:
        P = self.params
        dp, n = P.d_prime, users.n_users
        keys, x = padding_and_sampling(users, self.d, self.l, rng)
        # The other d'-1 positions (every one but the sampled key's), sorted within a user.
        slots = bernoulli_positions(n * (dp - 1), P.b, rng)
        signs = fair_signs(len(slots), rng)
        # The sampled position: x w.p. a p, -x w.p. a (1-p), 0 w.p. 1-a.
        u = rng.random(n)
        nonzero = u < P.a
        own_sign = np.where(u < P.a * P.p, x, -x).astype(np.int8)[nonzero]
        starts, at = skip_items(slots, keys, dp - 1)
        positions = np.insert(slots, at[nonzero], keys[nonzero])
        signs = np.insert(signs, at[nonzero], own_sign)
        offsets = np.concatenate([[0], np.cumsum(np.diff(starts) + nonzero)])
        return ReportBatch(offsets, positions, signs, users.batch_id)

    can_draw_counts = True

    def draw_counts(self, users: UserBatch, rng: np.random.Generator) -> np.ndarray:
        """The batch's ``[n, n1, n2]`` drawn per position without the reports
        (simulations only): positions are perturbed independently, so
        position ``k``'s (+1, -1, 0) entries are the sum of three multinomials
        -- its ``N+`` users who sampled ``<k, +1>`` w.p. ``(a p, a(1-p), 1-a)``,
        its ``N-`` who sampled ``<k, -1>`` the mirror, and the ``n - N+ - N-``
        others ``(b/2, b/2, 1-b)``. O(d') draws instead of O(n d' b)."""
        P = self.params
        dp, n = P.d_prime, users.n_users
        keys, x = padding_and_sampling(users, self.d, self.l, rng)
        plus = np.bincount(keys[x > 0], minlength=dp)
        minus = np.bincount(keys[x < 0], minlength=dp)
        a, b, p = P.a, P.b, P.p
        entries = (rng.multinomial(plus, [a * p, a * (1 - p), 1 - a])
                   + rng.multinomial(minus, [a * (1 - p), a * p, 1 - a])
                   + rng.multinomial(n - plus - minus, [b / 2, b / 2, 1 - b]))
        counts = self.new_counts()
        counts[0] = n
        counts[1:1 + dp], counts[1 + dp:] = entries[:, 0], entries[:, 1]
        return counts

    def all_outputs(self):
        """Every ternary vector over ``d'`` positions, shape ``(3^d', d')``."""
        return np.array(list(itertools.product((-1, 0, 1), repeat=self.params.d_prime)), dtype=np.int8)

    def output_probabilities(self, pairs, round_index: int = 0, state=None) -> np.ndarray:
        P = self.params
        ys = self.all_outputs().astype(np.float64)
        other = np.where(ys == 0, 1 - P.b, P.b / 2)          # P(y_j | j not sampled)
        prod_other = np.prod(other, axis=1)
        total = np.zeros(len(ys))
        for k, col in itertools.product(range(P.d_prime), (0, 1)):
            w = self.sampling_distribution(pairs)[k, col]
            if w == 0:
                continue
            x = 1 if col else -1
            yk = ys[:, k]
            own = np.where(yk == 0, 1 - P.a, np.where(yk == x, P.a * P.p, P.a * (1 - P.p)))
            total += w * prod_other / other[:, k] * own
        return total


class PCKVGRR(_PCKV):
    """PCKV-GRR: generalised randomised response over the ``2 d'`` pairs
    ``<k, ±1>`` (PCKV §4.3). Report: one ``(key, sign)``."""

    name = "pckv-grr"

    @staticmethod
    def optimal_params(d: int, epsilon: float, l: int) -> PCKVParams:
        if d + l < 2:
            raise ValueError("PCKV-GRR needs d + l >= 2")
        t = l * (math.exp(epsilon) - 1)
        dp = d + l
        a = (t + 2) / (t + 2 * dp)
        return PCKVParams(a=a, b=(1 - a) / (dp - 1), p=(t + 1) / (t + 2), d=d, l=l)

    @property
    def eps1(self) -> float:
        a, dp = self.params.a, self.params.d_prime
        return math.log(a * (dp - 1) / (1 - a))

    def theorem_epsilon(self) -> float:
        """Theorem 3: ``ln[(e^(eps1+eps2) + lam)/(min{e^eps1, (e^eps2+1)/2} + lam)]``
        with ``lam = (l-1)(e^eps2+1)/2``."""
        e1, e2 = math.exp(self.eps1), math.exp(self.params.eps2)
        lam = (self.l - 1) * (e2 + 1) / 2
        return math.log((e1 * e2 + lam) / (min(e1, (e2 + 1) / 2) + lam))

    def perturb(self, users: UserBatch, rng: np.random.Generator) -> ReportBatch:
        P = self.params
        n = users.n_users
        keys, x = padding_and_sampling(users, self.d, self.l, rng)
        keep, reported = randomized_response(keys, P.d_prime, P.a, rng)
        kept_sign = np.where(rng.random(n) < P.p, x, -x)
        fair_sign = np.where(rng.random(n) < 0.5, 1, -1)
        return ReportBatch(
            np.arange(n + 1), reported,
            np.where(keep, kept_sign, fair_sign).astype(np.int8), users.batch_id,
        )

    def all_outputs(self):
        """Every ``(key, sign)`` report, shape ``(2 d', 2)``."""
        return np.array([(k, s) for k in range(self.params.d_prime) for s in (-1, 1)], dtype=np.int64)

    def output_probabilities(self, pairs, round_index: int = 0, state=None) -> np.ndarray:
        P = self.params
        samp = self.sampling_distribution(pairs)
        outs = self.all_outputs()
        total = np.zeros(len(outs))
        for i, (k, s) in enumerate(outs):
            col = 1 if s > 0 else 0
            # sampled key k, kept: sign s w.p. p if x == s else 1-p
            total[i] += P.a * (samp[k, col] * P.p + samp[k, 1 - col] * (1 - P.p))
            # another key sampled, k drawn among the d'-1 others, fair sign
            total[i] += (1 - samp[k].sum()) * P.b * 0.5
        return total
