"""Client-side sampling (sampling.py) and randomness helpers (randomness.py).

* ``discretise``: E[Disc(v)] = v (SPEC.md notation).
* ``padding_and_sampling`` (PCKV Alg. 1, PCKV.md): each real pair w.p.
  1/max(|S|, l), each dummy w.p. (1 - eta)/l with eta = |S|/max(|S|, l), fair
  signs for dummies.
* ``uniform_key_sampling`` (PrivKV Alg. 2): the canonical form for a uniform j.
* ``bernoulli_positions``: exactly i.i.d. Bernoulli(p) slots.
* ``batch_rng``: a pure function of (seed, stream, batch_id).
"""
import math

import numpy as np
import pytest

from kvldp.mechanisms.base import UserBatch, one_entry_each
from kvldp.mechanisms.frequency.sampling import canonical_pairs, discretise, padding_and_sampling, uniform_key_sampling
from kvldp.mechanisms.privacy import randomness
from kvldp.mechanisms.privacy.randomness import STREAM_DATA, STREAM_PERTURB, batch_rng, bernoulli_positions, fresh_seed
from tolerances import Z_FEW, Z, binomial_sigma


def repeat_user(pairs, times, batch_id=0):
    """A UserBatch of ``times`` identical users holding ``pairs``."""
    keys = np.tile([k for k, _ in pairs], times).astype(np.int64)
    values = np.tile([v for _, v in pairs], times).astype(np.float64)
    offsets = np.arange(times + 1) * len(pairs)
    return UserBatch(offsets, keys, values, batch_id)


# ------------------------------------------------------------ discretise --
def test_discretise_is_unbiased():
    """E[Disc(v)] = v, Var = 1 - v^2: sample mean within 4 sigma."""
    n = 200_000
    rng = batch_rng(1, 0)
    for v in (-0.9, -0.5, 0.0, 0.3, 0.75):
        x = discretise(np.full(n, v), rng)
        assert x.dtype == np.int8 and set(np.unique(x)) <= {-1, 1}
        sigma = math.sqrt((1 - v * v) / n)
        assert abs(x.mean() - v) < Z_FEW * sigma, (v, x.mean())


def test_discretise_extremes_are_deterministic():
    rng = batch_rng(1, 1)
    assert np.all(discretise(np.ones(10_000), rng) == 1)
    assert np.all(discretise(-np.ones(10_000), rng) == -1)
    assert discretise(np.zeros((3, 4)), rng).shape == (3, 4)


# -------------------------------------------------- padding and sampling --
D, L = 10, 3
CASES = {
    "empty": [],
    "smaller_than_l": [(4, 0.5)],
    "equal_to_l": [(0, -0.2), (5, 1.0), (9, 0.6)],
    "larger_than_l": [(1, 0.1), (2, -1.0), (3, 0.4), (7, 0.0), (8, -0.5)],
}


@pytest.mark.parametrize("case", list(CASES))
def test_padding_and_sampling_probabilities(case):
    """Each real pair is sampled w.p. 1/max(|S|, l), each dummy w.p.
    (1 - eta)/l; signs of a real pair average to its value and dummies get a
    fair coin. Binomial 4.5 sigma (Bonferroni over the d + l keys)."""
    pairs = CASES[case]
    n = 120_000
    keys, signs = padding_and_sampling(repeat_user(pairs, n), D, L, batch_rng(2, len(pairs)))
    assert keys.shape == signs.shape == (n,)
    assert keys.min() >= 0 and keys.max() < D + L
    assert set(np.unique(signs)) <= {-1, 1}
    s = len(pairs)
    eta = s / max(s, L) if s else 0.0
    expect = np.zeros(D + L)
    for k, _ in pairs:
        expect[k] = 1 / max(s, L)
    expect[D:] = (1 - eta) / L
    freq = np.bincount(keys, minlength=D + L) / n
    assert np.all(np.abs(freq - expect) <= Z * binomial_sigma(expect, n)), (freq, expect)
    # keys nobody holds are never sampled (sigma = 0 above makes this exact)
    assert np.all(freq[expect == 0] == 0)
    # signs: mean value of a real pair, a fair coin for dummies
    for k, v in pairs:
        sel = signs[keys == k]
        if abs(v) == 1:
            assert np.all(sel == v)
        else:
            assert abs(sel.mean() - v) < Z * math.sqrt((1 - v * v) / len(sel))
    dummy = signs[keys >= D]
    if len(dummy):
        assert abs(dummy.mean()) < Z / math.sqrt(len(dummy))


def test_padding_and_sampling_mixed_batch_and_empty_batch():
    """Users of different sizes in one batch keep their own distribution, and a
    batch with no pairs at all samples only dummies."""
    n = 40_000
    users = UserBatch.concat([repeat_user(CASES["larger_than_l"], n), repeat_user([], n),
                              repeat_user(CASES["smaller_than_l"], n)])
    keys, _ = padding_and_sampling(users, D, L, batch_rng(3, 0))
    first, second, third = keys[:n], keys[n:2 * n], keys[2 * n:]
    assert set(np.unique(first)) <= {1, 2, 3, 7, 8}
    assert np.all(second >= D)
    assert set(np.unique(third)) <= {4, D, D + 1, D + 2}
    p4 = np.mean(third == 4)
    assert abs(p4 - 1 / L) < Z * math.sqrt(2 / 9 / n)
    only_empty = UserBatch(np.zeros(6, dtype=np.int64), [], [])
    keys, signs = padding_and_sampling(only_empty, D, L, batch_rng(3, 1))
    assert np.all((keys >= D) & (keys < D + L)) and len(signs) == 5


def test_padding_and_sampling_rejects_zero_padding():
    with pytest.raises(ValueError):
        padding_and_sampling(repeat_user([(0, 0.0)], 3), D, 0, batch_rng(0, 0))


# ------------------------------------------------- uniform key sampling --
def test_uniform_key_sampling_canonical_form():
    """(j, held, value) is the canonical form <1, v> / <0, 0> of the user for
    its j, checked against a dict lookup; j is uniform on [0, d)."""
    d = 6
    users_pairs = [[(2, 0.5), (5, -1.0)], [], [(0, 0.25)], [(1, 0.9), (3, -0.3), (4, 0.0), (0, 1.0)],
                   [(5, 0.7)]]
    reps = 4000
    batch = UserBatch.concat([repeat_user(p, 1) for p in users_pairs] * reps)
    j, held, values = uniform_key_sampling(batch, d, batch_rng(4, 0))
    n = batch.n_users
    assert j.shape == held.shape == values.shape == (n,)
    lookup = [dict(p) for p in users_pairs] * reps
    exp_held = np.array([jj in u for jj, u in zip(j.tolist(), lookup, strict=True)])
    exp_vals = np.array([u.get(jj, 0.0) for jj, u in zip(j.tolist(), lookup, strict=True)])
    np.testing.assert_array_equal(held, exp_held)
    np.testing.assert_array_equal(values, exp_vals)
    assert held.any() and (~held).any()
    freq = np.bincount(j, minlength=d) / n
    assert j.min() >= 0 and j.max() < d
    assert np.all(np.abs(freq - 1 / d) < Z * binomial_sigma(1 / d, n))


@pytest.mark.parametrize("layout", ["one pair each", "one pair each but one", "several"])
def test_canonical_pairs_equals_a_dict_lookup(layout):
    """Single-pair users take a shortcut (``one_entry_each``): the same
    arrays, dtypes included, as the sorted lookup every other layout takes."""
    rng = np.random.default_rng(7)
    d, n = 9, 3000
    if layout == "several":
        users = UserBatch.concat([repeat_user(list(zip(rng.choice(d, k, replace=False).tolist(),
                                                       rng.uniform(-1, 1, k).tolist(), strict=True)), 1)
                                  for k in rng.integers(0, 4, n)])
    else:
        users = UserBatch.single_pair(rng.integers(0, d, n), rng.uniform(-1, 1, n))
        if layout == "one pair each but one":      # a user without a pair: the general lookup
            users = UserBatch(np.concatenate([[0], users.offsets]), users.keys, users.values)
    j = rng.integers(0, d, users.n_users)
    held, values = canonical_pairs(users, d, j)
    lookup = [dict(zip(users.keys[a:b].tolist(), users.values[a:b].tolist(), strict=True))
              for a, b in zip(users.offsets[:-1], users.offsets[1:], strict=True)]
    assert held.dtype == bool and values.dtype == np.float64
    np.testing.assert_array_equal(held, [jj in u for jj, u in zip(j.tolist(), lookup, strict=True)])
    np.testing.assert_array_equal(values, [u.get(jj, 0.0) for jj, u in zip(j.tolist(), lookup, strict=True)])
    assert held.any() and (~held).any()
    assert one_entry_each(users.offsets) == (layout == "one pair each")


def test_uniform_key_sampling_without_any_pairs():
    batch = UserBatch(np.zeros(4, dtype=np.int64), [], [])
    j, held, values = uniform_key_sampling(batch, 5, batch_rng(4, 1))
    assert len(j) == 3 and not held.any() and np.all(values == 0)


# -------------------------------------------------- bernoulli_positions --
def test_bernoulli_positions_shape_and_count():
    """Sorted, unique, in range; the count of one large draw is
    Binomial(total, p) within 4 sigma."""
    rng = batch_rng(5, 0)
    for total, p in [(1_000_000, 0.01), (200_000, 0.37), (50_000, 0.93), (10, 0.5), (3, 1e-6)]:
        pos = bernoulli_positions(total, p, rng)
        assert pos.dtype == np.int64
        assert np.all(np.diff(pos) > 0)
        assert len(pos) == 0 or (pos[0] >= 0 and pos[-1] < total)
        assert abs(len(pos) - total * p) <= Z_FEW * math.sqrt(total * p * (1 - p)) + 1e-9, (total, p, len(pos))


def test_bernoulli_positions_edge_cases():
    rng = batch_rng(5, 1)
    assert len(bernoulli_positions(0, 0.5, rng)) == 0
    assert len(bernoulli_positions(-3, 0.5, rng)) == 0
    assert len(bernoulli_positions(100, 0.0, rng)) == 0
    np.testing.assert_array_equal(bernoulli_positions(7, 1.0, rng), np.arange(7))


@pytest.mark.parametrize("p", [1e-13, 0.004, 0.1192, 0.1999])
def test_bernoulli_runs_are_numpys_geometric_gaps_in_pieces(p):
    """Below ``DENSE_FROM``, ``bernoulli_runs`` (any run length) joins to the
    positions of NumPy's own ``Generator.geometric`` gaps summed, cut at
    ``total``; and leaves the generator where those draws leave it (what a
    caller draws next, e.g. the unary encodings' kept bits, is the same)."""
    assert p < randomness.DENSE_FROM
    total = 50_000
    rng = batch_rng(8, 3)
    expected, chunk, last = [], int(total * p + 6 * math.sqrt(total * p * (1 - p)) + 16), -1
    while last < total - 1:
        pos = np.cumsum(rng.geometric(p, size=chunk).astype(np.int64)) + last   # no gap overflows here
        expected.append(pos[pos < total])
        last, chunk = int(pos[-1]), max(16, chunk // 4)
    expected, after = np.concatenate(expected), rng.random(4)
    for step in (1, 7, 1000, None):
        rng = batch_rng(8, 3)
        runs = list(randomness.bernoulli_runs(total, p, rng, step))
        assert all(len(r) <= (step or total) for r in runs)
        np.testing.assert_array_equal(np.concatenate(runs) if runs else [], expected)
        np.testing.assert_array_equal(rng.random(4), after)
    np.testing.assert_array_equal(bernoulli_positions(total, p, batch_rng(8, 3)), expected)


@pytest.mark.parametrize("p", [0.2, 0.3333, 1 / 3, (77 + 0.5) / 256, 0.6, 0.999])
def test_bernoulli_runs_from_dense_from_are_one_byte_a_slot_in_pieces(p):
    """From ``DENSE_FROM`` on: slot ``i`` succeeds when its byte is below
    ``floor(256 p)``, or equal to it and the next tie's uniform is below the
    rest (the bytes of a run first, then its ties' uniforms); any run length
    gives the same positions and leaves the generator in the same state when
    it is a multiple of the step the expectation uses."""
    assert p >= randomness.DENSE_FROM
    total, step = 50_000, 1000
    rng = batch_rng(8, 4)
    expected = []
    below, rest = math.floor(256 * p), 256 * p - math.floor(256 * p)
    for s in range(0, total, step):
        byte = rng.integers(0, 256, size=min(step, total - s), dtype=np.uint8)
        hit = byte < below
        tie = np.flatnonzero(byte == below)
        hit[tie[rng.random(len(tie)) < rest]] = True
        expected.append(np.flatnonzero(hit) + s)
    expected, after = np.concatenate(expected), rng.random(4)
    runs = list(randomness.bernoulli_runs(total, p, batch_rng(8, 4), step))
    assert all(len(r) <= step for r in runs)
    np.testing.assert_array_equal(np.concatenate(runs), expected)
    rng = batch_rng(8, 4)
    list(randomness.bernoulli_runs(total, p, rng, step))
    np.testing.assert_array_equal(rng.random(4), after)


def test_a_tie_byte_succeeds_with_the_rest_of_the_probability():
    """``p = (Q + r)/256``: the slots whose byte is ``Q`` succeed w.p. ``r``,
    so the rate is ``p`` within 4 sigma where ``Q/256`` alone is 40 sigma off."""
    p, total = (3 + 0.75) / 256, 4_000_000      # below DENSE_FROM: byte_runs directly
    hits = sum(len(r) for r in randomness.byte_runs(total, p, batch_rng(9, 1)))
    sigma = math.sqrt(total * p * (1 - p))
    assert abs(hits - total * p) < Z_FEW * sigma
    assert abs(total * 3 / 256 - total * p) > 10 * Z_FEW * sigma


def test_fair_signs_are_fair_independent_bits():
    """Values ±1 (int8); the share of +1 within 4 sigma of 1/2; neighbours
    independent (lag-1 agreement 1/2); a count not a multiple of 8 works."""
    signs = randomness.fair_signs(1_000_003, batch_rng(9, 2))
    assert signs.dtype == np.int8 and len(signs) == 1_000_003 and set(np.unique(signs)) == {-1, 1}
    sigma = math.sqrt(0.25 / len(signs))
    assert abs((signs > 0).mean() - 0.5) < Z_FEW * sigma
    assert abs((signs[1:] == signs[:-1]).mean() - 0.5) < Z_FEW * sigma


# Regression: for prob below ~1e-18 Geometric(prob) gaps exceed int64 and
# used to come back negative; positions must stay in [0, total).
def test_bernoulli_positions_tiny_probability_stays_in_range():
    """P(any success) <= total * p <= 1e-9 here, so the result must be empty."""
    rng = batch_rng(5, 2)
    for p in (1e-15, 1e-19, 4e-22):
        pos = bernoulli_positions(10 ** 6, p, rng)
        assert len(pos) == 0, (p, pos[:5])


@pytest.mark.parametrize("p", [0.02, 0.3, 0.8])
def test_bernoulli_positions_is_iid_per_slot(p):
    """R draws over ``total`` slots: each slot's hit count is Binomial(R, p),
    so sum of squared z-scores ~ chi2(total) (mean total, s.d. sqrt(2 total));
    the first and last slots and the two halves are checked separately, and
    the per-draw count has variance total p (1 - p) (binomial, not Poisson)."""
    total, R = 400, 3000
    rng = batch_rng(6, int(p * 100))
    hits = np.zeros(total)
    sizes = np.empty(R)
    for r in range(R):
        pos = bernoulli_positions(total, p, rng)
        hits[pos] += 1
        sizes[r] = len(pos)
    sd = math.sqrt(R * p * (1 - p))
    z = (hits - R * p) / sd
    chi2 = float((z ** 2).sum())
    assert abs(chi2 - total) < 5 * math.sqrt(2 * total), chi2
    assert abs(z[0]) < Z and abs(z[-1]) < Z
    half = total // 2
    sd_half = math.sqrt(R * half * p * (1 - p))
    assert abs(hits[:half].sum() - R * half * p) < Z_FEW * sd_half
    assert abs(hits[half:].sum() - R * half * p) < Z_FEW * sd_half
    # sample variance of the count: relative s.e. sqrt(2/(R-1)) = 2.6%
    assert abs(sizes.var(ddof=1) / (total * p * (1 - p)) - 1) < 0.15


# ------------------------------------------------------------ batch_rng --
def test_batch_rng_is_a_pure_function_of_seed_stream_batch():
    big = (1 << 127) + 12345
    a = batch_rng(big, 7).random(64)
    np.testing.assert_array_equal(a, batch_rng(big, 7).random(64))
    assert not np.array_equal(a, batch_rng(big, 8).random(64))
    assert not np.array_equal(a, batch_rng(big + 1, 7).random(64))
    assert not np.array_equal(a, batch_rng(big, 7, STREAM_DATA).random(64))
    np.testing.assert_array_equal(batch_rng(3, 7, STREAM_PERTURB).random(8), batch_rng(3, 7).random(8))


def test_batch_rng_requires_a_seed():
    with pytest.raises(ValueError):
        batch_rng(None, 0)


def test_fresh_seed_is_128_bit_and_varies():
    seeds = {fresh_seed() for _ in range(4)}
    assert len(seeds) == 4
    assert all(0 <= s < (1 << 128) for s in seeds)
