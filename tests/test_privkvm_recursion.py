"""PrivKVM's rounds: E[m^(c)] follows Theorem 5.3's recursion, and the
virtual iterations of Alg. 7 / Theorem 6.1 (PrivKVM-VI)
(SPEC.md §1; Ye et al. 2019; bands in privkv_helpers.py).
"""
import functools
import math

import numpy as np
import pytest

from kvldp.datasets import InMemoryDataset, SyntheticDataset
from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.estimation.truth import truth_from_counts
from kvldp.mechanisms.kv.privkv import (
    PrivKVMVirtual,
    lpp_split,
    privkv_frequency,
    privkv_mean,
    virtual_iterations,
)
from kvldp.mechanisms.kv.privkvm import PrivKVM, expected_mean_recursion
from kvldp.mechanisms.local import run_local
from ldp_audit import keep
from privkv_helpers import theta
from tolerances import Z, z_scores

# =====================================================================
# 1. PrivKVM: E[m^(c)] follows Theorem 5.3's recursion
# =====================================================================
M_D, M_N, M_C, M_EPS, M_R = 10, 200_000, 3, 4.0, 50
# keys with frequencies 1..10 / 55 (0.018 .. 0.18): theta differs per key
M_KEY_PROBS = np.arange(1, M_D + 1) / np.arange(1, M_D + 1).sum()
M_KEY_MEANS = np.array([-0.9, 0.7, -0.4, 0.1, 0.95, -0.6, 0.3, -0.1, 0.5, -0.75])


@functools.cache
def privkvm_population():
    rng = np.random.default_rng(21)
    keys = rng.choice(M_D, size=M_N, p=M_KEY_PROBS)
    values = np.clip(M_KEY_MEANS[keys] + rng.normal(0, 0.3, M_N), -1, 1)
    return InMemoryDataset("privkvm-test", UserBatch.single_pair(keys, values), [str(k) for k in range(M_D)])


@functools.cache
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
    _, proto, runs = privkvm_repeats()
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
    _, proto, runs = privkvm_repeats()
    f, m = truth_from_counts(runs[0].truth, M_D)
    r3 = np.array([res.states[2].estimates.mean_raw for res in runs])
    p = proto.p1(0)
    for wrong in (recursion_by_hand(m, f, [p], 0.0), recursion_by_hand(m, f, [p, p, p], 0.0)):
        z = z_scores(r3, wrong)
        assert np.abs(z).max() > 10, z


# =====================================================================
# 2. Virtual iterations (Alg. 7, Theorem 6.1)
# =====================================================================
V_D, V_N, V_EPS, V_C, V_R = 10, 200_000, 4.0, 6, 40


@functools.cache
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
