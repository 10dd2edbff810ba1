"""Wang et al.'s consistency methods (``kvldp.mechanisms.estimation.consistency``), each
checked against its defining property: Norm-Sub is non-negative, sums to the
target and moves every kept estimate by one common shift; the projection is
the closest consistent point in the (weighted) L2 norm, checked against a
brute-force quadratic program (scipy.optimize); Base-Cut keeps exactly the
estimates above the Bonferroni threshold and, under the null, keeps any
with the family-wise rate it claims."""
from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import minimize

from kvldp.mechanisms.estimation.consistency import BASE_CUT_ALPHA, base_cut, base_cut_threshold, norm_sub, project
from tolerances import Z_FEW, binomial_sigma


def _inputs(seed: int, d: int):
    rng = np.random.default_rng(seed)
    x = rng.normal(0.02, 0.05, d)
    x[rng.random(d) < 0.3] -= 0.1                 # some clearly negative
    return x


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("total", [1.0, 0.37, 2.0])
def test_norm_sub_is_non_negative_sums_to_the_target_and_shifts_once(seed, total):
    x = _inputs(seed, 5 + 13 * seed)
    y = norm_sub(x, total)
    assert np.all(y >= 0)
    np.testing.assert_allclose(y.sum(), total, rtol=1e-12, atol=1e-12)
    kept = y > 0
    shift = x[kept] - y[kept]
    np.testing.assert_allclose(shift, shift[0], atol=1e-12)      # one common delta
    assert np.all(x[~kept] <= shift[0] + 1e-12)                  # the cut ones lay below it


def test_norm_sub_of_a_consistent_vector_is_itself_and_of_nothing_is_zero():
    x = np.array([0.5, 0.3, 0.2, 0.0])
    np.testing.assert_allclose(norm_sub(x, 1.0), x, atol=1e-15)
    np.testing.assert_array_equal(norm_sub(np.array([-0.1, 0.2]), 0.0), [0.0, 0.0])


def _qp(x, total, w, upper=None):
    """The projection by brute force: SLSQP on sum w (y - x)^2, 0 <= y <= upper, sum y = total."""
    res = minimize(lambda y: np.sum(w * (y - x) ** 2), np.full(len(x), total / len(x)),
                   jac=lambda y: 2 * w * (y - x), method="SLSQP", bounds=[(0, upper)] * len(x),
                   constraints=[{"type": "eq", "fun": lambda y: y.sum() - total, "jac": lambda y: np.ones(len(y))}],
                   options={"ftol": 1e-14, "maxiter": 500})
    assert res.success, res.message
    return res.x


@pytest.mark.parametrize("seed", range(12))
def test_projection_is_the_closest_consistent_point(seed):
    rng = np.random.default_rng(100 + seed)
    d = int(rng.integers(2, 9))
    x = _inputs(seed, d)
    total = float(rng.uniform(0.2, 1.5))
    w = rng.uniform(0.2, 5.0, d) if seed % 2 else np.ones(d)
    y = project(x, total, w if seed % 2 else None)
    q = _qp(x, total, w)
    assert np.all(y >= 0)
    np.testing.assert_allclose(y.sum(), total, rtol=1e-12)
    # no consistent point is closer: the QP optimum is not better, and they agree
    assert np.sum(w * (y - x) ** 2) <= np.sum(w * (q - x) ** 2) + 1e-10
    np.testing.assert_allclose(y, q, atol=1e-6)


@pytest.mark.parametrize("seed", range(12))
def test_a_bounded_projection_is_the_closest_consistent_point_within_the_bound(seed):
    """With every frequency at most ``upper`` (1, or the kept share the
    truncation correction divides by) the projection is the QP's optimum
    with that bound; some keys sit at it, the sum is the total."""
    rng = np.random.default_rng(200 + seed)
    d = int(rng.integers(3, 10))
    x = _inputs(seed, d) * rng.uniform(1, 8)
    upper = float(rng.uniform(0.05, 0.3))
    total = float(rng.uniform(0.3, 0.9)) * upper * d
    w = rng.uniform(0.2, 5.0, d) if seed % 2 else np.ones(d)
    y = project(x, total, w if seed % 2 else None, upper=upper)
    q = _qp(x, total, w, upper)
    assert np.all((y >= 0) & (y <= upper))
    np.testing.assert_allclose(y.sum(), total, rtol=1e-12)
    assert np.sum(w * (y - x) ** 2) <= np.sum(w * (q - x) ** 2) + 1e-10
    np.testing.assert_allclose(y, q, atol=1e-6)


def test_a_bound_keeps_the_mass_that_cutting_afterwards_loses():
    """Norm-Sub then a cut at the bound loses the mass above it; Norm-Sub
    within the bound keeps the total (the truncation correction's case:
    issue 43, KS-GRR on MovieLens at eps 1 kept 6.2 of 113)."""
    x = np.array([0.9, 0.8, 0.1, 0.05, -0.2, 0.02])
    cut_after = np.minimum(norm_sub(x, 1.2), 0.3)
    within = norm_sub(x, 1.2, upper=0.3)
    assert cut_after.sum() < 1.0
    np.testing.assert_allclose(within.sum(), 1.2, rtol=1e-12)
    assert np.all(within <= 0.3) and within[0] == within[1] == 0.3
    np.testing.assert_allclose(norm_sub(x, 0.4, upper=1.0), norm_sub(x, 0.4), atol=1e-15)   # a bound not reached
    np.testing.assert_array_equal(norm_sub(x, 5.0, upper=0.3), np.full(6, 0.3))         # more than the bounds hold


def test_projection_with_equal_weights_is_norm_sub():
    x = _inputs(3, 40)
    np.testing.assert_allclose(project(x, 1.0, np.full(40, 7.0)), norm_sub(x, 1.0), atol=1e-14)


def test_projection_refuses_what_it_cannot_project():
    with pytest.raises(ValueError):
        project(np.array([0.1, np.nan]), 1.0)
    with pytest.raises(ValueError):
        project(np.array([0.1, 0.2]), -1.0)
    with pytest.raises(ValueError):
        project(np.array([0.1, 0.2]), 1.0, np.array([1.0, 0.0]))
    with pytest.raises(ValueError, match="upper bound"):
        project(np.array([0.1, 0.2]), 1.0, upper=0.0)


def test_base_cut_keeps_exactly_the_estimates_above_the_bonferroni_threshold():
    rng = np.random.default_rng(7)
    x, sd = rng.normal(0.0, 0.01, 200) + np.repeat([0.0, 0.05], 100), rng.uniform(0.005, 0.015, 200)
    y = base_cut(x, sd)
    keep = x > base_cut_threshold(200) * sd
    np.testing.assert_array_equal(y[keep], x[keep])
    assert np.all(y[~keep] == 0)
    assert base_cut_threshold(200) == pytest.approx(3.4808, abs=1e-3)    # z_{1 - 0.05/200}


def test_base_cut_keeps_a_null_key_with_the_family_wise_rate_alpha():
    """All true frequencies 0: some estimate survives in at most ``alpha`` of
    the vectors (Bonferroni: a little less); 4000 vectors, band ``Z_FEW``
    binomial s.d."""
    rng = np.random.default_rng(11)
    d, runs = 50, 4000
    sd = np.full(d, 0.01)
    survived = np.array([np.any(base_cut(rng.normal(0.0, 0.01, d), sd) > 0) for _ in range(runs)])
    exact = 1 - (1 - BASE_CUT_ALPHA / d) ** d          # independent keys
    assert abs(survived.mean() - exact) < Z_FEW * binomial_sigma(exact, runs)


def test_a_total_comes_with_its_standard_error():
    """``Estimates.frequency_total`` and its s.e. go together and are finite; the
    measured total is the given one, else the raw estimates' sum over the
    keys with a frequency (a null key's raw estimate left out)."""
    from kvldp.mechanisms.base import Estimates
    from kvldp.mechanisms.estimation.consistency import measured_total

    arrays = dict(frequency=np.array([0.5, np.nan, 0.0]), mean=np.zeros(3), frequency_raw=np.array([0.5, 9.0, -0.2]),
                  mean_raw=np.zeros(3), frequency_se=np.array([0.3, 0.1, 0.4]), mean_se=np.zeros(3), n_reports=10,
                  mechanism="x", epsilon=1.0)
    assert measured_total(Estimates(**arrays)) == pytest.approx((0.3, 0.5))
    assert measured_total(Estimates(**arrays, frequency_total=1.0, frequency_total_se=0.01)) == (1.0, 0.01)
    for total, se in ((1.0, None), (None, 0.1), (np.nan, 0.1), (1.0, np.inf)):
        with pytest.raises(ValueError, match="together"):
            Estimates(**arrays, frequency_total=total, frequency_total_se=se)
