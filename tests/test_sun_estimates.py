"""Frequencies and means of F2M, KVUE and KVOH: unbiased frequencies, F2M's
consistent mean, the two errata (the sign of ``m``; ``eps2`` in F2M's
``m_all``), heavy-tailed raw means and clipping
(SPEC.md §2; Sun et al. 2019 §IV; notation and bands in sun_helpers.py).
"""
import functools
import math

import numpy as np
import pytest

from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.estimation.truth import truth_counts, truth_from_counts
from kvldp.mechanisms.kv.sun import F2M, KVOH, KVUE, ratio_estimates, states_of
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.privacy.randomness import batch_rng
from ldp_audit import keep
from sun_helpers import VAR_EPS, VAR_KEYS, VAR_N, VAR_R, state_repeats
from tolerances import Z, binomial_sigma, z_scores


def f2m_by_hand(stack, eps1, eps2, default=1.0, m_all_eps=None):
    """Alg. 3 + Eq. (2). Symbols (-2, -1, 1, 2) = value * (1 + key bit).
    f = (f' - (1 - p1))/(2 p1 - 1) with f' the share of key bits 1;
    m_all = (e^eps2 + 1)/(e^eps2 - 1) (M1 - M_1)/(M1 + M_1) (SPEC erratum:
    the paper prints eps; ``m_all_eps`` overrides it to show the paper's
    version); m = (m_all - (1 - f) v_default)/f."""
    p1 = keep(eps1)
    M = stack.sum(axis=0)
    f = ((stack[0] + stack[3]) / M - (1 - p1)) / (2 * p1 - 1)
    e2 = math.exp(eps2 if m_all_eps is None else m_all_eps)
    M1, M_1 = stack[2] + stack[3], stack[0] + stack[1]
    m_all = (e2 + 1) / (e2 - 1) * (M1 - M_1) / (M1 + M_1)
    return f, (m_all - (1 - f) * default) / f


# =====================================================================
# 1. Frequencies unbiased; F2M's mean consistent; the errata
# =====================================================================
@pytest.mark.parametrize("cls", [KVUE, KVOH, F2M])
def test_frequency_is_unbiased(cls):
    """Given the M samplers of key j, E[f_hat | M] = H/M (H = holders among
    them: the state counts / key bit are calibrated without bias); the M
    samplers are a uniformly random subset of the users, so E[H/M] = f
    exactly. Average raw f over R = 1500 runs within 4.5 s.e. of f = (0.01,
    0.5). The uncalibrated share of "held" reports is rejected by > 10 s.e.
    (for F2M only at f = 0.01: its key-bit share f p1 + (1-f)(1-p1) is 1/2 at f = 1/2)."""
    mech, counts, _ = state_repeats(cls)
    f_true = np.array([sum(k) for k in VAR_KEYS]) / VAR_N
    fr = np.array([mech.estimate(c).frequency_raw for c in counts[:VAR_R]])
    z = z_scores(fr, f_true)
    assert np.all(np.abs(z) < Z), z
    stacks = np.array([mech.stack(c) for c in counts])
    if cls is KVUE:
        naive = (stacks[:, 0] + stacks[:, 2]) / stacks.sum(axis=1)
    elif cls is KVOH:
        masks = np.arange(8)
        naive = stacks[:, ((masks & 1) == 1) | ((masks & 4) == 4)].sum(axis=1) / stacks.sum(axis=1)
    else:
        naive = (stacks[:, 0] + stacks[:, 3]) / stacks.sum(axis=1)
    z_naive = np.abs(z_scores(naive, f_true))
    assert z_naive[0] > 10, z_naive
    if cls is not F2M:       # F2M's key-bit share f p1 + (1-f)(1-p1) is 1/2 at f = 1/2
        assert z_naive[1] > 10, z_naive


def test_f2m_estimates_are_the_papers_formulas():
    mech, counts, _ = state_repeats(F2M)
    for c in counts[:5]:
        est = mech.estimate(c)
        f, m = f2m_by_hand(mech.stack(c), VAR_EPS / 2, VAR_EPS / 2)
        np.testing.assert_allclose(est.frequency_raw, f, rtol=1e-12)
        np.testing.assert_allclose(est.mean_raw, m, rtol=1e-10)


F2M_D = 4
F2M_SIZES = (100_000, 1_600_000)


@functools.cache
def f2m_runs(eps):
    """One F2M run per size on the 'multi' data (1 + Poisson(1) keys among
    4, f = 0.33 .. 0.72); the small set is the first batch of the large one."""
    out = []
    for i, n in enumerate(F2M_SIZES):
        data = SyntheticDataset("multi", n_users=n, d=F2M_D, seed=3, lam=1.0)
        out.append(run_local(F2M(F2M_D, eps), data, seed=9100 + i))
    return out


def test_f2m_mean_is_consistent():
    """F2M's m = (m_all - (1 - f) v_default)/f is a ratio (consistent, not
    unbiased). At n = 100k and 1.6M (d = 4, eps = 2) every key's raw mean
    and frequency are within 4.5 reported s.e. of the truth; the s.e. shrink
    by sqrt(16) = 4 (+-20%); the squared error summed over keys shrinks."""
    small, large = f2m_runs(2.0)
    errs = []
    for res in (small, large):
        f, m = res.true_values(F2M_D)
        e = res.estimates
        assert np.all(np.abs(e.mean_raw - m) < Z * e.mean_se), (e.mean_raw, m, e.mean_se)
        assert np.all(np.abs(e.frequency_raw - f) < Z * e.frequency_se)
        errs.append(((e.mean_raw - m) ** 2).sum())
    assert errs[1] < errs[0], errs
    for attr in ("mean_se", "frequency_se"):
        ratio = getattr(small.estimates, attr) / getattr(large.estimates, attr)
        assert np.all(np.abs(ratio / 4 - 1) < 0.2), (attr, ratio)


def test_f2m_m_all_uses_eps2_not_eps():
    """SPEC erratum: the paper's m_all factor (e^eps + 1)/(e^eps - 1) with
    the full eps shrinks m_all (here by 0.61 at eps = 2) and biases m by
    -0.39 (1 - f)/f + (0.61 - 1) m: off by > 10 s.e. on every key at n = 1.6M,
    while the eps2 version (what estimate() returns) is within 4.5 s.e."""
    eps = 2.0
    _, large = f2m_runs(eps)
    _, m = large.true_values(F2M_D)
    stack = F2M(F2M_D, eps).stack(large.counts)
    _, m_right = f2m_by_hand(stack, eps / 2, eps / 2)
    _, m_paper = f2m_by_hand(stack, eps / 2, eps / 2, m_all_eps=eps)
    se = large.estimates.mean_se
    np.testing.assert_allclose(large.estimates.mean_raw, m_right, rtol=1e-10)
    assert np.all(np.abs(m_right - m) < Z * se)
    assert np.all(np.abs(m_paper - m) > 10 * se), (m_paper, m, se)


@functools.cache
def sign_population():
    """n = 200k, d = 2: key 0 held by 30% with value +0.8 (Disc random,
    E[Disc] = 0.8), key 1 by 40% with value -0.5; independent."""
    rng = np.random.default_rng(17)
    n = 200_000
    held = rng.random((n, 2)) < [0.3, 0.4]
    _, keys = np.nonzero(held)
    values = np.where(keys == 0, 0.8, -0.5)
    return UserBatch(np.concatenate([[0], np.cumsum(held.sum(axis=1))]), keys, values)


@pytest.mark.parametrize("cls", [KVUE, KVOH])
def test_mean_sign_erratum(cls):
    """m = (N_2 - N_0)/(N_2 + N_0): a key with mean +0.8 is estimated
    positive, within 4.5 s.e. of 0.8. The paper's literal m = (N_A - N_B)/
    (N_A + N_B), with N_A the count of <1,-1> and N_B of <1,1> (its labels
    in §IV-D), flips the sign: ~-0.8, > 10 s.e. away."""
    users = sign_population()
    mech = cls(2, 2.0)
    counts = mech.accumulate(mech.new_counts(), mech.perturb(users, batch_rng(31, 0)))
    est = mech.estimate(counts)
    truth = truth_counts(users, 2)
    _, m = truth_from_counts(truth, 2)
    np.testing.assert_allclose(m, [0.8, -0.5], rtol=1e-9)      # truth sums are rounded to 2^-20
    assert est.mean_raw[0] > 0 and est.mean_raw[1] < 0
    assert np.all(np.abs(est.mean_raw - m) < Z * est.mean_se), (est.mean_raw, est.mean_se)
    N_A, _, N_B, _ = mech.state_counts(mech.stack(counts))
    paper = (N_A - N_B) / (N_A + N_B)
    np.testing.assert_allclose(paper, -est.mean_raw, rtol=1e-12)
    assert np.all(np.abs(paper - m) > 10 * est.mean_se)


# =====================================================================
# 2. Heavy-tailed raw means; clipping
# =====================================================================
@functools.cache
def sparse_runs(eps):
    """'uu' data, d = 100 (f ~ 0.01 per key, ~10 holders among each key's
    ~1000 samplers), n = 100k."""
    data = SyntheticDataset("uu", n_users=100_000, d=100, seed=3)
    return {cls: run_local(cls(100, eps), data, seed=4100) for cls in (KVUE, KVOH, F2M)}


@pytest.mark.parametrize("eps", [1.0, 2.0])
@pytest.mark.parametrize("cls", [KVUE, KVOH, F2M])
def test_raw_mean_heavy_tailed_clipped_mean_in_range(cls, eps):
    """SPEC: at f ~ 0.01 and eps <= 2 the ratio means are heavy-tailed; the
    raw estimate leaves [-1, 1] on some key (seeded), the clipped default
    never does, and the clipped frequency stays in [0, 1]. Where clipping
    does not bite the clipped mean is the raw one. The mean is null exactly
    where the estimated frequency is <= 0."""
    res = sparse_runs(eps)[cls]
    e = res.estimates
    estimable = e.frequency_raw > 0
    assert np.array_equal(np.isfinite(e.mean), estimable) and np.all(np.isfinite(e.frequency))
    assert np.all(np.abs(e.mean[estimable]) <= 1)
    assert np.all((e.frequency >= 0) & (e.frequency <= 1))
    assert np.abs(e.mean_raw).max() > 1, np.abs(e.mean_raw).max()
    _, m = res.true_values(100)
    mse_raw, mse_clip = np.mean((e.mean_raw - m) ** 2), np.mean((e.mean - m)[estimable] ** 2)
    assert mse_raw > 10 and mse_clip < mse_raw, (mse_clip, mse_raw)   # SPEC: raw MSE 10 .. 10^4 here
    assert mse_clip <= 4                                 # |m_hat - m| <= 2
    if cls is not F2M:
        N0, _, N2, M = cls(100, eps).state_counts(cls(100, eps).stack(res.counts))
        inside = (N0 >= 0) & (N2 >= 0) & (N0 <= M) & (N2 <= M) & (np.abs(e.mean_raw) <= 1)
        assert inside.any()
        np.testing.assert_allclose(e.mean[inside], e.mean_raw[inside], rtol=1e-12)
        np.testing.assert_allclose(e.frequency[inside], np.clip(e.frequency_raw[inside], 0, 1), rtol=1e-12)


def test_ratio_estimates_clip_counts_first():
    """PrivKV's clipping: N_0, N_2 into [0, M] before the ratios."""
    N0 = np.array([-5.0, 30.0, 120.0, 0.0])
    N2 = np.array([10.0, -3.0, 50.0, 0.0])
    M = np.array([100.0, 100.0, 100.0, 100.0])
    f, m = ratio_estimates(N0, N2, M, clip=True)
    np.testing.assert_allclose(f, [0.1, 0.3, 1.5, 0.0])
    np.testing.assert_allclose(m, [1.0, -1.0, (50 - 100) / 150, 0.0])
    f, m = ratio_estimates(N0, N2, M, clip=False)
    np.testing.assert_allclose(f, [0.05, 0.27, 1.7, 0.0])
    np.testing.assert_allclose(m, [15 / 5, -33 / 27, -70 / 170, 0.0])


def test_states_of():
    """state = key_bit * Disc(v) + 1: non-holders 1, holders of +-1 at 2 / 0,
    and a holder of v is at 2 with probability (1 + v)/2."""
    rng = np.random.default_rng(0)
    held = np.array([False, True, True, False])
    np.testing.assert_array_equal(states_of(held, np.array([0.0, 1.0, -1.0, 0.7]), rng), [1, 2, 0, 1])
    n, v = 200_000, 0.3
    s = states_of(np.ones(n, bool), np.full(n, v), np.random.default_rng(1))
    assert set(np.unique(s)) == {0, 2}
    p = (1 + v) / 2
    assert abs((s == 2).mean() - p) < Z * binomial_sigma(p, n)
