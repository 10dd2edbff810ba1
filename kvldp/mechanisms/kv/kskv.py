"""KSKV: KS-UE, KS-GRR and KS-Adap (Zhao et al. 2024, ``shared/papers/zhao2024-kskv.txt``;
SPEC.md §4).

* **KS-UE** (§4.1, Alg. 1): the PCKV-UE report structure with the budget
  tilted to the key: at the sampled key ``x`` kept w.p. ``p``, negated w.p.
  ``1-2p``, 0 w.p. ``p``; every other key ``±1`` w.p. ``a/2`` each, with
  ``p = (e^eps+1)/(2(e^eps+2))``, ``a = 2/(e^eps+2)``. In PCKV-UE's terms
  (nonzero-at-key ``A``, elsewhere ``B``, keep ``P``): ``A = 1-p``, ``B = a``,
  ``P = p/(1-p)``, so the same sparse sampler serves both. Estimates
  (formulas (5)-(6), padded): ``f = l((n+ + n-)/n - a)/(1-p-a)``,
  ``m = l(n+ - n-)/((3p-1) f n)``. Theorem 4.2's Eq. (9) is the exact
  frequency variance (``l = 1``); its Eq. (11) for the mean is not an upper
  bound (**erratum**, SPEC.md), so the mean's standard error is the delta
  method over the per-key multinomial of (+, -, 0) entries.
* **KS-GRR** (§4.2, Alg. 2, interactive): two disjoint user groups. Group 1
  reports one key by OLH; the collector's top ``2t`` keys are the candidate
  set ``TKS``. Group 2 keeps its pair if its key is in ``TKS``, else reports
  ``<⊥, ±1>`` (fair coin), and perturbs the pair by GRR over the ``2|K'|``
  pairs of ``K' = TKS ∪ {⊥}`` (formula (7)): itself w.p.
  ``p = e^eps/(e^eps + 2|K'| - 1)``, each other pair w.p. ``q``. Estimates:
  ``f = ((n+ + n-)/n - 2q)/(p - q)``, ``m = (n+ - n-)/((p - q) f n)``
  (**erratum**: the paper's ``p + q`` is biased).
* **KS-Adap** (§4.3, multi-pair): three groups (40/10/50 %): OLH top-``2t``
  candidates; OLH-reported sizes ``|S ∩ TKS|`` (over ``0 … 2t``: **choice**,
  the paper clips them at 16) from which the collector picks the smallest
  ``l <= 16`` whose estimated cumulative share exceeds 90 % (the histogram
  made a distribution by Norm-Sub) and the share of the candidate pairs'
  mass that ``l`` keeps (``truncation.py``); group 3 keeps its candidate
  pairs, pads and samples with ``l`` dummies and perturbs by GRR over
  ``TKS ∪ {l dummies}`` (**choice**, SPEC.md), frequencies scaled by ``l``
  and divided by the kept share.
* KS-GRR's group 2 reports one pair sampled from each user's set: the
  ingest side's ``kept_share`` (``l = 1``) corrects its frequencies.

Keys outside ``TKS`` are not estimated by the interactive protocols: KS-GRR
reports group 1's OLH frequency for them (unbiased for single-pair users);
KS-Adap's frequency and both protocols' means are null there
(``status = "not_candidate"``). Standard errors of the candidates: the delta
method over the GRR round's (+, -, other) counts at their expected values
for the clipped ``(f, m)``; a mean is null where ``f_raw <= 0``.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np

from kvldp.mechanisms import params
from kvldp.mechanisms.base import (
    STATUS_LATER_ROUND,
    STATUS_NOT_CANDIDATE,
    STATUS_OK,
    Estimates,
    ReportBatch,
    Reports,
    UserBatch,
    status_array,
    validated_domain,
    with_statuses,
)
from kvldp.mechanisms.estimation.variance import multinomial_delta_variance
from kvldp.mechanisms.frequency.oracles import GRR, OLH, OLHReportBatch
from kvldp.mechanisms.frequency.sampling import discretise
from kvldp.mechanisms.frequency.symbols import accumulate_symbols
from kvldp.mechanisms.kv.pckv import CLIP_PAPER, PCKVUE, PCKVParams
from kvldp.mechanisms.params import Options, option, padding_option, top_option
from kvldp.mechanisms.privacy.accountant import Accountant, Share, check_split
from kvldp.mechanisms.protocol import Protocol, ProtocolState


@dataclasses.dataclass(frozen=True)
class KSUEOptions(Options):
    padding: int = padding_option()
    kept_share: float = params.kept_share_option()


class KSUE(PCKVUE):
    """KS-UE: key-strategy unary encoding (non-interactive)."""

    name = "ks-ue"
    options_type = KSUEOptions

    def __init__(self, d: int, epsilon: float, padding: int = 1, kept_share: float = 1.0):
        super().__init__(d, epsilon, padding, CLIP_PAPER, kept_share)

    @staticmethod
    def optimal_params(d: int, epsilon: float, l: int) -> PCKVParams:
        e = math.exp(epsilon)
        p, a = (e + 1) / (2 * (e + 2)), 2 / (e + 2)
        return PCKVParams(a=1 - p, b=a, p=p / (1 - p), d=d, l=l)

    def config(self, round_index: int | None = None) -> Mapping:
        return {"mechanism": self.name, "d": self.d, "epsilon": self.epsilon, "padding": self.l,
                **params.kept_share_config(self.kept_share)}

    def _m(self, stack: np.ndarray) -> np.ndarray:
        """``m = l (n+ - n-)/((3p-1) f n)`` on a ``(3, d)`` stack ``[n+, n-, n0]``."""
        P, l = self.params, self.l
        n = stack.sum(axis=0)
        f = self._f(stack)
        with np.errstate(divide="ignore", invalid="ignore"):
            return l * (stack[0] - stack[1]) / (P.a * (2 * P.p - 1) * f * n)

    def _f(self, stack: np.ndarray) -> np.ndarray:
        P = self.params
        n = stack.sum(axis=0)
        return ((stack[0] + stack[1]) / n - P.b) * self.l / (P.a - P.b)

    def estimate(self, counts: np.ndarray) -> Estimates:
        n, n1, n2 = self.split_counts(counts)
        if n == 0:
            raise ValueError("no reports to estimate from")
        stack = np.stack([n1, n2, n - n1 - n2])
        f_raw, m_raw = self._f(stack), self._m(stack)
        f = np.clip(f_raw, 1.0 / n, 1.0)
        P = self.params
        m = np.clip(self.l * (n1 - n2) / (P.a * (2 * P.p - 1) * f * n), -1.0, 1.0)
        # both variances at the clipped (f, m): the expected counts there
        var_f, var_m = self.variance(n, f, m)
        return with_statuses(f, m, f_raw, m_raw, np.sqrt(var_f), np.sqrt(var_m), n_reports=n,
                             mechanism=self.name, epsilon=self.epsilon, mean_not_estimable=~(f_raw > 0),
                             count_model=self.count_model(counts), padding=self.l, kept_share=self.kept_share)

    def variance(self, n: int, f, m):
        """Exact ``Var f_hat`` (Theorem 4.2 Eq. (9) at ``l = 1``; with padding a
        holder's entry at ``k`` is non-zero w.p. ``A/l + B(1 - 1/l)``) and the
        mean's first-order variance: the delta method at the expected counts
        of (+, -, 0) entries (SPEC.md §4: not the paper's Eq. (11))."""
        P, l = self.params, self.l
        f = np.asarray(f, dtype=np.float64)
        m = np.asarray(m, dtype=np.float64)
        hold = P.a / l + P.b * (1 - 1 / l)
        var_f = l * l * (f * hold * (1 - hold) + (1 - f) * P.b * (1 - P.b)) / (n * (P.a - P.b) ** 2)
        fs = f / l
        up = P.p * (1 + m) / 2 + (1 - P.p) * (1 - m) / 2      # P(entry = +x... = +1 | sampled, nonzero)
        plus = fs * P.a * up + (1 - fs) * P.b / 2
        minus = fs * P.a * (1 - up) + (1 - fs) * P.b / 2
        probs = np.stack([plus, minus, 1 - plus - minus])
        return var_f, multinomial_delta_variance(self._m, n * probs, probs)


def norm_sub(estimates: np.ndarray, total: float = 1.0) -> np.ndarray:
    """Norm-Sub: the distribution ``max(x + delta, 0)`` summing to ``total``."""
    x = np.asarray(estimates, dtype=np.float64)
    lo, hi = total / len(x) - x.max(), total / len(x) - x.min() + total
    for _ in range(100):                       # bisection on the shift delta
        mid = (lo + hi) / 2
        if np.clip(x + mid, 0, None).sum() > total:
            hi = mid
        else:
            lo = mid
    return np.clip(x + (lo + hi) / 2, 0, None)


def sample_one_pair(users: UserBatch, rng: np.random.Generator):
    """One pair per user, uniformly among its pairs: ``(key, value, has_pair)``."""
    sizes = users.sizes
    has = sizes > 0
    pick = users.offsets[:-1] + np.floor(rng.random(users.n_users) * np.maximum(sizes, 1)).astype(np.int64)
    pick = np.where(has, pick, 0)
    if not len(users.keys):
        return np.zeros(users.n_users, np.int64), np.zeros(users.n_users), has
    return np.where(has, users.keys[pick], 0), np.where(has, users.values[pick], 0.0), has


def grr_pairs(index: np.ndarray, x: np.ndarray, n_keys: int, epsilon: float, rng) -> ReportBatch:
    """GRR over the ``2 n_keys`` pairs ``<key, ±1>`` (formula (7)): keep w.p.
    ``e^eps/(e^eps + 2 n_keys - 1)``, else any other pair uniformly."""
    out = GRR(2 * n_keys, epsilon).perturb(2 * np.asarray(index) + (np.asarray(x) > 0), rng)
    return ReportBatch(np.arange(len(out) + 1), out // 2, np.where(out % 2 == 1, 1, -1).astype(np.int8))


def grr_p(n_keys: int, epsilon: float) -> float:
    """Formula (7)'s keep probability: GRR's over the ``2 n_keys`` pairs."""
    return GRR(2 * n_keys, epsilon).p


def grr_q(n_keys: int, epsilon: float) -> float:
    return GRR(2 * n_keys, epsilon).q


# A fixed subfamily of OLH hashes ((a x + b) mod (2^31 - 1)) mod g for the exact audits.
AUDIT_HASHES = ((1, 0), (2, 1), (3, 5), (5, 2), (7, 3), (11, 8), (13, 21), (1_000_003, 17))


class KeyStrategyProtocol(Protocol):
    """Shared round 1 (OLH over the keys -> candidates) and the final GRR round."""

    def __init__(self, d: int, epsilon: float, top: int, group_shares):
        self.d, self.epsilon = validated_domain(d, epsilon)
        if int(top) != top or top < 1:
            raise ValueError(f"top t must be a whole number >= 1, got {top}")
        shares = tuple(float(s) for s in group_shares)
        check_split(shares, "group shares")
        self.t = int(top)
        self.n_candidates = min(2 * self.t, self.d)
        self.group_shares = shares
        self.round_groups = tuple(range(len(shares)))
        self.max_rounds = len(shares)
        # every group spends the whole budget once, in its own round
        self.ledger = Accountant.of(self.epsilon, [Share(r, "pair", self.epsilon, f"group{r + 1}")
                                                     for r in range(self.max_rounds)])
        self.olh = OLH(self.d + 1, self.ledger.round_epsilon(0))       # item d: a user without pairs

    broadcast_kind = "candidate_rank"

    def config(self, round_index=None) -> Mapping:
        return {**super().config(round_index), "top": self.t, "group_shares": list(self.group_shares)}

    # rounds before the last report by OLH (keys; KS-Adap's sizes), the last by GRR
    def round_report_type(self, round_index: int) -> type[Reports]:
        return OLHReportBatch if round_index < self.max_rounds - 1 else ReportBatch

    # round 1: one key by OLH
    def perturb_keys(self, users: UserBatch, rng) -> OLHReportBatch:
        key, _, has = sample_one_pair(users, rng)
        a, b, y = self.olh.perturb(np.where(has, key, self.d), rng)
        return OLHReportBatch(a, b, y, users.batch_id)

    def candidates(self, counts: np.ndarray):
        """``(rank of each key in TKS or -1, OLH frequency estimates, their s.e.)``."""
        n = max(int(counts[0]), 1)
        f = self.olh.estimate(counts[1:1 + self.d + 1], n)[:self.d] / n
        order = np.argsort(-f, kind="stable")[:self.n_candidates]
        rank = np.full(self.d, -1.0)
        rank[order] = np.arange(len(order))
        return rank, f, np.sqrt(self.olh.variance(n, np.clip(f, 0, 1)))

    def olh_state(self, counts: np.ndarray, missing_frequency: bool) -> ProtocolState:
        """The state after round 1: candidates, and (KS-GRR) group 1's OLH
        frequencies. Means (and KS-Adap's frequencies) are null: the final
        round estimates the candidates' (``later_round``), nobody the others'
        (``not_candidate``)."""
        rank, f, se = self.candidates(counts)
        share, share_se = self.pair_share(counts)
        pending = np.where(rank >= 0, STATUS_LATER_ROUND, STATUS_NOT_CANDIDATE).astype(object)
        nan = np.full(self.d, np.nan)
        est = Estimates(frequency=nan if missing_frequency else np.clip(f, 0, 1), mean=nan,
                        frequency_raw=nan if missing_frequency else f, mean_raw=nan,
                        frequency_se=nan if missing_frequency else se, mean_se=nan, n_reports=int(counts[0]),
                        mechanism=self.name, epsilon=self.epsilon,
                        frequency_status=pending.copy() if missing_frequency else status_array(self.d),
                        mean_status=pending.copy())
        return ProtocolState(1, rank, False, self.epsilon, est, (("pair_share", share), ("pair_share_se", share_se)))

    def pair_share(self, counts: np.ndarray) -> tuple[float, float]:
        """``(1 - f_bot, s.e.)``: group 1's OLH estimate of the share of users
        holding a pair (``f_bot``: its item ``d``, "no pair"), what the keys'
        one-pair frequencies sum to. Unbiased, with one item's variance
        (``OLH.variance``) -- the sum of the ``d`` keys' estimates has about
        ``d`` times that, and the final round's mix of candidates with the
        keys *not* chosen for large estimates sums too low (MovieLens, eps 4:
        -171 +- 59 where the truth is 106)."""
        n = max(int(counts[0]), 1)
        bottom = float(self.olh.estimate(counts[1 + self.d], n)) / n
        return 1.0 - bottom, float(np.sqrt(self.olh.variance(n, min(max(bottom, 0.0), 1.0))))

    # final round: GRR over candidate (+ dummy) pairs
    def final_estimates(self, state: ProtocolState, counts: np.ndarray, n_keys: int, scale: int,
                        kept_share: float = 1.0) -> Estimates:
        """Calibrate the GRR round: ``f = scale((n+ + n-)/n - 2q)/(p - q)``,
        ``m = scale(n+ - n-)/((p - q) f n)``, written into the candidates' slots.

        Standard errors: delta method at the expected counts of the clipped
        ``(f, m)``: a share ``g = f/scale`` of the group sends its candidate
        pair, ``+`` w.p. ``p (1+m)/2 + q (1-m)/2``, every other pair w.p. ``q``."""
        n = int(counts[0])
        width = (len(counts) - 1) // 2
        plus = counts[1:1 + width][:self.n_candidates].astype(np.float64)
        minus = counts[1 + width:][:self.n_candidates].astype(np.float64)
        eps = self.ledger.round_epsilon(self.max_rounds - 1)
        p, q = grr_p(n_keys, eps), grr_q(n_keys, eps)
        stack = np.stack([plus, minus, n - plus - minus])

        def f_of(s):
            return scale * ((s[0] + s[1]) / s.sum(axis=0) - 2 * q) / (p - q)

        def m_of(s):
            with np.errstate(divide="ignore", invalid="ignore"):
                return scale * (s[0] - s[1]) / ((p - q) * f_of(s) * s.sum(axis=0))

        with np.errstate(divide="ignore", invalid="ignore"):
            f_raw, m_raw = f_of(stack), m_of(stack)
            f = np.clip(f_raw, 1.0 / max(n, 1), 1.0)
            m = np.clip(scale * (plus - minus) / ((p - q) * f * n), -1.0, 1.0)
        g = np.clip(f / scale, 0.0, 1.0)
        up = p * (1 + m) / 2 + q * (1 - m) / 2
        down = p * (1 - m) / 2 + q * (1 + m) / 2
        probs = np.stack([g * up + (1 - g) * q, g * down + (1 - g) * q, 1 - (g * (p + q) + (1 - g) * 2 * q)])
        f_se = np.sqrt(multinomial_delta_variance(f_of, stack, probs))
        m_se = np.sqrt(multinomial_delta_variance(m_of, stack, probs))
        prev = state.estimates
        rank = state.broadcast.astype(np.int64)
        cand = np.flatnonzero(rank >= 0)
        slot = rank[cand]
        out = {name: getattr(prev, name).astype(np.float64).copy()
               for name in ("frequency", "mean", "frequency_raw", "mean_raw", "frequency_se", "mean_se")}
        f_status, m_status = prev.frequency_status.copy(), prev.mean_status.copy()
        out["frequency"][cand], out["frequency_raw"][cand] = f[slot], f_raw[slot]
        out["mean"][cand], out["mean_raw"][cand] = m[slot], m_raw[slot]
        out["frequency_se"][cand] = f_se[slot]
        out["mean_se"][cand] = m_se[slot]
        f_status[cand], m_status[cand] = STATUS_OK, STATUS_OK
        not_positive = np.zeros(self.d, dtype=bool)
        not_positive[cand] = ~(f_raw[slot] > 0)
        # the keys' total: round 1's share of users with a pair (KS-GRR; KS-Adap estimates only candidates)
        share = None if np.any(f_status == STATUS_NOT_CANDIDATE) else state.get("pair_share")
        return with_statuses(**out, n_reports=n, mechanism=self.name, epsilon=self.epsilon,
                             mean_not_estimable=not_positive, frequency_status=f_status, mean_status=m_status,
                             padding=scale, kept_share=kept_share, frequency_total=share,
                             frequency_total_se=None if share is None else state.get("pair_share_se"))

    # -- exact report distributions (privacy audit) ---------------------
    def one_pair_distribution(self, pairs) -> np.ndarray:
        """P(item) of round 1's ``sample_one_pair`` over ``[0, d]`` (``d``: no pair)."""
        out = np.zeros(self.d + 1)
        for k, _ in pairs:
            out[k] += 1.0 / len(pairs)
        if not pairs:
            out[self.d] = 1.0
        return out

    @staticmethod
    def olh_probabilities(oracle: OLH, item_probs: np.ndarray) -> np.ndarray:
        """OLH reports ``(hash, y)`` over the fixed hash subfamily
        ``AUDIT_HASHES``, each hash equally likely. The hash is drawn
        independently of the item, so the ratio of two users' probabilities of
        ``(h, y)`` is that of ``P(y | h, item)``: auditing a subfamily audits
        those hashes exactly."""
        items = np.arange(oracle.d, dtype=np.uint64)
        other = (1 - oracle.p) / (oracle.g - 1)
        out = []
        for a, b in AUDIT_HASHES:
            hashed = oracle.hash(np.uint64(a), np.uint64(b), items)
            given_item = np.where(hashed[:, None] == np.arange(oracle.g)[None, :], oracle.p, other)
            out.append(item_probs @ given_item / len(AUDIT_HASHES))
        return np.concatenate(out)

    @staticmethod
    def grr_pair_probabilities(own: np.ndarray, n_keys: int, epsilon: float) -> np.ndarray:
        """``grr_pairs``' reports (pair ``2 index + (x > 0)``) given the
        distribution ``own`` of the user's own pair."""
        grr = GRR(2 * n_keys, epsilon)
        return own * grr.p + (1 - own) * grr.q

    def candidate_index(self, users: UserBatch, state: ProtocolState):
        """Each pair's candidate rank (-1 outside ``TKS``)."""
        return state.broadcast.astype(np.int64)[users.keys] if len(users.keys) else np.zeros(0, np.int64)


@dataclasses.dataclass(frozen=True)
class KSGRROptions(Options):
    top: int = top_option()
    group_split: float = option(0.5, "KS-GRR: the share of users in group 1 (finding the candidates)",
                                low=0.0, high=1.0, low_open=True, high_open=True, parse=float)
    kept_share: float = params.kept_share_option()


class KSGRR(KeyStrategyProtocol):
    """KS-GRR: group 1 finds the top-2t candidates by OLH, group 2 reports its
    pair by GRR over the candidates and ⊥."""

    name = "ks-grr"
    options_type = KSGRROptions

    def __init__(self, d: int, epsilon: float, top: int = 20, group_split: float = 0.5, kept_share: float = 1.0):
        super().__init__(d, epsilon, top, (group_split, 1.0 - group_split))
        self.kept_share = params.checked_kept_share(kept_share)     # one pair per user: padding l = 1's

    def round_counts_size(self, round_index: int) -> int:
        return 1 + (self.d + 1 if round_index == 0 else 2 * (self.n_candidates + 1))

    def perturb_round(self, round_index, users, rng, state):
        if round_index == 0:
            return self.perturb_keys(users, rng)
        key, value, has = sample_one_pair(users, rng)
        rank = np.where(has, state.broadcast.astype(np.int64)[key], -1)
        inside = rank >= 0
        x = np.where(inside, discretise(value, rng), np.where(rng.random(len(rank)) < 0.5, 1, -1))
        index = np.where(inside, rank, self.n_candidates)          # ⊥ is the last key of K'
        reports = grr_pairs(index, x, self.n_candidates + 1, self.ledger.round_epsilon(round_index), rng)
        return ReportBatch(reports.offsets, reports.positions, reports.symbols, users.batch_id)

    def accumulate_round(self, round_index, counts, reports):
        if round_index == 0:
            counts[0] += reports.n_reports
            counts[1:] += self.olh.support(reports.a, reports.b, reports.values)
            return counts
        return accumulate_symbols(counts, reports, self.n_candidates + 1, (1, -1))

    def output_probabilities(self, pairs, round_index: int = 0, state=None) -> np.ndarray:
        """Round 1: OLH of one sampled pair's key. Round 2: GRR over the
        candidate pairs and ⊥ (pairs outside the candidates, and users
        without pairs, send ⊥ with a fair sign)."""
        if round_index == 0:
            return self.olh_probabilities(self.olh, self.one_pair_distribution(pairs))
        bottom = self.n_candidates
        own = np.zeros(2 * (bottom + 1))
        rank = state.broadcast.astype(np.int64)
        for k, v in pairs or [(None, 0.0)]:
            w = 1.0 / max(len(pairs), 1)
            if k is not None and rank[k] >= 0:
                own[2 * rank[k]:2 * rank[k] + 2] += w * np.array([(1 - v) / 2, (1 + v) / 2])
            else:
                own[2 * bottom:] += w * 0.5
        return self.grr_pair_probabilities(own, bottom + 1, self.ledger.round_epsilon(round_index))

    def advance(self, round_index, state, counts):
        if round_index == 0:
            return self.olh_state(counts, missing_frequency=False)
        est = self.final_estimates(state, counts, self.n_candidates + 1, scale=1, kept_share=self.kept_share)
        return ProtocolState(2, state.broadcast, True, self.epsilon, est)

    def config(self, round_index=None) -> Mapping:
        return {**super().config(round_index), **params.kept_share_config(self.kept_share)}
