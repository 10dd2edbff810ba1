"""IOH's calibrated cell counts A_s: unbiased with the exact variance, the
check's power against the wrong calibration, and the conditional queries'
delta-method standard errors against their empirical s.d.
(SPEC.md §2; Sun et al. 2019 §V; Sun et al. 2021 §3; notation and bands
in ioh_helpers.py).
"""
import functools
import math

import numpy as np
import pytest

from ioh_helpers import all_queries, ue_params
from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.kv.cells import index_states
from kvldp.mechanisms.kv.ioh import IOH, PackedReportBatch, calibrate_cells, cell_variance
from kvldp.mechanisms.kv.query import HELD, NOT_HELD, CellTable
from kvldp.mechanisms.privacy.randomness import batch_rng
from tolerances import Z, mean_square_se
from user_batches import users_from_states

# =====================================================================
# 1. A_s is unbiased, with the exact variance
# =====================================================================
AS_EPS, AS_R, AS_CHUNK = 2.0, 200, 20


@functools.cache
def cell_population(kind):
    """``(users, ioh_keys, d, expected cells E[N_i], Disc variance of N_i)``.

    'det': k = 3, d = 3, deterministic users (values +-1): 0..1499 users per
    cell (4 cells empty), so N_i is known exactly.
    'frac': k = 2 of d = 4 keys (3, 1), values drawn from {-1, -0.5, 0, 0.3,
    1}: Disc is random; E[N_i] = sum over users of prod_j P(s_j), and
    N_i = sum of independent Bernoulli(pi_ui) adds Var = sum pi (1 - pi)."""
    rng = np.random.default_rng(9)
    if kind == "det":
        per_cell = rng.integers(0, 1500, 27)
        per_cell[[0, 7, 13, 26]] = 0
        states = index_states(np.repeat(np.arange(27), per_cell), 3)
        states = states[rng.permutation(len(states))]
        return users_from_states(states), [0, 1, 2], 3, per_cell.astype(np.float64), np.zeros(27)
    n, keys = 15_000, [3, 1]
    held = rng.random((n, 4)) < [0.2, 0.5, 0.6, 0.35]
    vals = rng.choice([-1.0, -0.5, 0.0, 0.3, 1.0], size=(n, 4))
    owner, col = np.nonzero(held)
    users = UserBatch(np.concatenate([[0], np.cumsum(held.sum(axis=1))]), col, vals[owner, col])
    # per user and chosen key: P(state 0), P(state 1), P(state 2)
    P = np.zeros((n, 2, 3))
    for a, key in enumerate(keys):
        h, v = held[:, key], vals[:, key]
        P[:, a, 0] = np.where(h, (1 - v) / 2, 0)
        P[:, a, 1] = np.where(h, 0, 1)
        P[:, a, 2] = np.where(h, (1 + v) / 2, 0)
    pi = (P[:, 0, :, None] * P[:, 1, None, :]).reshape(n, 9)       # cell 3 s_0 + s_1
    return users, keys, 4, pi.sum(axis=0), (pi * (1 - pi)).sum(axis=0)


def cell_repeats(kind, variant, R=AS_R):
    return _cell_repeats(kind, variant, R)


@functools.cache
def _cell_repeats(kind, variant, R):
    """A_s over R runs on the same users (perturbed AS_CHUNK runs at a time
    as one tiled batch, accumulated run by run as packed reports)."""
    users, keys, d, EN, disc_var = cell_population(kind)
    mech = IOH(d, AS_EPS, variant, ioh_keys=keys)
    n = users.n_users
    tiled = UserBatch.concat([users] * AS_CHUNK)
    A, V = [], []
    for c in range(R // AS_CHUNK):
        rep = mech.perturb(tiled, batch_rng(6200 + c, 0))
        for r in range(AS_CHUNK):
            counts = mech.accumulate(mech.new_counts(), PackedReportBatch(rep.bits[r * n:(r + 1) * n], mech.n_cells))
            assert counts[0] == n
            a, v = mech.cell_counts(counts)
            A.append(a)
            V.append(v)
    return mech, np.array(A), np.array(V), EN, disc_var, n


AS_CASES = [("det", "oue"), ("det", "sue"), ("frac", "oue"), ("frac", "sue")]


@pytest.mark.parametrize("kind, variant", AS_CASES)
def test_cell_counts_unbiased(kind, variant):
    """E[A_s[i]] = E[N_i]: the average over R = 200 runs is within 4.5 s.e. of
    the expected cell count for every cell, with the exact s.e.
    sqrt(([E N_i p(1-p) + (n - E N_i) q(1-q)]/(p-q)^2 + Var_Disc N_i)/R)
    (the UE part is linear in N_i, so its expectation is the formula at E N_i)."""
    check_cells(kind, variant, AS_R)


@pytest.mark.slow
@pytest.mark.parametrize("kind, variant", AS_CASES)
def test_cell_counts_unbiased_high_power(kind, variant):
    """R = 2000 (~50 s in all): the per-cell s.e. of the average is ~0.5% of
    a 1000-user cell, and the pooled variance band is +-2.7%."""
    check_cells(kind, variant, 2000)


def check_cells(kind, variant, R):
    _, A, _, EN, disc_var, n = cell_repeats(kind, variant, R)
    p, q = ue_params(variant, AS_EPS)
    var = (EN * p * (1 - p) + (n - EN) * q * (1 - q)) / (p - q) ** 2 + disc_var
    z = (A.mean(axis=0) - EN) / np.sqrt(var / len(A))
    assert np.all(np.abs(z) < Z), z
    # the spread matches too: pooled over cells and runs, mean z^2 = 1 within
    # 4.5 s.e. of a mean of R * 3^k squared normals (relative s.e. sqrt(2/(R 3^k)))
    z2 = ((A - EN) ** 2 / var).mean()
    assert abs(z2 - 1) < Z * mean_square_se(A.size), z2


def test_cell_counts_catch_the_wrong_calibration():
    """The unbiasedness check has power: Eq. (9) of Sun et al. 2019,
    ((e^(eps/2)+1) C - N)/(e^(eps/2)-1), is the SUE calibration (identical
    to A_s for SUE reports), but applied to OUE reports it misses most
    cells by > 10 s.e."""
    users, keys, d, EN, _ = cell_population("det")
    n = users.n_users
    e = math.exp(AS_EPS / 2)
    mech = IOH(d, AS_EPS, "sue", ioh_keys=keys)
    counts = mech.accumulate(mech.new_counts(), mech.perturb(users, batch_rng(77, 0)))
    np.testing.assert_allclose(mech.cell_counts(counts)[0], ((e + 1) * counts[1:] - n) / (e - 1),
                               rtol=1e-12, atol=1e-8)
    _, A, _, EN, _, _ = cell_repeats("det", "oue")
    p, q = ue_params("oue", AS_EPS)
    C = A * (p - q) + n * q                                          # the runs' support counts
    wrong = ((e + 1) * C - n) / (e - 1)
    var = (EN * p * (1 - p) + (n - EN) * q * (1 - q)) / (p - q) ** 2
    z = (wrong.mean(axis=0) - EN) / np.sqrt(var / len(A))
    assert np.mean(np.abs(z) > 10) > 0.9, z


@pytest.mark.parametrize("variant", ["oue", "sue"])
def test_conditional_se_is_the_empirical_sd(variant):
    """The reported s.e. of every conditional query (27 for k = 3) is the
    s.d. of the estimate: over the R = 200 runs on the deterministic
    population (its spread is the perturbation's only), the root-mean-square
    reported s.e. is within +-25% of the empirical s.d. (relative s.e. of a
    sample s.d. from 200 runs: 5%, so 25% is 5 s.e.). This is the check
    that tells the delta method's weights apart: f = X/(X+Z) has
    Var = (Z^2 Var X + X^2 Var Z)/(X+Z)^4, m = (P-N)/(P+N) has
    Var = 4 (N^2 Var P + P^2 Var N)/(P+N)^4, both written out below (the
    swapped weights, X^2 Var X + Z^2 Var Z, give ratios up to 1.5 here)."""
    _, A, V, _, _, _ = cell_repeats("det", variant)
    queries = all_queries(3)
    est = np.empty((len(A), len(queries), 2))
    se = np.empty_like(est)
    for r in range(len(A)):
        table = CellTable.from_vector(A[r], V[r])
        for i, (t, g) in enumerate(queries):
            res = table.conditional(t, g)
            est[r, i] = res.frequency_raw, res.mean_raw
            se[r, i] = res.frequency_se, res.mean_se
            if r < 3:
                cond = {j: HELD if h else NOT_HELD for j, h in g.items()}
                X, vX = table.select({**cond, t: HELD})
                Zc, vZ = table.select({**cond, t: NOT_HELD})
                P, vP = table.select({**cond, t: (2,)})
                N, vN = table.select({**cond, t: (0,)})
                f_se = math.sqrt(Zc ** 2 * vX + X ** 2 * vZ) / (X + Zc) ** 2
                m_se = 2 * math.sqrt(N ** 2 * vP + P ** 2 * vN) / (P + N) ** 2
                assert (res.frequency_se, res.mean_se) == (pytest.approx(f_se, rel=1e-9), pytest.approx(m_se, rel=1e-9))
    ratio = np.sqrt((se ** 2).mean(axis=0)) / est.std(axis=0, ddof=1)
    assert np.all(np.abs(ratio - 1) < 0.25), ratio


def test_cell_counts_and_plug_in_variance_formulas():
    """cell_counts = (C - n q)/(p - q) and the plug-in variance is the exact
    formula at N_i = A_s clipped into [0, n] (here at a value below 0 and
    one above n)."""
    for variant in ("oue", "sue"):
        mech = IOH(2, 1.5, variant, ioh_keys=[0, 1])
        p, q = ue_params(variant, 1.5)
        C = np.array([0, 5, 50, 200, 400, 399, 120, 60, 1000])
        n = 400
        counts = np.concatenate([[n], C])
        A, V = mech.cell_counts(counts)
        np.testing.assert_allclose(A, (C - n * q) / (p - q), rtol=1e-12)
        Nc = np.clip(A, 0, n)
        assert A.min() < 0 and A.max() > n
        np.testing.assert_allclose(V, (Nc * p * (1 - p) + (n - Nc) * q * (1 - q)) / (p - q) ** 2, rtol=1e-12)
        np.testing.assert_allclose(calibrate_cells(C, n, p, q)[0], A, rtol=1e-15)
        np.testing.assert_allclose(cell_variance(n, Nc, p, q), V, rtol=1e-15)
        np.testing.assert_allclose(mech.cell_variance(n, Nc), V, rtol=1e-15)
