"""KS-Adap: Norm-Sub, the adaptively chosen padding length l, frequencies
scaled by l and the three user groups (SPEC.md §4; Zhao et al. 2024 §4;
notation and bands in kskv_helpers.py).
"""
import functools
import math

import numpy as np
import pytest

from kskv_helpers import group_sizes, olh_written_out
from kvldp.datasets import InMemoryDataset
from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.estimation.truth import truth_from_counts
from kvldp.mechanisms.kv.ksadap import KSAdap
from kvldp.mechanisms.kv.kskv import norm_sub
from kvldp.mechanisms.local import run_local
from tolerances import Z, z_scores


# =====================================================================
# 1. KS-Adap: norm_sub, the adaptive l, frequencies scaled by l
# =====================================================================
def test_norm_sub_is_a_shifted_clipped_distribution():
    """norm_sub(x, total) = max(x + delta, 0) for one delta, summing to total:
    nonnegative, order preserving, the identity on a distribution, invariant
    to shifting x."""
    rng = np.random.default_rng(5)
    for trial in range(30):
        x = rng.normal(0.1, 0.2, size=rng.integers(2, 20))
        total = (1.0, 3.5)[trial % 2]
        y = norm_sub(x, total)
        assert y.sum() == pytest.approx(total, rel=1e-9)
        assert np.all(y >= 0)
        order = np.argsort(x, kind="stable")
        assert np.all(np.diff(y[order]) >= -1e-12)
        pos = y > 0
        shift = (y - x)[pos]
        np.testing.assert_allclose(shift, shift[0], rtol=0, atol=1e-9)
        assert np.all(x[~pos] + shift[0] <= 1e-9)
        np.testing.assert_allclose(norm_sub(x + 0.37, total), y, rtol=0, atol=1e-9)
    h = rng.dirichlet(np.ones(9))
    np.testing.assert_allclose(norm_sub(h), h, rtol=0, atol=1e-9)


def test_choose_padding_is_the_smallest_l_whose_share_exceeds_coverage():
    """From size counts whose OLH estimate is exactly a histogram h: l is the
    first size with cumsum(h) > coverage, at least 1, at most max_size; with
    noise (negative entries) the histogram is Norm-Sub'ed first."""
    proto = KSAdap(20, 3.0, top=4)            # 8 candidates: sizes 0 … 8
    o = proto.sizes_olh
    n = 10_000

    def counts_for(h):
        return np.concatenate([[n], n * o.q + (o.p - o.q) * n * np.asarray(h)])

    h = np.array([0.05, 0.30, 0.25, 0.20, 0.15, 0.05, 0, 0, 0])
    cum = np.cumsum(h)                        # .05 .35 .60 .80 .95 1 1 1 1
    for coverage, l in [(0.9, 4), (0.5, 2), (0.81, 4), (0.79, 3), (0.3, 1), (0.01, 1), (0.97, 5)]:
        assert l == max(1, int(np.argmax(cum > coverage)))
        proto.coverage = coverage
        assert proto.choose_padding(counts_for(h)) == l, coverage
    # noisy estimate (sum 0.9): Norm-Sub clips the four -0.05 and shifts the
    # six others by delta = (1 - 1.05)/6 = -1/120: cumulative .0917 .5833 .875
    # .9167 .9167 .9583 .9583 1 1. Clipping alone (cumulative .1 .6 .9 .95 …)
    # would give l = 2 at 0.88; clipping and renormalising (.0952 .5714 .8571
    # .9048 .9048 .9524 …) l = 5 at 0.91.
    noisy = np.array([0.1, 0.5, 0.3, 0.05, -0.05, 0.05, -0.05, 0.05, -0.05])
    for coverage, l in [(0.88, 3), (0.91, 3), (0.6, 2), (0.95, 5)]:
        proto.coverage = coverage
        assert proto.choose_padding(counts_for(noisy)) == l, coverage


ADAP_N, ADAP_EPS = 200_000, 5.0
ADAP_TYPES = np.array([0.20, 0.30, 0.25, 0.20, 0.05])   # F, B, C, D, E


@functools.cache
def adap_population():
    """Users with a known distribution of |S ∩ TKS| (d = 48, t = 4):

    * F (20%): 4 of the 40 rare keys 8..47 -> |S| = 4, |S ∩ TKS| = 0;
    * B/C/D (30/25/20%): 1/2/3 of the keys 0..3;
    * E (5%): the keys 4..7 -> |S ∩ TKS| = 4.

    Round 1 (each user one uniformly sampled key) sees keys 0..3 at >= 0.06,
    4..7 at 0.05/4 = 0.0125, rare keys at 0.2 * 4/40 / 4 = 0.005: TKS =
    {0..7} with a margin of > 9 OLH s.d. (eps = 5, 80k users: s.d. 5.8e-4).
    Cumulative shares of |S ∩ TKS| <= 0, 1, 2, 3, 4: .20 .50 .75 .95 1."""
    n = ADAP_N
    rng = np.random.default_rng(21)
    types = rng.permutation(np.repeat(np.arange(5), np.round(ADAP_TYPES * n).astype(int)))
    keys = np.full((n, 4), -1)
    f_rows = types == 0
    keys[f_rows] = 8 + np.argsort(rng.random((f_rows.sum(), 40)), axis=1)[:, :4]
    for ty, size in ((1, 1), (2, 2), (3, 3)):
        rows = np.flatnonzero(types == ty)
        keys[rows, :size] = np.argsort(rng.random((len(rows), 4)), axis=1)[:, :size]
    keys[types == 4] = [4, 5, 6, 7]
    held = keys >= 0
    k = keys[held]
    key_means = np.linspace(-0.8, 0.8, 48)
    values = np.clip(key_means[k] + rng.normal(0, 0.3, len(k)), -1, 1)
    users = UserBatch(np.concatenate([[0], np.cumsum(held.sum(axis=1))]), k, values)
    return InMemoryDataset("adap", users, [str(i) for i in range(48)]), types


def adap_run(coverage, seed):
    data, _ = adap_population()
    return run_local(KSAdap(48, ADAP_EPS, top=4, coverage=coverage), data, seed=seed)


@functools.cache
def adap_repeats(R=24):
    return [adap_run(0.9, 800 + r) for r in range(R)]


@pytest.mark.parametrize("coverage, expect", [(0.9, 3), (0.72, 2), (0.45, 1), (0.1, 1)])
def test_ksadap_chooses_the_smallest_l_above_coverage(coverage, expect):
    """l = the smallest size whose share of users with |S ∩ TKS| <= l
    (users without a candidate key included, as size 0) exceeds coverage.
    True cumulative shares .20 .50 .75 .95 1; group 2 (20k users) estimates
    them with s.d. < 0.004 (sampling 0.003, OLH at eps = 5 ~0.001 per size),
    and every coverage is >= 0.03 (> 7 s.d.) from a cumulative share.

    The data tell the plausible slips apart: sizes |S| (not |S ∩ TKS|) give
    l = 4 at coverage 0.9; leaving out the users without a candidate key
    gives l = 3 at 0.72. The state's l is also recomputed from the round's
    size counts (OLH written out, Norm-Sub, first cumulative share above
    coverage)."""
    data, types = adap_population()
    true_sizes = np.array([0, 1, 2, 3, 4])[types]
    cum = np.cumsum(np.bincount(true_sizes, minlength=5)) / ADAP_N
    assert np.min(np.abs(cum - coverage)) >= 0.03 - 1e-12
    assert max(1, int(np.argmax(cum > coverage))) == expect
    full = np.cumsum(np.bincount(data.users.sizes, minlength=5)) / ADAP_N
    assert int(np.argmax(full > 0.9)) == 4                   # |S| instead: l would be 4 at 0.9
    with_cand = np.cumsum(np.bincount(true_sizes[true_sizes > 0], minlength=5)) / (types > 0).sum()
    assert int(np.argmax(with_cand > 0.72)) == 3            # no-candidate users dropped: 3 at 0.72

    res = adap_run(coverage, seed=40)
    rank = res.states[0].broadcast
    assert sorted(np.flatnonzero(rank >= 0).tolist()) == list(range(8))
    l = res.states[1].get("padding")
    assert l == expect
    assert res.states[2].get("padding") == l
    c1 = res.round_counts[1]
    h, _ = olh_written_out(ADAP_EPS, c1[1:], c1[0])
    again = max(1, int(np.argmax(np.cumsum(norm_sub(h)) > coverage)))
    assert again == l


def test_ksadap_frequencies_scaled_by_l_are_unbiased():
    """l = 3 (coverage 0.9). Keys 0..3 are held only by users with
    |S ∩ TKS| <= 3: l * (sampled share) is unbiased for f, per key within
    4.5 s.e. over R = 24 runs. Keys 4..7 are held by users with 4 > l
    candidate pairs: the estimate is unbiased for g = f l/4 (PCKV's
    padding-and-sampling bias), and > 10 s.e. below f. The mean is a ratio
    in which that factor cancels: unbiased for all candidates. Keys outside
    TKS: frequency and mean null, with their standard errors (not_candidate)."""
    runs = adap_repeats()
    data, _ = adap_population()
    users = data.users
    f, m = truth_from_counts(runs[0].truth, 48)
    in_tks = users.keys < 8
    size_tks = np.bincount(users.owners[in_tks], minlength=users.n_users)
    w = 3 / np.maximum(size_tks[users.owners], 3)
    g = np.bincount(users.keys, weights=w, minlength=48) / users.n_users
    np.testing.assert_allclose(g[:4], f[:4], rtol=1e-12)
    np.testing.assert_allclose(g[4:8], 0.75 * f[4:8], rtol=1e-12)
    est = []
    for res in runs:
        assert res.state.get("padding") == 3
        assert sorted(np.flatnonzero(res.state.broadcast >= 0).tolist()) == list(range(8))
        e = res.estimates
        assert np.all(np.isnan(e.frequency[8:])) and np.all(np.isnan(e.frequency_se[8:]))
        assert np.all(np.isnan(e.mean[8:])) and np.all(np.isnan(e.mean_se[8:]))
        assert set(e.frequency_status[8:]) == set(e.mean_status[8:]) == {"not_candidate"}
        est.append((e.frequency_raw[:8], e.mean_raw[:8]))
    # calibration of one run, written out: GRR over 8 candidates + 3 dummies,
    # p = e^eps/(e^eps + 21), q = 1/(e^eps + 21), f = 3 (pi - 2q)/(p - q) with
    # the exact (linear) s.e. 3 sqrt(pi (1 - pi)/(n (p - q)^2))
    e, res = math.exp(ADAP_EPS), runs[0]
    p, q = e / (e + 21), 1 / (e + 21)
    c2 = res.round_counts[2]
    width = (len(c2) - 1) // 2
    pi = (c2[1:1 + width] + c2[1 + width:])[:8] / c2[0]
    slot = res.state.broadcast[:8].astype(int)
    np.testing.assert_allclose(res.estimates.frequency_raw[:8], (3 * (pi - 2 * q) / (p - q))[slot], rtol=1e-9)
    np.testing.assert_allclose(res.estimates.frequency_se[:8],
                               (3 * np.sqrt(pi * (1 - pi) / (c2[0] * (p - q) ** 2)))[slot], rtol=1e-4)
    freq = np.array([a for a, _ in est])
    mean = np.array([b for _, b in est])
    z_g = z_scores(freq, g[:8])
    assert np.all(np.abs(z_g) < Z), z_g
    z_f = z_scores(freq[:, 4:], f[4:8])
    assert np.all(z_f < -10), z_f
    z_m = z_scores(mean, m[:8])
    assert np.all(np.abs(z_m) < Z), z_m


def test_ksadap_rounds_use_the_three_groups():
    data, _ = adap_population()
    res = adap_repeats()[0]
    sizes = group_sizes(data, 800, (0.4, 0.1, 0.5))
    assert [int(c[0]) for c in res.round_counts] == sizes.tolist()
    assert sizes.sum() == ADAP_N
    assert [s.rounds_done for s in res.states] == [1, 2, 3] and res.state.stopped
    assert all(s.epsilon_spent == ADAP_EPS for s in res.states)
