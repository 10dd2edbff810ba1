"""The PrivKV family (SPEC.md §1; Ye et al. 2019 Alg. 2-7, Theorems 5.1-6.1;
Sun et al. 2019 §III for PrivKV-A): estimators, round recursions, the
PrivKVM+ stopping rule, exact privacy audits and the budget ledger.

Statistical checks run a mechanism R times on *fixed* data with fresh
perturbation seeds and compare the average of an estimator with its
expectation. Unless said otherwise the standard error is the empirical s.d.
over the R repeats / sqrt(R), and the band is 4.5 s.e. per key (Bonferroni
over <= 10 keys: with a t distribution on R - 1 >= 39 d.o.f. P(|t| > 4.5)
< 1e-4 per key). Expectations are written out from the papers in this file,
never read back from the code under test.

A remark that recurs: with ``p = e^eps/(e^eps+1)``,
``f p - f - p + 1 = (1-f)(1-p)`` and ``2 f p - f - p + 1 = f p + (1-f)(1-p)``,
so Theorem 5.3's theta is the share of non-holders among the users whose
key bit comes out 1: the mean of one LPP round is (up to O(1/N) ratio
bias) ``theta * E[Disc(m~)] + (1 - theta) * m``.
"""
import functools
import math

import numpy as np
import pytest

from kvldp.mechanisms.base import ReportBatch, UserBatch
from kvldp.mechanisms.budget import BudgetExceeded, BudgetLedger, Share
from kvldp.datasets import InMemoryDataset, SyntheticDataset
from kvldp.mechanisms.truth import truth_from_counts
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.privkv import (FAKE_UNIFORM, PrivKV, PrivKVA, PrivKVMVirtual, lpp_output_probabilities,
                               lpp_perturb, lpp_split, privkv_a_counts, privkv_frequency, privkv_mean,
                               virtual_iterations)
from kvldp.mechanisms.privkvm import PrivKVM, PrivKVMPlus, expected_mean_recursion
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.randomness import batch_rng
from ldp_audit import all_users, log_worst_ratio

Z = 4.5


def keep(eps):
    """Randomised response keep probability e^eps/(e^eps+1), written out."""
    return math.exp(eps) / (math.exp(eps) + 1)


def theta(f, p):
    """Theorem 5.3 / Alg. 7: (f p - f - p + 1)/(2 f p - f - p + 1)."""
    f = np.asarray(f, dtype=np.float64)
    return (f * p - f - p + 1) / (2 * f * p - f - p + 1)


def z_scores(samples, truth):
    """(mean over repeats - truth) / (empirical s.d. / sqrt(R)), per key."""
    samples = np.asarray(samples, dtype=np.float64)
    R = samples.shape[0]
    se = samples.std(axis=0, ddof=1) / math.sqrt(R)
    return (samples.mean(axis=0) - truth) / se


def tabular_users(n, key_probs, key_means, spread, seed):
    """Hand-built multi-pair users: user i holds key k independently w.p.
    key_probs[k] with value clip(key_means[k] + N(0, spread)) -- so values
    include exact +-1 and interior points and Disc is genuinely random."""
    rng = np.random.default_rng(seed)
    d = len(key_probs)
    hold = rng.random((n, d)) < np.asarray(key_probs)[None, :]
    users_idx, keys = np.nonzero(hold)          # row-major: keys sorted per user
    values = np.clip(np.asarray(key_means)[keys] + rng.normal(0, spread, len(keys)), -1, 1)
    offsets = np.concatenate([[0], np.cumsum(hold.sum(axis=1))])
    return UserBatch(offsets, keys, values)


# =====================================================================
# 1. PrivKV-A: N1*, N_1* are unbiased (Sun et al. 2019 Theorem 2)
# =====================================================================
A_KEY_PROBS = [0.0, 0.05, 0.15, 0.3, 0.5, 0.8]
A_KEY_MEANS = [0.0, -0.8, 0.9, -0.2, 0.4, 0.0]
A_N, A_R = 60_000, 80


@functools.lru_cache(maxsize=None)
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
    users, mech, runs = privkv_a_repeats(2.0, 0.5)
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
# 7a. PrivKV: frequency unbiased, frequency_se is the delta-method s.d.
# =====================================================================
KV_D, KV_N, KV_R = 10, 100_000, 200


@functools.lru_cache(maxsize=None)
def privkv_repeats(eps):
    data = SyntheticDataset("uu", n_users=KV_N, d=KV_D, seed=4)
    mech = PrivKV(KV_D, eps)
    runs = [run_local(mech, data, seed=500 + r) for r in range(KV_R)]
    return mech, runs


def test_privkv_frequency_is_unbiased():
    """Alg. 4: E[f'|M] = f p1 + (1-f)(1-p1), so f_hat = (p1 - 1 + f')/(2 p1 - 1)
    is unbiased. Average of R = 200 raw estimates within 4.5 s.e. per key,
    s.e. = sqrt(sum of the reported frequency_se^2)/R."""
    mech, runs = privkv_repeats(2.0)
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
    mech, runs = privkv_repeats(2.0)
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


# =====================================================================
# 2. PrivKVM: E[m^(c)] follows Theorem 5.3's recursion
# =====================================================================
M_D, M_N, M_C, M_EPS, M_R = 10, 200_000, 3, 4.0, 50
# keys with frequencies 1..10 / 55 (0.018 .. 0.18): theta differs per key
M_KEY_PROBS = np.arange(1, M_D + 1) / np.arange(1, M_D + 1).sum()
M_KEY_MEANS = np.array([-0.9, 0.7, -0.4, 0.1, 0.95, -0.6, 0.3, -0.1, 0.5, -0.75])


@functools.lru_cache(maxsize=None)
def privkvm_population():
    rng = np.random.default_rng(21)
    keys = rng.choice(M_D, size=M_N, p=M_KEY_PROBS)
    values = np.clip(M_KEY_MEANS[keys] + rng.normal(0, 0.3, M_N), -1, 1)
    return InMemoryDataset("privkvm-test", UserBatch.single_pair(keys, values), [str(k) for k in range(M_D)])


@functools.lru_cache(maxsize=None)
def privkvm_repeats():
    data = privkvm_population()
    proto = PrivKVM(M_D, M_EPS, rounds=M_C)
    return data, proto, [run_local(proto, data, seed=900 + r) for r in range(M_R)]


def recursion_by_hand(m, f, ps, m0):
    """Theorem 5.3: E[m^(r)] = theta_r E[m^(r-1)] + (1 - theta_r) m, written
    with theta_r = (1-f)(1-p_r) / (f p_r + (1-f)(1-p_r))."""
    out = np.full_like(m, m0, dtype=np.float64)
    for p in ps:
        th = (1 - f) * (1 - p) / (f * p + (1 - f) * (1 - p))
        out = th * out + (1 - th) * m
    return out


def test_privkvm_round_probabilities_follow_pba():
    """PBA: round 1 keeps the key bit w.p. e^(eps/2)/(1+e^(eps/2)), later
    rounds spend no key budget, so p1 = 1/2 and theta = (f/2 - f - 1/2 + 1)/
    (f - f - 1/2 + 1) = 1 - f exactly; the value bit has eps/(2c) per round."""
    proto = PrivKVM(M_D, M_EPS, rounds=M_C)
    assert proto.p1(0) == pytest.approx(keep(M_EPS / 2), rel=1e-15)
    for r in range(1, M_C):
        assert proto.p1(r) == 0.5
        f = np.linspace(0, 1, 11)
        np.testing.assert_allclose(theta(f, proto.p1(r)), 1 - f, rtol=1e-15, atol=1e-15)
        np.testing.assert_allclose(expected_mean_recursion(np.full(11, 0.3), f, [0.5], 0.7),
                                   (1 - f) * 0.7 + f * 0.3, rtol=1e-14)
    for r in range(M_C):
        assert proto.p2(r) == pytest.approx(keep(M_EPS / (2 * M_C)), rel=1e-15)


def test_privkvm_expected_mean_follows_theorem_5_3():
    """R = 50 runs of PrivKVM (c = 3, eps = 4, n = 200k, d = 10, f from 0.018
    to 0.18) on fixed data. Round 1's fake m~ is uniform, so E[Disc(m~)] = 0
    = m_tilde0; later rounds' fake is Disc of the previous round's broadcast
    mean, and the round mean is linear in it, so expectations chain through
    the recursion. Per key and round (1, 2, 3) the average unclipped mean is
    within 4.5 empirical s.e. of the recursion. The broadcast is the clipped
    mean; the check asserts clipping never bit, so it equals the raw one."""
    data, proto, runs = privkvm_repeats()
    f, m = truth_from_counts(runs[0].truth, M_D)
    ps = [proto.p1(r) for r in range(M_C)]
    for r in range(M_C):
        expect = recursion_by_hand(m, f, ps[:r + 1], 0.0)
        np.testing.assert_allclose(expected_mean_recursion(m, f, ps[:r + 1], m_tilde0=0), expect, rtol=1e-12)
        means = []
        for res in runs:
            st = res.states[r]
            assert st.rounds_done == r + 1
            np.testing.assert_array_equal(st.broadcast, st.estimates.mean)
            np.testing.assert_array_equal(st.estimates.mean, st.estimates.mean_raw)   # no clipping
            means.append(st.estimates.mean_raw)
        z = z_scores(means, expect)
        assert np.all(np.abs(z) < Z), (r, z)
    # the final estimates are round c's mean with round 1's frequency
    for res in runs[:3]:
        np.testing.assert_array_equal(res.estimates.mean_raw, res.states[-1].estimates.mean_raw)
        np.testing.assert_array_equal(res.estimates.frequency_raw, res.states[0].estimates.frequency_raw)
        assert res.state.stopped and res.state.rounds_done == M_C


def test_privkvm_recursion_check_has_power():
    """The check above can fail: it fails as soon as one key is off by 4.5
    s.e., and the same round-3 averages are > 10 s.e. away on some key from
    two wrong recursions -- "later rounds do not move the mean"
    (E[m^(3)] = E[m^(1)]) and "every round keeps the key bit with round 1's
    p" (Alg. 7's virtual rounds: theta_2 = theta_3 = theta_1 instead of 1 - f).
    The first is a small effect: with theta = 1 - f the later rounds move
    E[m] by only ~2 f (1 - theta_1) m (SPEC.md: PrivKVM(c=3) stays close to PrivKV)."""
    data, proto, runs = privkvm_repeats()
    f, m = truth_from_counts(runs[0].truth, M_D)
    r3 = np.array([res.states[2].estimates.mean_raw for res in runs])
    p = proto.p1(0)
    for wrong in (recursion_by_hand(m, f, [p], 0.0), recursion_by_hand(m, f, [p, p, p], 0.0)):
        z = z_scores(r3, wrong)
        assert np.abs(z).max() > 10, z


# =====================================================================
# 3. Virtual iterations (Alg. 7, Theorem 6.1)
# =====================================================================
V_D, V_N, V_EPS, V_C, V_R = 10, 200_000, 4.0, 6, 40


@functools.lru_cache(maxsize=None)
def virtual_repeats():
    data = SyntheticDataset("uu", n_users=V_N, d=V_D, seed=8)
    mech = PrivKVMVirtual(V_D, V_EPS, rounds=V_C)
    return mech, [run_local(mech, data, seed=1300 + r) for r in range(V_R)]


def alg7(counts, eps, c, clip):
    """Algorithm 7 written out: p = e^(eps/2)/(1 + e^(eps/2)),
    theta = (f p - f - p + 1)/(2 f p - f - p + 1), m~ = 1,
    m^(c) = m~ + (m^(1) - m~)(1 - theta^c)/(1 - theta)."""
    stack = lpp_split(counts, V_D)
    p = math.exp(eps / 2) / (1 + math.exp(eps / 2))
    f = privkv_frequency(stack, p)
    m1 = privkv_mean(stack, keep(eps / 2), clip=clip)
    if clip:
        f = np.clip(f, 0, 1)
    th = (f * p - f - p + 1) / (2 * f * p - f - p + 1)
    return 1 + (m1 - 1) * (1 - th ** c) / (1 - th)


def test_virtual_iterations_equal_algorithm_7():
    """estimates.mean_raw is Alg. 7 on the raw (f_hat, m^(1)); estimates.mean
    is Alg. 7 on the clipped inputs, then clipped into [-1, 1]."""
    mech, runs = virtual_repeats()
    assert mech.p1 == pytest.approx(math.exp(V_EPS / 2) / (1 + math.exp(V_EPS / 2)), rel=1e-15)
    for res in runs:
        e = res.estimates
        np.testing.assert_allclose(e.mean_raw, alg7(res.counts, V_EPS, V_C, clip=False), rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(e.mean, np.clip(alg7(res.counts, V_EPS, V_C, clip=True), -1, 1),
                                   rtol=1e-12, atol=1e-14)
    # c = 1 is the identity (one real round, no virtual one)
    stack = lpp_split(runs[0].counts, V_D)
    m1 = privkv_mean(stack, mech.p2, clip=False)
    np.testing.assert_allclose(virtual_iterations(m1, privkv_frequency(stack, mech.p1), mech.p1, 1.0, 1), m1,
                               rtol=1e-14)
    # f -> 0: theta -> 1 and the geometric series tends to c terms
    out = virtual_iterations(np.array([0.2]), np.array([0.0]), mech.p1, 1.0, V_C)
    assert out[0] == pytest.approx(1 + (0.2 - 1) * V_C, rel=1e-12)


def test_virtual_iterations_theorem_6_1_in_expectation():
    """The one real round uses m~ = 1, so Disc(m~) = 1 and Theorem 5.3 gives
    E[m^(1)] = theta + (1 - theta) m; Theorem 6.1's closed form with the true
    f is then 1 + (E[m^(1)] - 1)(1 - theta^c)/(1 - theta) = m + theta^c (1 - m).

    The estimator plugs f_hat into the nonlinear S(f) = (1 - theta^c)/(1 - theta),
    so its expectation differs from the closed form by a second-order term
    bounded (delta method) by |S'| sd(m1) sd(f_hat) + |E m1 - 1| |S''| Var(f_hat)/2;
    the band is 4.5 empirical s.e. of the R = 40 average plus that bound
    (computed per key, ~5% of the band here)."""
    mech, runs = virtual_repeats()
    f, m = runs[0].true_values(V_D)
    p = mech.p1
    th = theta(f, p)
    closed = m + th ** V_C * (1 - m)
    # round 1 itself follows Theorem 5.3 with m~ = 1
    m1 = np.array([privkv_mean(lpp_split(r.counts, V_D), mech.p2, clip=False) for r in runs])
    z1 = z_scores(m1, th + (1 - th) * m)
    assert np.all(np.abs(z1) < Z), z1
    fr = np.array([r.estimates.frequency_raw for r in runs])
    mc = np.array([r.estimates.mean_raw for r in runs])

    def S(x):
        t = theta(x, p)
        return (1 - t ** V_C) / (1 - t)
    h = 1e-4
    S1 = (S(f + h) - S(f - h)) / (2 * h)
    S2 = (S(f + h) - 2 * S(f) + S(f - h)) / h ** 2
    sd_m1, sd_f = m1.std(axis=0, ddof=1), fr.std(axis=0, ddof=1)
    bias_bound = np.abs(S1) * sd_m1 * sd_f + np.abs(th + (1 - th) * m - 1) * np.abs(S2) * sd_f ** 2 / 2
    se = mc.std(axis=0, ddof=1) / math.sqrt(V_R)
    assert np.all(bias_bound < 0.2 * Z * se), (bias_bound, se)
    err = np.abs(mc.mean(axis=0) - closed)
    assert np.all(err < Z * se + bias_bound), (err, se, bias_bound)
    # and the band is narrow enough to tell c = 6 from c = 1 (the round-1 mean)
    assert np.all(np.abs(closed - (th + (1 - th) * m)) > 3 * (Z * se + bias_bound))


# =====================================================================
# 4. PrivKVM+: the F >= 0 stopping rule and the budget it spends
# =====================================================================
P_D, P_N, P_EPS, P_T, P_MAX = 10, 200_000, 4.0, 2.0, 6


@functools.lru_cache(maxsize=None)
def plus_run(a0, seed=77):
    data = SyntheticDataset("uu", n_users=P_N, d=P_D, seed=2)
    proto = PrivKVMPlus(P_D, P_EPS, t=P_T, a0=a0, max_rounds=P_MAX)
    return proto, run_local(proto, data, seed=seed)


def distances(result):
    """mean_k |m^(r) - m~^(r)| per executed round, m~^(1) = 1, m~^(r) = m^(r-1)."""
    out, prev = [], np.ones(P_D)
    for st in result.states:
        out.append(float(np.mean(np.abs(st.estimates.mean - prev))))
        prev = st.broadcast
    return out


def check_stop_rule(proto, res, a0, expected_stop):
    """Rounds 1..stop: F < 0 before the stop, F >= 0 (or max_rounds) at it;
    after the stop nothing is reported and nothing is spent."""
    stop = next(i for i, st in enumerate(res.states) if st.stopped)
    assert stop == expected_stop, (stop, expected_stop)
    prev = np.ones(P_D)
    for r in range(stop + 1):
        st = res.states[r]
        assert st.rounds_done == r + 1
        np.testing.assert_array_equal(st.broadcast, st.estimates.mean)
        F = a0 - float(np.mean(np.abs(st.estimates.mean - prev)))
        if r < stop:
            assert F < 0 and not st.stopped, (r, F)
        else:
            assert F >= 0 or r == P_MAX - 1, (r, F)
        # PBAt: after r + 1 rounds eps (1 - (1 - 1/t)^(r+1)) is spent
        spent = P_EPS * (1 - (1 - 1 / P_T) ** (r + 1))
        assert st.epsilon_spent == pytest.approx(spent, rel=1e-12)
        assert st.epsilon_spent == pytest.approx(proto.ledger.spent(rounds=range(r + 1)), rel=1e-15)
        prev = st.broadcast
    final = res.state
    assert final.stopped and final.rounds_done == stop + 1
    assert final.epsilon_spent < P_EPS
    for r in range(stop + 1, P_MAX):
        assert res.states[r] is res.states[stop]
        assert not np.any(res.round_counts[r]), r
    for r in range(stop + 1):
        assert res.round_counts[r][0] == P_N
    # output: round 1's frequency, the stopping round's mean
    np.testing.assert_array_equal(res.estimates.frequency, res.states[0].estimates.frequency)
    np.testing.assert_array_equal(res.estimates.mean, res.states[stop].estimates.mean)


def test_privkvm_plus_a0_zero_runs_max_rounds():
    proto, res = plus_run(0.0)
    check_stop_rule(proto, res, 0.0, P_MAX - 1)


def test_privkvm_plus_huge_a0_stops_after_one_round():
    proto, res = plus_run(10.0)
    check_stop_rule(proto, res, 10.0, 0)
    assert res.state.epsilon_spent == pytest.approx(P_EPS / P_T, rel=1e-12)


def test_privkvm_plus_intermediate_a0_stops_where_the_rule_says():
    """Same seed => the rounds before the stop are identical whatever A0 is,
    so the distances D_r of the A0 = 0 run predict where A0 > 0 stops: at
    the first r with D_r <= A0. Two A0 chosen from the data: halfway between
    D_1 and min(D_2..), and A0 = D_2 exactly (F = 0 at round 2: the rule is
    F >= 0, so it must stop there)."""
    _, base = plus_run(0.0)
    D = distances(base)
    assert min(D[1:]) < D[0], D            # precondition for a stop at round >= 2
    for a0 in ((D[0] + min(D[1:])) / 2, D[1]):
        expected = next((r for r, x in enumerate(D) if x <= a0), P_MAX - 1)
        assert expected >= 1
        proto, res = plus_run(a0)
        check_stop_rule(proto, res, a0, expected)
        for r in range(expected + 1):
            np.testing.assert_array_equal(res.round_counts[r], base.round_counts[r])
    # just below D_2 it does not stop at round 2
    a0 = float(np.nextafter(D[1], -np.inf))
    proto, res = plus_run(a0)
    check_stop_rule(proto, res, a0, next((r for r, x in enumerate(D) if x <= a0), P_MAX - 1))
    assert not res.states[1].stopped


# =====================================================================
# 5. Exact privacy audit of every round's LPP
# =====================================================================
# Only vertex values v in {-1, +1} are needed: lpp_output_probabilities is
# affine in each held value (Disc(v) = +1 w.p. (1+v)/2, checked below), so a
# user with interior values has a convex combination of vertex users'
# output distributions, and a ratio of two convex combinations never exceeds
# the largest ratio between their components. The fake m~ is not user data
# (uniform or the public broadcast), so it is fixed per audit.



def audit(d, p1, p2, fake):
    P = np.array([lpp_output_probabilities(u, d, p1, p2, fake) for u in all_users(d)])
    assert P.shape == (3 ** d, 3 * d)
    return log_worst_ratio(P)


EXTREME_FAKES = {2: [[-1.0, 0.3], [0.5, 1.0], [-1.0, 1.0]], 3: [[-1.0, 0.2, 1.0], [0.4, -0.3, 1.0]]}
INTERIOR_FAKES = {2: [[0.3, -0.6]], 3: [[0.1, -0.7, 0.9]]}


def _audit_round(proto, r, d):
    p1, p2 = proto.p1(r), proto.p2(r)
    assert p1 == pytest.approx(keep(proto.key_eps[r]), rel=1e-15)
    assert p2 == pytest.approx(keep(proto.value_eps[r]), rel=1e-15)
    budget = proto.key_eps[r] + proto.value_eps[r]
    for fake in EXTREME_FAKES[d]:
        # a holder of <j, +1> vs a non-holder with m~_j = -1 on output <1, +1>:
        # p1 p2 / ((1 - p1)(1 - p2)) = e^(eps1 + eps2) -- the bound is attained
        a = audit(d, p1, p2, fake)
        assert a <= budget + 1e-9
        assert a == pytest.approx(budget, rel=1e-9)
    for fake in INTERIOR_FAKES[d]:
        a = audit(d, p1, p2, fake)
        if proto.key_eps[r] > 0:
            # with no extreme m~ the non-holder's <1, +-1> has probability
            # > (1-p1)(1-p2), so the worst ratio is strictly inside the bound
            assert a < budget - 1e-6, (a, budget)
        else:
            # p1 = 1/2: the key bit says nothing, and holders of +1 vs -1 on
            # <1, +1> still attain e^eps2 whatever m~ is
            assert a == pytest.approx(budget, rel=1e-9)
    return budget


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("eps", [0.5, 2.0, 4.0])
def test_privkvm_rounds_are_exactly_eps1_plus_eps2(d, eps):
    """Each PrivKVM round (c = 3) with a broadcast fake: worst ratio =
    key_eps[r] + value_eps[r]; rounds >= 2 have p1 = 1/2, so that is eps/(2c).
    Round 1's real fake is uniform: see the next test."""
    proto = PrivKVM(d, eps, rounds=3)
    total = sum(_audit_round(proto, r, d) for r in range(3))
    assert total == pytest.approx(eps, rel=1e-12)


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("eps", [0.5, 2.0, 4.0])
def test_privkvm_plus_rounds_are_exactly_eps1_plus_eps2(d, eps):
    """PrivKVM+ rounds 1..4 (round 1's real fake m~ = 1 is extreme)."""
    proto = PrivKVMPlus(d, eps, t=2.0, max_rounds=4)
    assert audit(d, proto.p1(0), proto.p2(0), proto.initial_fake()) == pytest.approx(
        proto.key_eps[0] + proto.value_eps[0], rel=1e-9)
    total = sum(_audit_round(proto, r, d) for r in range(4))
    assert total == pytest.approx(eps * (1 - 0.5 ** 4), rel=1e-12)


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0])
def test_uniform_fake_audit_is_eps1_plus_ln_2p2(d, eps):
    """A uniform m~ discretises to a fair coin. Output <1, +1>: a holder of
    +1 has p1 p2, a non-holder (1 - p1)/2: ratio e^eps1 * 2 p2. The other
    ratios are e^eps1 (<0, 0>), e^eps2 (holders +1 vs -1), e^eps1 * 2(1-p2)
    and e^-eps1 / (2(1-p2)) (non-holder over holder of -1); with eps1 >= eps2
    (PrivKV's eps/2 each; PrivKVM round 1's eps/2 vs eps/6) the first is the
    largest: eps1 + ln(2 p2) >= eps2 iff e^eps1 >= (1 + e^eps2)/2, and
    >= -eps1 - ln(2(1 - p2)) iff e^eps1 >= cosh(eps2/2). It is < eps1 + eps2
    since 2 p2 < e^eps2 (i.e. 2 < 1 + e^eps2)."""
    for eps1, eps2, p1, p2 in [
            (PrivKV(d, eps).eps1, PrivKV(d, eps).eps2, PrivKV(d, eps).p1, PrivKV(d, eps).p2),
            (PrivKVM(d, eps, 3).key_eps[0], PrivKVM(d, eps, 3).value_eps[0],
             PrivKVM(d, eps, 3).p1(0), PrivKVM(d, eps, 3).p2(0))]:
        assert eps1 >= eps2
        a = audit(d, p1, p2, FAKE_UNIFORM)
        assert a == pytest.approx(eps1 + math.log(2 * p2), rel=1e-9)
        assert a < eps1 + eps2 - 1e-6
    mech = PrivKV(d, eps)
    np.testing.assert_array_equal(mech.output_probabilities([(0, 1.0)]),
                                  lpp_output_probabilities([(0, 1.0)], d, mech.p1, mech.p2, FAKE_UNIFORM))


def test_lpp_output_probabilities_affine_in_values():
    """The vertex argument's premise, and a fractional user stays in budget."""
    d, p1, p2, fake = 3, keep(1.0), keep(0.7), [0.2, -1.0, 0.6]
    for v in (-0.7, 0.0, 0.45):
        mixed = lpp_output_probabilities([(0, -1.0), (2, v)], d, p1, p2, fake)
        plus = lpp_output_probabilities([(0, -1.0), (2, 1.0)], d, p1, p2, fake)
        minus = lpp_output_probabilities([(0, -1.0), (2, -1.0)], d, p1, p2, fake)
        np.testing.assert_allclose(mixed, (1 + v) / 2 * plus + (1 - v) / 2 * minus, rtol=1e-12, atol=0)
    rng = np.random.default_rng(3)
    users = [[(k, rng.uniform(-1, 1)) for k in sorted(rng.choice(d, size=s, replace=False))]
             for s in range(d + 1) for _ in range(4)]
    P = np.array([lpp_output_probabilities(u, d, p1, p2, fake) for u in users])
    assert math.log((P.max(axis=0) / P.min(axis=0)).max()) <= 1.7 + 1e-9


LPP_CASES = [
    ([(0, 0.5), (2, -1.0)], FAKE_UNIFORM, 1.0, 1.0),
    ([(1, -0.3)], np.array([1.0, -0.4, -1.0]), 1.5, 0.5),
    ([], np.array([0.2, 1.0, -0.8]), 0.0, 0.8),      # PrivKVM later round: p1 = 1/2
]


@pytest.mark.parametrize("pairs, fake, eps1, eps2", LPP_CASES, ids=["uniform", "broadcast", "empty-p1-half"])
def test_lpp_perturb_draws_output_probabilities(pairs, fake, eps1, eps2):
    """The audit describes what the client really draws: for one user
    repeated n = 200k times, every (j, s) frequency within 4.5 binomial
    sigma of lpp_output_probabilities (Bonferroni over the 9 outputs)."""
    d, n = 3, 200_000
    p1, p2 = keep(eps1), keep(eps2)
    keys = np.tile([k for k, _ in pairs], n).astype(np.int64)
    vals = np.tile([v for _, v in pairs], n).astype(np.float64)
    users = UserBatch(np.arange(n + 1) * len(pairs), keys, vals)
    rep = lpp_perturb(users, d, p1, p2, fake, batch_rng(61, len(pairs)))
    np.testing.assert_array_equal(rep.offsets, np.arange(n + 1))
    counts = np.bincount(3 * rep.positions.astype(np.int64) + rep.symbols + 1, minlength=3 * d)
    probs = lpp_output_probabilities(pairs, d, p1, p2, fake)
    assert n * probs.min() > 50
    z = (counts / n - probs) / np.sqrt(probs * (1 - probs) / n)
    assert np.all(np.abs(z) < Z), z


# =====================================================================
# 6. The budget ledger
# =====================================================================
@pytest.mark.parametrize("eps, c", [(0.1, 1), (1.0, 3), (2.0, 6), (4.0, 7), (7.3, 10)])
def test_privkvm_ledger_sums_to_epsilon(eps, c):
    proto = PrivKVM(5, eps, rounds=c)
    assert math.isclose(proto.ledger.spent(), eps, rel_tol=1e-12)
    assert math.isclose(math.fsum(proto.key_eps) + math.fsum(proto.value_eps), eps, rel_tol=1e-12)
    assert proto.key_eps == [eps / 2] + [0.0] * (c - 1)
    np.testing.assert_allclose(proto.value_eps, eps / (2 * c), rtol=1e-15)


@pytest.mark.parametrize("eps, t, R", [(1.0, 2.0, 10), (4.0, 3.0, 5), (2.0, 1.5, 1), (0.5, 10.0, 20)])
def test_privkvm_plus_ledger_is_pbat(eps, t, R):
    """Round r (from 0) spends eps (1 - 1/t)^r / t, half on keys and half on
    values; over R rounds eps (1 - (1 - 1/t)^R) <= eps."""
    proto = PrivKVMPlus(5, eps, t=t, max_rounds=R)
    assert math.isclose(proto.ledger.spent(), eps * (1 - (1 - 1 / t) ** R), rel_tol=1e-12)
    assert proto.ledger.spent() <= eps
    for r in range(R):
        share = eps * (1 - 1 / t) ** r / t
        assert math.isclose(proto.key_eps[r], share / 2, rel_tol=1e-12)
        assert math.isclose(proto.value_eps[r], share / 2, rel_tol=1e-12)


def test_ledger_rejects_overspending():
    with pytest.raises(BudgetExceeded):
        BudgetLedger.of(1.0, [Share(0, "key", 0.6), Share(0, "value", 0.6)])
    BudgetLedger.of(1.0, [Share(0, "key", 0.5), Share(0, "value", 0.5)])      # exactly the total is fine

    class Greedy(PrivKVM):
        """Every round spends the full value budget eps/2 (c times too much)."""
        def shares(self):
            return [Share(0, "key", self.epsilon / 2)] + [Share(r, "value", self.epsilon / 2)
                                                           for r in range(self.max_rounds)]

    with pytest.raises(BudgetExceeded):
        Greedy(5, 1.0, rounds=3)
    assert Greedy(5, 1.0, rounds=1).ledger.spent() == 1.0     # c = 1 is not over budget


# =====================================================================
# 7. Validation and report format
# =====================================================================
@pytest.mark.parametrize("make", [
    lambda: PrivKVM(5, 1.0, rounds=0), lambda: PrivKVM(5, 1.0, rounds=-1),
    lambda: PrivKVMVirtual(5, 1.0, rounds=0),
    lambda: PrivKVMPlus(5, 1.0, max_rounds=0),
    lambda: PrivKVMPlus(5, 1.0, t=1.0), lambda: PrivKVMPlus(5, 1.0, t=0.5), lambda: PrivKVMPlus(5, 1.0, t=float("nan")),
    lambda: PrivKVMPlus(5, 1.0, a0=-0.01), lambda: PrivKVMPlus(5, 1.0, a0=float("nan")),
    lambda: PrivKV(5, 0.0), lambda: PrivKV(5, -1.0), lambda: PrivKVA(5, 0.0), lambda: PrivKVMVirtual(5, -0.5),
    lambda: PrivKVM(5, 0.0), lambda: PrivKVMPlus(5, -2.0), lambda: PrivKV(5, float("nan")),
    lambda: PrivKV(0, 1.0), lambda: PrivKVM(0, 1.0),
    lambda: PrivKV(5, 1.0, key_share=0.0), lambda: PrivKVA(5, 1.0, key_share=1.0),
])
def test_constructors_reject_bad_parameters(make):
    with pytest.raises(ValueError):
        make()


def test_accumulate_rejects_out_of_range_positions():
    d = 5
    mech, proto = PrivKV(d, 1.0), PrivKVM(d, 1.0, rounds=2)
    for bad in (d, d + 3, -1):
        with pytest.raises(ValueError):
            mech.accumulate(mech.new_counts(), ReportBatch([0, 1, 2], [0, bad], [1, 0]))
        with pytest.raises(ValueError):
            proto.accumulate_round(1, proto.new_round_counts(1), ReportBatch([0, 1, 2], [bad, 1], [-1, 1]))
    counts = mech.accumulate(mech.new_counts(), ReportBatch([0, 1, 2, 3], [0, d - 1, 2], [1, -1, 0]))
    assert counts[0] == 3 and counts[1 + 0] == 1 and counts[1 + d + d - 1] == 1 and counts[1 + 2 * d + 2] == 1
    assert counts.sum() == 6


def test_report_signs_zero_exactly_when_key_bit_is_zero():
    """With p1 = 1 the key bit is the holding bit, with p1 = 0 its negation;
    with p2 = 1 and +-1 values the value bit is the value. So a report's sign
    is 0 exactly for the users whose key bit is 0 and otherwise the (fake)
    value -- every report is one (j, s) with s in {-1, 0, +1}."""
    n, d = 20_000, 4
    users = tabular_users(n, [0.2, 0.5, 0.0, 0.9], [1.0, -1.0, 0.0, 1.0], 0.0, seed=5)
    users = UserBatch(users.offsets, users.keys, np.where(users.keys == 1, -1.0, 1.0))
    flat = set(zip(users.owners.tolist(), users.keys.tolist()))
    fake = np.array([-1.0, 1.0, -1.0, 1.0])
    for p1 in (1.0, 0.0):
        rep = lpp_perturb(users, d, p1, 1.0, fake, batch_rng(5, int(p1)))
        np.testing.assert_array_equal(rep.offsets, np.arange(n + 1))
        assert rep.symbols.dtype == np.int8 and set(np.unique(rep.symbols)) <= {-1, 0, 1}
        held = np.array([(i, int(j)) in flat for i, j in enumerate(rep.positions)])
        key_bit = held if p1 == 1.0 else ~held
        np.testing.assert_array_equal(rep.symbols == 0, ~key_bit)
        value = np.where(held, np.where(rep.positions == 1, -1, 1), fake[rep.positions])
        np.testing.assert_array_equal(rep.symbols[key_bit], value[key_bit])
        assert held.any() and (~held).any()
    # general parameters: signs in {-1, 0, +1}, one report per user, j in [0, d)
    rep = PrivKV(d, 1.0).perturb(users, batch_rng(6, 0))
    assert set(np.unique(rep.symbols)) == {-1, 0, 1}
    assert rep.positions.min() >= 0 and rep.positions.max() < d and rep.n_reports == n


def test_protocol_rejects_mismatched_dataset():
    data = SyntheticDataset("uu", n_users=100, d=4, seed=0)
    with pytest.raises(ValueError):
        run_local(PrivKVM(5, 1.0), data, seed=1)
