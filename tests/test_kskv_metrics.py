"""The top-t metrics of KSKV §5: NCR, the top-t intersection and the MSE
over it (Zhao et al. 2024 §5).
"""
import math

import numpy as np
import pytest

from kvldp.mechanisms.estimation.metrics import mse, ncr, top_keys, top_t_intersection


# =====================================================================
# 1. Metrics (KSKV §5)
# =====================================================================
def test_ncr_hand_computed():
    """t = 3, true order 1 (0.40), 3 (0.30), 4 (0.15): scores 3, 2, 1 (the
    maximum 3 + 2 + 1 = 6). Estimated top-3 {0, 1, 3}: 0 + 3 + 2 = 5 -> 5/6;
    {4, 2, 0}: 1 + 0 + 0 -> 1/6; {1, 3, 4} in any order -> 1."""
    f = np.array([0.05, 0.40, 0.10, 0.30, 0.15])
    assert ncr(f, np.array([0.9, 0.5, 0.1, 0.2, 0.0]), 3) == pytest.approx(5 / 6, rel=1e-12)
    assert ncr(f, np.array([0.1, 0.0, 0.3, -0.1, 0.4]), 3) == pytest.approx(1 / 6, rel=1e-12)
    assert ncr(f, np.array([0.0, 0.1, 0.0, 0.2, 0.3]), 3) == 1.0      # set matters, not its order
    assert ncr(f, np.array([0.0, 0.1, 0.0, 0.2, 0.3]), 1) == 0.0      # 4 is not the top-1
    assert ncr(f, np.array([0.0, 0.1, 0.0, 0.2, 0.3]), 2) == pytest.approx(1 / 3)   # t=2: {4, 3} scores 0 + 1 of 3
    np.testing.assert_array_equal(top_keys(f, 3), [1, 3, 4])


def test_ncr_perfect_disjoint_and_monotone_invariant():
    rng = np.random.default_rng(8)
    f = rng.dirichlet(np.ones(40))
    est = f + rng.normal(0, 0.01, 40)
    for t in (1, 5, 20, 40, 60):
        assert ncr(f, f, t) == 1.0
        assert ncr(f, 3 * f + 1, t) == 1.0
    for t in (1, 10, 20):
        assert ncr(f, -f, t) == 0.0                       # estimated top-t = true bottom-t
    base = ncr(f, est, 10)
    assert 0 < base < 1
    for g in (np.exp, lambda x: 5 * x - 2, lambda x: x ** 3, np.arctan):
        assert ncr(f, g(est), 10) == base


def test_top_t_intersection_and_mse_over_it():
    """True top-3 {1, 3, 4}, estimated top-3 {0, 1, 3}: intersection {1, 3};
    MSE over it = ((0.5-0.4)^2 + (0.2-0.3)^2)/2 = 0.01. mse skips undefined
    truths."""
    f = np.array([0.05, 0.40, 0.10, 0.30, 0.15])
    est = np.array([0.9, 0.5, 0.1, 0.2, 0.0])
    inter = top_t_intersection(f, est, 3)
    np.testing.assert_array_equal(inter, [1, 3])
    assert mse(est, f, inter) == pytest.approx(0.01, rel=1e-12)
    assert mse(est, f) == pytest.approx(np.mean((est - f) ** 2), rel=1e-12)
    assert mse(np.array([1.0, 2.0, 3.0]), np.array([1.0, np.nan, 5.0])) == pytest.approx(2.0)
    assert math.isnan(mse(np.array([1.0]), np.array([np.nan])))
    assert len(top_t_intersection(f, -f, 2)) == 0
