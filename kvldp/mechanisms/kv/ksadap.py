"""KS-Adap (Zhao et al. 2024, §4.3): KS-GRR for multi-pair users with an
adaptively chosen padding -- the protocol of ``kskv.py``'s module docstring,
in its own module.

Three groups (40/10/50 %): group 1 finds the top-``2t`` candidates by OLH;
group 2 reports ``|S ∩ TKS|`` by OLH over ``0 … 2t`` (**choice**: the paper
clips at 16; the kept share needs the sizes beyond ``l``), from which the
collector picks ``l <= 16`` and the share of the candidate pairs' mass that
``l`` keeps (``estimation/truncation.py``); group 3 pads and samples its
candidate pairs with ``l`` and reports them by GRR over ``TKS ∪ {l dummies}``.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np

from kvldp.mechanisms.base import ReportBatch, UserBatch
from kvldp.mechanisms.frequency import padding as padding_math
from kvldp.mechanisms.frequency.oracles import OLH, OLHReportBatch
from kvldp.mechanisms.frequency.sampling import padding_and_sampling, padding_sampling_distribution
from kvldp.mechanisms.frequency.symbols import accumulate_symbols
from kvldp.mechanisms.kv.kskv import KeyStrategyProtocol, grr_pairs, norm_sub
from kvldp.mechanisms.params import Options, floats, option, top_option
from kvldp.mechanisms.protocol import ProtocolState

KEPT_SE_MAX = 0.05      # a kept share estimated less precisely than this is not applied


@dataclasses.dataclass(frozen=True)
class KSAdapOptions(Options):
    top: int = top_option()
    group_shares: tuple = option((0.4, 0.1, 0.5), "KS-Adap: the three groups' shares of the users, "
                                 "comma-separated", low=0.0, high=1.0, low_open=True, high_open=True, parse=floats)
    coverage: float = option(0.9, "KS-Adap: the chosen l covers this share of candidate holders; padded "
                             "mechanisms: the share of users --padding auto covers, and the warning threshold",
                             low=0.0, high=1.0, low_open=True, parse=float)


class KSAdap(KeyStrategyProtocol):
    """KS-Adap: KS-GRR for multi-pair users with an adaptively chosen padding."""

    name = "ks-adap"
    options_type = KSAdapOptions

    def __init__(self, d: int, epsilon: float, top: int = 20, group_shares=(0.4, 0.1, 0.5),
                 coverage: float = 0.9):
        super().__init__(d, epsilon, top, group_shares)
        if len(self.group_shares) != 3:
            raise ValueError("KS-Adap needs three group shares")
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage must be in (0, 1], got {coverage}")
        self.coverage = float(coverage)
        # l is at most max_size (a padding beyond 16 would drown every pair in dummies), but the sizes
        # |S ∩ TKS| are reported by OLH over all of 0 … 2t (**choice**; the paper's 0 … L_max clips them):
        # the kept share needs the sizes beyond l, and OLH's variance does not grow with its domain
        self.max_size = min(self.n_candidates, padding_math.MAX_PADDING)
        self.sizes_olh = OLH(self.n_candidates + 1, self.ledger.round_epsilon(1))

    def round_counts_size(self, round_index: int) -> int:
        if round_index == 0:
            return 1 + self.d + 1
        if round_index == 1:
            return 1 + self.n_candidates + 1
        return 1 + 2 * (self.n_candidates + self.max_size)

    def perturb_round(self, round_index, users, rng, state):
        if round_index == 0:
            return self.perturb_keys(users, rng)
        index = self.candidate_index(users, state)
        inside = index >= 0
        if round_index == 1:
            sizes = np.bincount(users.owners[inside], minlength=users.n_users)
            a, b, y = self.sizes_olh.perturb(sizes, rng)
            return OLHReportBatch(a, b, y, users.batch_id)
        l = int(state.get("padding"))
        mine = UserBatch(np.concatenate([[0], np.cumsum(np.bincount(users.owners[inside],
                                                                    minlength=users.n_users))]),
                         index[inside], users.values[inside], users.batch_id)
        key, x = padding_and_sampling(mine, self.n_candidates, l, rng)
        reports = grr_pairs(key, x, self.n_candidates + l, self.ledger.round_epsilon(round_index), rng)
        return ReportBatch(reports.offsets, reports.positions, reports.symbols, users.batch_id)

    def accumulate_round(self, round_index, counts, reports):
        if round_index in (0, 1):
            oracle = self.olh if round_index == 0 else self.sizes_olh
            counts[0] += reports.n_reports
            counts[1:] += oracle.support(reports.a, reports.b, reports.values)
            return counts
        return accumulate_symbols(counts, reports, self.n_candidates + self.max_size, (1, -1))

    def output_probabilities(self, pairs, round_index: int = 0, state=None) -> np.ndarray:
        """Round 1: OLH of one sampled pair's key. Round 2: OLH of the
        number of candidate keys held (0 … 2t). Round 3: padding-and-sampling
        of the candidate pairs with the chosen ``l``, then GRR over the
        ``n_candidates + l`` keys' pairs."""
        if round_index == 0:
            return self.olh_probabilities(self.olh, self.one_pair_distribution(pairs))
        rank = state.broadcast.astype(np.int64)
        mine = [(int(rank[k]), v) for k, v in pairs if rank[k] >= 0]
        if round_index == 1:
            size = np.zeros(self.n_candidates + 1)
            size[len(mine)] = 1.0
            return self.olh_probabilities(self.sizes_olh, size)
        l = int(state.get("padding"))
        own = padding_sampling_distribution(mine, self.n_candidates, l).ravel()
        return self.grr_pair_probabilities(own, self.n_candidates + l, self.ledger.round_epsilon(round_index))

    def choose_padding(self, counts: np.ndarray) -> int:
        """Smallest ``l >= 1`` whose estimated cumulative share of users with
        ``|S ∩ TKS| <= l`` exceeds ``coverage`` (SPEC.md §4, users without a
        candidate key included).

        The OLH size histogram is made a distribution by Norm-Sub (Wang et
        al. 2020): clipping negatives alone would leave the noise of the many
        empty large sizes as positive mass and push ``l`` up."""
        cumulative = np.cumsum(self.size_distribution(counts))
        return int(np.clip(np.searchsorted(cumulative, self.coverage, side="right"), 1, self.max_size))

    def size_distribution(self, counts: np.ndarray) -> np.ndarray:
        """The estimated shares of users holding ``0 … 2t`` candidate
        keys (group 2's OLH, made a distribution by Norm-Sub)."""
        n = max(int(counts[0]), 1)
        return norm_sub(self.sizes_olh.estimate(counts[1:], n) / n)

    def sizes_state(self, counts: np.ndarray) -> tuple:
        """Round 2's protocol state: the chosen ``l`` and the share of the
        candidate pairs' mass it keeps (``kept_share``), both from the
        estimated sizes (under LDP: no raw data involved)."""
        l = self.choose_padding(counts)
        return ("kept_share", self.kept_share(counts, l)), ("padding", l)

    def kept_share(self, counts: np.ndarray, l: int) -> float:
        """``kappa = sum_s h_s min(s, l) / sum_s h_s s`` (``truncation.py``)
        from OLH's unbiased size shares ``h_s`` up to the largest size ``S``
        whose tail share ``sum_{s >= S} h_s`` is above 2 of its s.d. (beyond,
        the shares are noise, and their noise weighs as ``s`` in the
        denominator: over all of ``0 … 2t``, or Norm-Sub's shares, Clothing at
        eps 1 gave 0.06 where eps 4 gave 0.70), with its delta-method s.e.; 1
        (no correction) where that s.e. exceeds ``KEPT_SE_MAX`` -- the 10 %
        group cannot tell the share, and a noisy ``1/kappa`` would multiply
        every frequency's error."""
        n = max(int(counts[0]), 1)
        share = self.sizes_olh.estimate(counts[1:], n) / n
        var = self.sizes_olh.variance(n, np.clip(share, 0.0, 1.0))
        tail, tail_var = np.cumsum(share[::-1])[::-1], np.cumsum(var[::-1])[::-1]
        seen = np.flatnonzero(tail > 2.0 * np.sqrt(tail_var))
        if not len(seen) or seen[-1] <= l:
            return 1.0                            # no size above l is told apart from none
        share, var = share[:seen[-1] + 1], var[:seen[-1] + 1]
        sizes = np.arange(len(share))
        mass, kept = float(share @ sizes), float(share @ np.minimum(sizes, l))
        if mass <= 0:
            return 1.0
        kappa = kept / mass
        weights = (np.minimum(sizes, l) - kappa * sizes) / mass
        se = float(np.sqrt(weights ** 2 @ var))
        if not se <= KEPT_SE_MAX:
            return 1.0
        return float(np.clip(kappa, l / self.n_candidates, 1.0))     # at most 2t candidates each

    def advance(self, round_index, state, counts):
        if round_index == 0:
            return self.olh_state(counts, missing_frequency=True)
        if round_index == 1:
            return ProtocolState(2, state.broadcast, False, self.epsilon, state.estimates, self.sizes_state(counts))
        l = int(state.get("padding"))
        est = self.final_estimates(state, counts, self.n_candidates + l, scale=l,
                                   kept_share=float(state.get("kept_share", 1.0)))
        return ProtocolState(3, state.broadcast, True, self.epsilon, est, state.extra)

    def config(self, round_index=None) -> Mapping:
        return {**super().config(round_index), "coverage": self.coverage}
