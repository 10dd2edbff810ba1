"""The one-round PrivKV estimators: PrivKV-A's N1*, N_1* are unbiased (Sun
et al. 2019 Theorem 2) where PrivKV's mean is shrunk by theta; PrivKV's
frequency is unbiased with the delta-method s.e. (Ye et al. 2019 Alg. 4)
(SPEC.md §1; Ye et al. 2019; bands in privkv_helpers.py).
"""
import functools
import math

import numpy as np
import pytest

from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms.estimation.truth import truth_from_counts
from kvldp.mechanisms.kv.privkv import (
    PrivKV,
    PrivKVA,
    lpp_split,
    privkv_a_counts,
    privkv_mean,
)
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.privacy.randomness import batch_rng
from ldp_audit import keep
from privkv_helpers import tabular_users, theta
from tolerances import Z, z_scores

# =====================================================================
# 1. PrivKV-A: N1*, N_1* are unbiased (Sun et al. 2019 Theorem 2)
# =====================================================================
A_KEY_PROBS = [0.0, 0.05, 0.15, 0.3, 0.5, 0.8]
A_KEY_MEANS = [0.0, -0.8, 0.9, -0.2, 0.4, 0.0]
A_N, A_R = 60_000, 80


@functools.cache
def privkv_a_repeats(eps, key_share, R=A_R):
    """R repeats of PrivKV-A's client step on one fixed population:
    per repeat (N1*/M, N_1*/M, frequency_raw, mean_raw, (N1*, N_1*, M))."""
    users = tabular_users(A_N, A_KEY_PROBS, A_KEY_MEANS, 0.5, seed=11)
    d = len(A_KEY_PROBS)
    mech = PrivKVA(d, eps, key_share=key_share)
    out = []
    for r in range(R):
        counts = mech.accumulate(mech.new_counts(), mech.perturb(users, batch_rng(3000 + r, 0)))
        N1, N_1, M = privkv_a_counts(lpp_split(counts, d), mech.p1, mech.p2)
        est = mech.estimate(counts)
        out.append((N1 / M, N_1 / M, est, (N1, N_1, M), lpp_split(counts, d)))
    return users, mech, out


@pytest.mark.parametrize("eps, key_share", [(2.0, 0.5), (1.0, 0.3)])
def test_privkv_a_counts_are_unbiased(eps, key_share):
    """Given the M users who sampled key k, E[N1* | M, Disc] = N1 (their
    number holding k with Disc(v) = +1). The M samplers are a uniformly random
    subset (every user draws j i.i.d. uniform), so E[N1/M] = (1/n) sum over
    holders of P(Disc(v) = +1) = (1/n) sum (1 + v)/2, i.e. f_k (1 + m_k)/2;
    likewise N_1*/M -> f_k (1 - m_k)/2. Key 0 is held by nobody (rates 0)."""
    users, mech, runs = privkv_a_repeats(eps, key_share)
    d, n = mech.d, users.n_users
    rate_plus = np.bincount(users.keys, weights=(1 + users.values) / 2, minlength=d) / n
    rate_minus = np.bincount(users.keys, weights=(1 - users.values) / 2, minlength=d) / n
    f, m = truth_from_counts(np.concatenate([[n], np.bincount(users.keys, minlength=d),
                                             np.bincount(users.keys, weights=users.values, minlength=d)]), d)
    np.testing.assert_allclose(rate_plus[1:], f[1:] * (1 + m[1:]) / 2, rtol=1e-12)
    assert rate_plus[0] == rate_minus[0] == 0
    z_plus = z_scores([r[0] for r in runs], rate_plus)
    z_minus = z_scores([r[1] for r in runs], rate_minus)
    assert np.all(np.abs(z_plus) < Z), z_plus
    assert np.all(np.abs(z_minus) < Z), z_minus
    # the test can tell a wrong estimator: PrivKV's Alg. 4 count n1*, which
    # calibrates the value bit only, is rejected by > 10 s.e. on every key
    naive = []
    for *_, stack in runs:
        N = stack[0] + stack[1]
        naive.append(((mech.p2 - 1) * N + stack[0]) / (2 * mech.p2 - 1) / stack.sum(axis=0))
    z_naive = z_scores(naive, rate_plus)
    assert np.all(np.abs(z_naive) > 10), z_naive


@pytest.mark.slow
def test_privkv_a_counts_are_unbiased_high_power():
    """R = 800 (~6 s): the per-key s.e. of the rate drops to ~0.0008, so a
    2% error in N1*'s scale (0.008 on the largest rates, ~0.4) is > 9 s.e.:
    the 4.5 s.e. band would reject it with a wide margin."""
    users, mech, runs = privkv_a_repeats(2.0, 0.5, R=800)
    d, n = mech.d, users.n_users
    for i, sign in ((0, 1), (1, -1)):
        rate = np.bincount(users.keys, weights=(1 + sign * users.values) / 2, minlength=d) / n
        samples = np.array([r[i] for r in runs])
        assert np.all(np.abs(z_scores(samples, rate)) < Z)
        assert np.all(samples.std(axis=0, ddof=1) / math.sqrt(len(runs)) < 0.001)
        big = rate > 0.35
        assert big.any()
        assert np.all(np.abs(z_scores(samples, 1.02 * rate)[big]) > 2 * Z)


def test_privkv_a_estimate_uses_the_unbiased_counts():
    """estimate() is f = (N1* + N_1*)/M and m = (N1* - N_1*)/(N1* + N_1*)
    (raw); the clipped outputs clip N1*, N_1* into [0, M] first. The mean is
    null where f <= 0 (no holders to average over)."""
    _, _, runs = privkv_a_repeats(2.0, 0.5)
    for _, _, est, (N1, N_1, M), _ in runs[:5]:
        np.testing.assert_allclose(est.frequency_raw, (N1 + N_1) / M, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(est.mean_raw, (N1 - N_1) / (N1 + N_1), rtol=1e-12, atol=1e-15)
        c1, c_1 = np.clip(N1, 0, M), np.clip(N_1, 0, M)
        with np.errstate(divide="ignore", invalid="ignore"):
            m_clip = np.where(c1 + c_1 != 0, (c1 - c_1) / (c1 + c_1), 0.0)
        estimable = N1 + N_1 > 0
        np.testing.assert_allclose(est.mean, np.where(estimable, np.clip(m_clip, -1, 1), np.nan),
                                   rtol=1e-12, atol=1e-15)
        assert np.all(np.abs(est.mean[estimable]) <= 1) and np.all((est.frequency >= 0) & (est.frequency <= 1))


def test_privkv_mean_on_the_same_reports_is_shrunk_by_theta():
    """Why PrivKV-A exists: on the same reports PrivKV's Alg. 4 mean (uniform
    fake, E[Disc(m~)] = 0) has expectation (1 - theta) m (Theorem 5.3, first
    round, m~ = 0) -- within 4.5 s.e. per key -- not m: on the keys with
    |m| >= 0.4 it misses m by > 10 s.e."""
    users, mech, runs = privkv_a_repeats(2.0, 0.5)
    d, n = mech.d, users.n_users
    f, m = truth_from_counts(np.concatenate([[n], np.bincount(users.keys, minlength=d),
                                             np.bincount(users.keys, weights=users.values, minlength=d)]), d)
    m = np.nan_to_num(m)                       # key 0: nobody holds it, theta = 1
    th = theta(f, mech.p1)
    naive = np.array([privkv_mean(stack, mech.p2, clip=False) for *_, stack in runs])
    z = z_scores(naive, (1 - th) * m)
    assert np.all(np.abs(z) < Z), z
    far = np.abs(m) >= 0.4
    assert far.sum() >= 2
    assert np.all(np.abs(z_scores(naive, m)[far]) > 10)


# =====================================================================
# 2. PrivKV: frequency unbiased, frequency_se is the delta-method s.d.
# =====================================================================
KV_D, KV_N, KV_R = 10, 100_000, 200


@functools.cache
def privkv_repeats(eps):
    data = SyntheticDataset("uu", n_users=KV_N, d=KV_D, seed=4)
    mech = PrivKV(KV_D, eps)
    runs = [run_local(mech, data, seed=500 + r) for r in range(KV_R)]
    return mech, runs


def test_privkv_frequency_is_unbiased():
    """Alg. 4: E[f'|M] = f p1 + (1-f)(1-p1), so f_hat = (p1 - 1 + f')/(2 p1 - 1)
    is unbiased. Average of R = 200 raw estimates within 4.5 s.e. per key,
    s.e. = sqrt(sum of the reported frequency_se^2)/R."""
    _, runs = privkv_repeats(2.0)
    f, _ = runs[0].true_values(KV_D)
    fr = np.array([r.estimates.frequency_raw for r in runs])
    se = np.sqrt(np.sum([r.estimates.frequency_se ** 2 for r in runs], axis=0)) / KV_R
    z = (fr.mean(axis=0) - f) / se
    assert np.all(np.abs(z) < Z), z
    # sanity of the unit test itself: one run's error is far above the s.e.
    assert np.all(se < runs[0].estimates.frequency_se / 10)


def test_privkv_frequency_se_matches_empirical_sd():
    """frequency_se (delta method over the per-key multinomial) is, for this
    linear-in-f' estimator, sqrt(f'(1-f')/M)/(2 p1 - 1) -- checked exactly --
    and within +-25% of the empirical s.d. of f_hat over R = 200 repeats.
    The s.e. of a sample s.d. from R normal draws is s.d./sqrt(2(R-1)) = 5.0%,
    so 25% is 5 s.e. per key (Bonferroni over 10 keys); pooled over the keys
    (10 x 199 d.o.f.: 1.6%) the ratio must be within +-8%."""
    _, runs = privkv_repeats(2.0)
    for r in runs[:3]:
        stack = lpp_split(r.counts, KV_D)
        M = stack.sum(axis=0)
        fp = (stack[0] + stack[1]) / M
        np.testing.assert_allclose(r.estimates.frequency_se,
                                   np.sqrt(fp * (1 - fp) / M) / (2 * keep(1.0) - 1), rtol=1e-6)
    fr = np.array([r.estimates.frequency_raw for r in runs])
    emp = fr.std(axis=0, ddof=1)
    reported = np.sqrt(np.mean([r.estimates.frequency_se ** 2 for r in runs], axis=0))
    ratio = reported / emp
    assert np.all(np.abs(ratio - 1) < 0.25), ratio
    pooled = math.sqrt(np.mean(reported ** 2) / np.mean(emp ** 2))
    assert abs(pooled - 1) < 0.08, pooled
