"""The truncation correction: frequencies of the pairs' whole mass from
mechanisms that report one sampled pair per user.

Padding-and-sampling at ``l`` (PCKV §4.1, KS-UE, KS-Adap's third group)
reports each of a user's pairs w.p. ``1/max(|S|, l)`` and scales by ``l``;
KS-GRR's second group reports one of its pairs uniformly (``l = 1``). So
(``frequency/padding.py``)

    E[f_hat_k] = (1/n) sum over holders i of k of  l / max(|S_i|, l),

which sums over the keys to ``kappa sum_k f_k`` with the kept share

    kappa = sum_s h[s] min(s, l) / sum_s h[s] s        (``kept_share``)

of the set-size histogram ``h``. The correction divides every frequency --
the main estimate, the paper's raw estimate, its s.e., the interval's
ends and the measured total (``Estimates.frequency_total``) -- by ``kappa`` (the
main estimate and interval clipped into ``[0, 1]`` again), as the last
step of post-processing (issue 43: PCKV at MovieLens' ``l = 16`` lost
85 % of the mass, KS-GRR on Clothing 45 %).

Under the assumption that each key's holders hold as many pairs, on
average, as the average pair's holder, the corrected estimate is unbiased:
exact when all users hold the same number of pairs; a key held mostly by
heavy users stays under-counted, one held by light users over-counted.
The s.e. is the perturbation's, scaled; it does not include that bias.
Means are ratios of the same reports and need no correction.

Where ``kappa`` comes from: for PCKV, KS-UE and KS-GRR the ingest side
measures ``h`` from the raw data (as ``--padding auto`` does, a public
parameter outside the epsilon guarantee) and writes ``kept_share`` into the
reports' configuration; KS-Adap estimates ``h`` under LDP (its second
group) and carries ``kappa`` in its protocol state. ``kappa = 1`` (nobody
truncated, or the sizes unknown) changes nothing.

The frequency status of a corrected key is ``truncated`` (estimate, s.e.
and interval given); the output records carry ``padding`` and
``kept_share`` so that a reader sees the ``l`` used and the share lost.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from kvldp.mechanisms.base import STATUS_OK, STATUS_TRUNCATED, Estimates


def corrected(est: Estimates) -> Estimates:
    """``est`` (post-processed, intervals set) with its frequencies divided
    by ``est.kept_share``; ``est`` itself when nothing was lost."""
    kappa = float(est.kept_share)
    if kappa >= 1.0:
        return est
    if (est.frequency_status == STATUS_TRUNCATED).any():
        raise ValueError("these estimates are corrected for truncation already")

    def scaled(values, clip: bool):
        if values is None:
            return None
        out = np.asarray(values, dtype=np.float64) / kappa
        return np.minimum(out, 1.0) if clip else out

    status = est.frequency_status.copy()
    status[status == STATUS_OK] = STATUS_TRUNCATED
    total, total_se = est.frequency_total, est.frequency_total_se
    return dataclasses.replace(
        est, frequency_total=None if total is None else total / kappa,
        frequency_total_se=None if total_se is None else total_se / kappa,
        frequency=scaled(est.frequency, True), frequency_raw=scaled(est.frequency_raw, False),
        frequency_se=scaled(est.frequency_se, False), frequency_lo=scaled(est.frequency_lo, True),
        frequency_hi=scaled(est.frequency_hi, True), frequency_status=status)
