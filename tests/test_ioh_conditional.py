"""IOH's conditional queries converge on correlated data: within the
reported s.e. of the truth at 50k and 800k users, s.e. shrinking like
1/sqrt(n), and the marginal query as IOH.estimate
(SPEC.md §2; Sun et al. 2019 §V; Sun et al. 2021 §3; notation and bands
in ioh_helpers.py).
"""
import functools
import math

import numpy as np
import pytest

from ioh_helpers import all_queries
from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms.kv.ioh import IOH
from kvldp.mechanisms.kv.query import HELD, NOT_HELD, CellTable, pattern_truth, true_conditional
from kvldp.mechanisms.privacy.randomness import batch_rng
from tolerances import Z

# =====================================================================
# 1. Conditional queries converge on correlated data
# =====================================================================
CONV_D, CONV_EPS, CONV_SEED = 5, 4.0, 2
CONV_KEYS = [0, 2, 3]
CONV_SIZES = (50_000, 800_000)
CONV_CASES = [(v, keys) for keys in ((0, 2, 3), (0, 1, 2, 3)) for v in ("oue", "sue")]


@functools.cache
def conv_runs(variant, keys):
    """Per size: (CellTable, pattern truth). 'corr' latent-class data (3
    classes; holding and values correlated across keys; d = 5, key
    frequencies 0.31, 0.14, 0.38, 0.20 for keys 0, 1, 2, 3); the 50k users are the first batch of the 800k
    ones; fresh perturbation seeds per size."""
    out = []
    k = len(keys)
    for i, n in enumerate(CONV_SIZES):
        data = SyntheticDataset("corr", n_users=n, d=CONV_D, seed=CONV_SEED)
        mech = IOH(CONV_D, CONV_EPS, variant, ioh_keys=list(keys))
        counts, truth = mech.new_counts(), np.zeros(2 ** k * (1 + k))
        for users in data.batches():
            mech.accumulate(counts, mech.perturb(users, batch_rng(4400 + i, users.batch_id)))
            truth += pattern_truth(users, list(keys), CONV_D)
        assert counts[0] == n and truth[:2 ** k].sum() == n
        out.append((CellTable.from_counts(mech, counts), truth))
    return out


@pytest.mark.parametrize("variant, keys", CONV_CASES)
def test_conditional_estimates_converge(variant, keys):
    """Every query (k targets x every held / not-held condition on the
    other keys: 27 for k = 3, 108 for k = 4) at n = 50k and 800k: every raw
    conditional frequency and mean is within 4.5 reported s.e. of the truth
    (pattern_truth / true_conditional; the mean's target is E[Disc(v)] = v);
    the median absolute error over the queries shrinks (the median, not the
    sum of squares: a query whose condition few users meet has an s.e. 10-100x
    the others', and one such error can outweigh the rest at either size). The data really are
    correlated: at 800k some conditional frequency and some conditional mean
    differ from the key's marginal (estimated) by > 6 s.e. And the check
    has power: the joint share F(C, k held)/n -- the conditional frequency
    with the wrong denominator -- misses > 3/4 of the conditioned queries by
    > 10 s.e. (it equals f * F(C)/n, so it is close only where f is small
    and C holds most users)."""
    k = len(keys)
    errs = []
    for table, truth in conv_runs(variant, keys):
        ef, em = [], []
        n = truth[:2 ** k].sum()
        for t, g in all_queries(k):
            res = table.conditional(t, g)
            f, m, inside = true_conditional(truth, k, t, g)
            assert inside > 0.005 * n
            assert abs(res.frequency_raw - f) < Z * res.frequency_se, (t, g, res, f)
            assert abs(res.mean_raw - m) < Z * res.mean_se, (t, g, res, m)
            ef.append(abs(res.frequency_raw - f))
            em.append(abs(res.mean_raw - m))
        errs.append((np.median(ef), np.median(em)))
    assert errs[1][0] < errs[0][0] and errs[1][1] < errs[0][1], errs
    table, truth = conv_runs(variant, keys)[1]
    n = truth[:2 ** k].sum()
    wrong = []
    for t, g in all_queries(k):
        if g:
            X = table.select({**{j: HELD if h else NOT_HELD for j, h in g.items()}, t: HELD})[0]
            res = table.conditional(t, g)
            wrong.append(abs(X / n - true_conditional(truth, k, t, g)[0]) > 10 * res.frequency_se)
    assert np.mean(wrong) > 0.75, np.mean(wrong)
    gap_f, gap_m = [], []
    for t, g in all_queries(k):
        a, b = table.conditional(t, g), table.conditional(t, {})
        gap_f.append(abs(a.frequency_raw - b.frequency_raw) / math.hypot(a.frequency_se, b.frequency_se))
        gap_m.append(abs(a.mean_raw - b.mean_raw) / math.hypot(a.mean_se, b.mean_se))
    # without correlation each gap is ~|N(0,1)| (less: hypot overstates the
    # s.d. of a difference of positively correlated estimates); the largest of
    # ~100 exceeds 6 w.p. ~2e-7, so > 6 is the data's correlation, not noise
    assert max(gap_f) > 6 and max(gap_m) > 6, (max(gap_f), max(gap_m))


def se_reliable(table, t, g, scale):
    """A plug-in s.e. is itself an estimate: it moves with the errors of the
    cell sums it is computed from. Predicted relative error of the s.e. at a
    size ``scale`` times smaller: scale * max(sd(X)/X, sd(Z)/Z) for f (X =
    users in the condition holding t, Z = not holding) and
    scale * max(sd(P)/P, sd(N)/N) for m (P, N = holders at +1 / -1),
    computed from the large run. (Measured over 30 seeds it overstates the
    s.e.'s actual relative s.d. by ~2x.)"""
    cond = {j: HELD if h else NOT_HELD for j, h in g.items()}
    X, vX = table.select({**cond, t: HELD})
    Zc, vZ = table.select({**cond, t: NOT_HELD})
    P, vP = table.select({**cond, t: (2,)})
    N, vN = table.select({**cond, t: (0,)})
    def rel(v, x):     # an estimated count <= 0 has no usable relative error (its s.e. is not reliable)
        return math.sqrt(v) / x if x > 0 else math.inf
    return scale * max(rel(vX, X), rel(vZ, Zc)), scale * max(rel(vP, P), rel(vN, N))


@pytest.mark.parametrize("variant, keys", CONV_CASES)
def test_conditional_standard_errors_shrink_like_root_n(variant, keys):
    """16x the users: the reported s.e. shrink by sqrt(16) = 4 within +-20%,
    on every query whose plug-in s.e. is stable enough at 50k for +-20% to
    be >= 4 of its predicted relative errors (<= 5%; see se_reliable): 25
    and 23 of the 54 s.e. for k = 3, more for k = 4."""
    (small, _), (large, _) = conv_runs(variant, keys)
    checked = 0
    for t, g in all_queries(len(keys)):
        rf, rm = se_reliable(large, t, g, scale=4.0)
        a, b = small.conditional(t, g), large.conditional(t, g)
        for ok, sa, sb in ((rf <= 0.05, a.frequency_se, b.frequency_se), (rm <= 0.05, a.mean_se, b.mean_se)):
            if ok:
                assert abs(sa / sb / 4 - 1) < 0.2, (t, g, sa / sb)
                checked += 1
    assert checked >= 10, checked


def test_ioh_estimate_is_the_marginal_query():
    """IOH.estimate reports each chosen key's unconditional query."""
    data = SyntheticDataset("corr", n_users=20_000, d=CONV_D, seed=CONV_SEED)
    mech = IOH(CONV_D, 2.0, "oue", ioh_keys=CONV_KEYS)
    users = data.batch(0, 0, 20_000)
    counts = mech.accumulate(mech.new_counts(), mech.perturb(users, batch_rng(1, 0)))
    est = mech.estimate(counts)
    table = CellTable.from_counts(mech, counts)
    assert est.d == 3 and est.n_reports == 20_000
    for j in range(3):
        np.testing.assert_array_equal(
            [est.frequency[j], est.mean[j], est.frequency_raw[j], est.mean_raw[j], est.frequency_se[j],
             est.mean_se[j]], table.marginal(j))
        res = table.conditional(j, {})
        P, N, Zc = (max(table.select({j: s})[0], 0.0) for s in ((2,), (0,), (1,)))
        assert res.frequency == pytest.approx(min(max((P + N) / (P + N + Zc), 0), 1), rel=1e-12)
        assert res.mean == pytest.approx((P - N) / (P + N), rel=1e-12)
