"""The likelihood-ratio intervals of ``kvldp.mechanisms.estimation.intervals``: the
Feldman–Cousins cut, and coverage for every key -- at the boundary ``f = 0``
as well as far from it -- under a parametric bootstrap from the count
model (fresh counts at known truths, the intervals recomputed on each)."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from scipy.stats import chi2

from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.estimation.intervals import (
    _fc_coverage,
    feldman_cousins_cut,
    frequency_intervals,
    grid_intervals,
    wald_intervals,
    wald_z,
)
from kvldp.mechanisms.local import run_local
from tolerances import Z_FEW, binomial_sigma


def test_feldman_cousins_cut_runs_from_chi2_090_at_the_boundary_to_chi2_095_far_from_it():
    assert feldman_cousins_cut(0.0) == pytest.approx(chi2.ppf(0.90, 1), abs=1e-6)
    assert feldman_cousins_cut(8.0) == pytest.approx(chi2.ppf(0.95, 1), abs=1e-6)
    deltas = np.linspace(0, 8, 33)
    cuts = feldman_cousins_cut(deltas)
    assert np.all(cuts <= chi2.ppf(0.95, 1) + 1e-9) and np.all(cuts >= chi2.ppf(0.90, 1) - 1e-9)
    for delta, cut in zip(deltas, cuts, strict=True):     # the table holds what it claims
        assert _fc_coverage(delta, cut) == pytest.approx(0.95, abs=2e-3)


def _bootstrap_coverage(name, truth_f, truth_m, eps, runs, seed):
    """Share of (run, key) whose truth the frequency interval covers, for
    counts drawn afresh from ``name``'s count model at the truth."""
    d = len(truth_f)
    mech = registry.make(name, d, eps)
    est = run_local(mech, SyntheticDataset("uu", n_users=30_000, d=d, seed=1), seed).estimates
    model = est.count_model
    draws = model.sample_counts(truth_f, truth_m, np.random.default_rng(seed), runs)
    covered = np.zeros((runs, d), dtype=bool)
    for r in range(runs):
        lo, hi = frequency_intervals(dataclasses.replace(model, counts=draws[r], total=None, total_variance=None))
        covered[r] = (lo <= truth_f) & (truth_f <= hi)
    return covered


@pytest.mark.parametrize("name, eps", [("pckv-grr", 1.0), ("kvue", 2.0), ("privkv", 1.0), ("pckv-ue", 0.5)])
def test_frequency_intervals_cover_95_percent_at_the_boundary_and_away_from_it(name, eps):
    """Keys at ``f = 0`` (where a fixed chi2_1 cut would cover 97.5 %), near
    it and far from it: each group covered 95 % of the time, pooled over 400
    draws (band ``Z_FEW`` binomial s.d.)."""
    f = np.repeat([0.0, 0.004, 0.05], 10)
    f = f / f.sum() * 0.9
    m = np.linspace(-0.8, 0.8, len(f))
    covered = _bootstrap_coverage(name, f, m, eps, 400, 3)
    for group in (f == 0, (f > 0) & (f < 0.05), f >= 0.05):
        share, n = covered[:, group].mean(), covered[:, group].size
        assert abs(share - 0.95) < Z_FEW * binomial_sigma(0.95, n), (group.nonzero()[0][0], share)


def test_grid_interval_of_a_normal_likelihood_is_plus_minus_1_96_sd():
    grid = np.linspace(-1.0, 1.0, 401)
    centre, sd = np.array([0.1, -0.3]), np.array([0.2, 0.05])
    loglik = -0.5 * ((grid[None, :] - centre[:, None]) / sd[:, None]) ** 2
    lo, hi = grid_intervals(loglik, grid)
    step = grid[1] - grid[0]
    np.testing.assert_allclose(lo, centre - 1.96 * sd, atol=step)
    np.testing.assert_allclose(hi, centre + 1.96 * sd, atol=step)


def test_wald_z_is_scipys_quantile_bit_for_bit_at_every_level():
    from scipy import special
    for level in (0.95, 0.9, 0.99, 0.5):
        assert wald_z(level) == float(-special.ndtri((1 - level) / 2))


def test_raw_estimates_wald_intervals_do_not_import_scipy_special():
    """0.27 s of a fresh process for one number (every run's raw estimates carry these intervals)."""
    import subprocess
    import sys

    code = ("import sys, numpy as np\n"
            "from kvldp.mechanisms.estimation.intervals import wald_intervals\n"
            "lo, hi = wald_intervals(np.array([0.5]), np.array([0.1]), 0.0, 1.0)\n"
            "assert 0.30 < lo[0] < 0.31 and 'scipy.special' not in sys.modules, sorted(sys.modules)\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_wald_intervals_are_clipped_into_the_range_and_null_where_the_se_is():
    lo, hi = wald_intervals(np.array([0.9, 0.0, np.nan]), np.array([0.1, np.nan, 0.1]), -1.0, 1.0)
    assert hi[0] == 1.0 and lo[0] == pytest.approx(0.9 - 0.196, abs=1e-4)
    assert np.isnan(lo[1]) and np.isnan(hi[2])
