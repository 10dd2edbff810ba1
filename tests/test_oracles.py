"""Frequency oracles GRR, SUE, OUE, OLH (Wang et al. 2017; SPEC.md §5).

Checks: exact eps-LDP of each oracle's output distribution, the report
distribution ``perturb`` really draws (p and q), unbiasedness of ``estimate``
and the exactness of ``variance``, and constructor validation.
"""
import itertools
import math

import numpy as np
import pytest

from kvldp.mechanisms.frequency import oracles
from kvldp.mechanisms.frequency.oracles import _HASH_PRIME, GRR, OLH, OUE, SUE
from kvldp.mechanisms.privacy.randomness import batch_rng
from tolerances import Z, binomial_sigma, binomial_z

ORACLES = {"GRR": GRR, "SUE": SUE, "OUE": OUE, "OLH": OLH}
EPSILONS = (0.5, 1.0, 2.0, 4.0)


def support_by_group(oracle, items, n_groups, rng):
    """Perturb ``items`` (``n_groups`` equal consecutive groups of users) and
    return the support counts of every group, shape ``(n_groups, d)``."""
    d = oracle.d
    n = len(items) // n_groups
    if isinstance(oracle, GRR):
        reports = oracle.perturb(items, rng)
        group = np.arange(len(items)) // n
        return np.bincount(group * d + reports, minlength=n_groups * d).reshape(n_groups, d)
    if isinstance(oracle, OLH):
        a, b, v = oracle.perturb(items, rng)
        return np.stack([oracle.support(a[g * n:(g + 1) * n], b[g * n:(g + 1) * n], v[g * n:(g + 1) * n])
                         for g in range(n_groups)])
    offsets, positions = oracle.perturb(items, rng)
    group = np.repeat(np.arange(len(items)), np.diff(offsets)) // n
    return np.bincount(group * d + positions, minlength=n_groups * d).reshape(n_groups, d)


def skewed_items(n, d, rng):
    """A fixed, Zipf-like item assignment (exact counts), shuffled."""
    w = 1.0 / np.arange(1, d + 1) ** 1.3
    counts = np.floor(n * w / w.sum()).astype(np.int64)
    counts[0] += n - counts.sum()
    items = rng.permutation(np.repeat(np.arange(d), counts))
    return items, counts / n


# ---------------------------------------------------------------- privacy --
@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("d", [2, 3, 7])
def test_grr_exact_privacy(d, eps):
    """GRR: P(y|x) = p if y == x else q; rows sum to 1 and the worst ratio
    max_y max_{x,x'} P(y|x)/P(y|x') is exactly e^eps."""
    o = GRR(d, eps)
    M = np.where(np.eye(d, dtype=bool), o.p, o.q)  # M[x, y]
    np.testing.assert_allclose(M.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    worst = (M.max(axis=0) / M.min(axis=0)).max()
    assert math.log(worst) == pytest.approx(eps, rel=1e-12)


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("cls", [SUE, OUE], ids=["SUE", "OUE"])
def test_unary_encoding_exact_privacy(cls, eps):
    """SUE/OUE: bits independent, so the worst ratio between two inputs is the
    per-bit product p(1-q)/(q(1-p)), which equals e^eps. Checked both from the
    formula and by enumerating every output bit vector of a small domain."""
    o = cls(4, eps)
    p, q = o.p, o.q
    assert math.log(p * (1 - q) / (q * (1 - p))) == pytest.approx(eps, rel=1e-12)
    ys = np.array(list(itertools.product((0, 1), repeat=o.d)))
    P = np.empty((o.d, len(ys)))
    for x in range(o.d):
        prob_one = np.where(np.arange(o.d) == x, p, q)
        P[x] = np.prod(np.where(ys == 1, prob_one, 1 - prob_one), axis=1)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    worst = (P.max(axis=0) / P.min(axis=0)).max()
    assert math.log(worst) == pytest.approx(eps, rel=1e-12)


@pytest.mark.parametrize("eps", [*EPSILONS, 0.1, 6.0])
def test_olh_exact_privacy(eps):
    """OLH: the hash (a, b) is drawn independently of the item, so privacy is
    that of GRR over g values: P(y|h) = p if y == h else (1-p)/(g-1); the
    worst ratio is exactly e^eps. Also g = round(e^eps) + 1 (at least 2)."""
    o = OLH(10, eps)
    g = o.g
    assert g == max(2, round(math.exp(eps)) + 1)
    other = (1 - o.p) / (g - 1)
    assert other == pytest.approx(1 / (math.exp(eps) + g - 1), rel=1e-12)
    M = np.where(np.eye(g, dtype=bool), o.p, other)
    np.testing.assert_allclose(M.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert math.log((M.max(axis=0) / M.min(axis=0)).max()) == pytest.approx(eps, rel=1e-12)
    assert o.q == 1.0 / g


# ------------------------------------------------- report distribution --
@pytest.mark.parametrize("item", [0, 7, 11])
@pytest.mark.parametrize("name", ["GRR", "SUE", "OUE"])
def test_perturbation_matches_p_and_q(name, item):
    """For n users all holding ``item``: the true item is reported/set with
    frequency p, every other item with frequency q (binomial 4.5 sigma, safe
    across the 12 items)."""
    d, n, eps = 12, 100_000, 1.5
    o = ORACLES[name](d, eps)
    items = np.full(n, item)
    sup = support_by_group(o, items, 1, batch_rng(11, item))[0]
    expect = np.where(np.arange(d) == item, o.p, o.q)
    z = binomial_z(sup / n, expect, n)
    assert np.all(np.abs(z) < Z), z


@pytest.mark.parametrize("name", ["SUE", "OUE"])
def test_unary_encoding_reports_are_well_formed_and_bits_independent(name):
    """UE reports: positions strictly increasing within a user and in [0, d);
    two bits are set together with probability (product of marginals)."""
    d, n, eps, item = 6, 100_000, 1.0, 2
    o = ORACLES[name](d, eps)
    offsets, positions = o.perturb(np.full(n, item), batch_rng(12, 0))
    assert offsets[0] == 0 and offsets[-1] == len(positions) and len(offsets) == n + 1
    assert positions.min() >= 0 and positions.max() < d
    owner = np.repeat(np.arange(n), np.diff(offsets))
    same_user = owner[1:] == owner[:-1]
    assert np.all(np.diff(positions)[same_user] > 0)
    bits = np.zeros((n, d), dtype=bool)
    bits[owner, positions] = True
    marg = np.where(np.arange(d) == item, o.p, o.q)
    for i, j in [(item, 0), (item, d - 1), (0, 1), (3, 5)]:
        expect = marg[i] * marg[j]
        got = np.mean(bits[:, i] & bits[:, j])
        assert abs(got - expect) < Z * binomial_sigma(expect, n), (i, j, got, expect)


def test_olh_perturbation_matches_grr_over_g():
    """OLH: the reported value equals the item's hash w.p. p and each other
    hash value w.p. (1-p)/(g-1); the hash seeds are in range."""
    d, n, eps, item = 12, 100_000, 2.0, 5
    o = OLH(d, eps)
    a, b, v = o.perturb(np.full(n, item), batch_rng(13, 0))
    assert a.min() >= 1 and a.max() < _HASH_PRIME and b.min() >= 0 and b.max() < _HASH_PRIME
    assert v.min() >= 0 and v.max() < o.g
    shift = (v - o.hash(a, b, np.full(n, item))) % o.g   # 0 = kept
    freq = np.bincount(shift, minlength=o.g) / n
    expect = np.array([o.p] + [(1 - o.p) / (o.g - 1)] * (o.g - 1))
    assert np.all(np.abs(freq - expect) < Z * binomial_sigma(expect, n)), (freq, expect)


# ----------------------------------------------- unbiasedness, variance --
@pytest.mark.parametrize("eps", [1.0, 4.0])
@pytest.mark.parametrize("name", list(ORACLES))
def test_estimate_is_unbiased(name, eps):
    """E[estimate/n] = f: every item of a skewed distribution (d = 20,
    n = 200k) within 4.5 sigma, sigma = sqrt(variance(n, f)) (Bonferroni-safe
    over 20 items)."""
    d, n = 20, 200_000
    o = ORACLES[name](d, eps)
    rng = batch_rng(21, int(eps * 10))
    items, f = skewed_items(n, d, rng)
    sup = support_by_group(o, items, 1, rng)[0]
    f_hat = o.estimate(sup, n) / n
    z = (f_hat - f) / np.sqrt(o.variance(n, f))
    assert np.all(np.abs(z) < Z), z


@pytest.mark.parametrize("eps", [1.0, 4.0])
@pytest.mark.parametrize("name", list(ORACLES))
def test_variance_is_exact(name, eps):
    """``variance(n, f)`` is the exact variance of the frequency estimate.

    R = 400 independent repeats of n = 4000 users; per item the mean squared
    error about the true f has relative s.e. sqrt(2/R) = 7.1%, so the +-35%
    band is ~5 s.e. wide (chi-square tails: a false failure has probability
    < 1e-5 per item, safe across the 20 items checked)."""
    d, n, R = 20, 4000, 400
    o = ORACLES[name](d, eps)
    rng = batch_rng(31, int(eps * 10))
    items, f = skewed_items(n, d, rng)
    sup = support_by_group(o, np.tile(items, R), R, rng)
    f_hat = o.estimate(sup, n) / n                       # (R, d)
    ratio = ((f_hat - f) ** 2).mean(axis=0) / o.variance(n, f)
    assert np.all(np.abs(ratio - 1) < 0.35), ratio


def test_variance_formula_reduces_to_wang_et_al():
    """At f = 0 the variance is Wang et al.'s q(1-q)/(n(p-q)^2); for OUE that is
    4 e^eps/(n (e^eps-1)^2), for GRR (e^eps+d-2)/(n (e^eps-1)^2)."""
    n, eps, d = 1000, 1.3, 9
    e = math.exp(eps)
    assert OUE(d, eps).variance(n, 0.0) == pytest.approx(4 * e / (n * (e - 1) ** 2), rel=1e-12)
    assert GRR(d, eps).variance(n, 0.0) == pytest.approx((e + d - 2) / (n * (e - 1) ** 2), rel=1e-12)


# Regression: q = 1/(e^50+1) ~ 2e-22 once made bernoulli_positions' Geometric
# gaps overflow int64 and perturb index out of bounds.
@pytest.mark.parametrize("chunk, divmod_below", [(1, 0), (5, 0), (1 << 20, 0), (1 << 20, 16), (1 << 20, math.inf)])
def test_skip_items_maps_slots_to_the_positions_around_each_item(monkeypatch, chunk, divmod_below):
    """Slot ``j`` of user ``i`` is position ``j + (j >= item_i)``: the running
    sum (whatever its chunking) and the divmod path equal that formula, and
    ``at`` is where each item sorts among its user's positions."""
    monkeypatch.setattr(oracles, "_CHUNK", chunk)
    monkeypatch.setattr(oracles, "DIVMOD_BELOW", divmod_below)
    rng = np.random.default_rng(chunk)
    for n, width in [(0, 4), (1, 1), (9, 1), (40, 6), (300, 17)]:
        items = rng.integers(0, width + 1, n)
        slots = np.flatnonzero(rng.random(n * width) < rng.uniform(0, 1))
        owner, j = np.divmod(slots, width)
        want = j + (j >= items[owner])
        starts, at = oracles.skip_items(slots, items, width)
        np.testing.assert_array_equal(slots, want)
        np.testing.assert_array_equal(np.diff(starts), np.bincount(owner, minlength=n))
        for i in range(n):
            mine = slots[starts[i]:starts[i + 1]]
            assert at[i] - starts[i] == np.searchsorted(mine, items[i])


def test_unary_encoding_handles_very_large_epsilon():
    d, n = 10, 2000
    o = OUE(d, 50.0)
    offsets, positions = o.perturb(np.arange(n) % d, batch_rng(14, 0))
    owner = np.repeat(np.arange(n), np.diff(offsets))
    assert np.all(positions == owner % d)        # only true bits can be set
    assert abs(len(positions) - n / 2) < Z * math.sqrt(n / 4)


# ------------------------------------------------------------ validation --
@pytest.mark.parametrize("name", list(ORACLES))
@pytest.mark.parametrize("d, eps", [(1, 1.0), (0, 1.0), (-3, 1.0), (5, 0.0), (5, -1.0),
                                    (5, float("nan")), (5, float("inf"))])
def test_constructor_rejects_bad_parameters(name, d, eps):
    with pytest.raises(ValueError):
        ORACLES[name](d, eps)


@pytest.mark.parametrize("name", list(ORACLES))
def test_constructor_accepts_smallest_valid_domain(name):
    o = ORACLES[name](2, 0.01)
    assert 0 < o.q < o.p < 1


def test_olh_rejects_domain_beyond_hash_prime():
    with pytest.raises(ValueError):
        OLH(_HASH_PRIME, 1.0)
