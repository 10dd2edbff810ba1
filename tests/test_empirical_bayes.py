"""Empirical Bayes building blocks (``kvldp.mechanisms.estimation.empirical_bayes``),
each against its defining property: Bayes' rule on a grid, the penalised
maximum likelihood prior (its first-order condition, and recovering a known
prior), the gamma carrier's moments, James–Stein / Morris shrinkage (the
Paule–Mandel equation and the posterior mean formula), and the
hierarchical normal posterior (towards the pooled mean, more for noisier
keys, lower error than the keys' own estimates)."""
from __future__ import annotations

import numpy as np
import pytest

from kvldp.mechanisms.estimation import empirical_bayes as eb
from tolerances import Z_FEW


def _normal_loglik(x, grid, sd):
    return -0.5 * ((x[:, None] - grid[None, :]) / np.asarray(sd)[..., None]) ** 2


def test_posterior_weights_are_bayes_rule():
    prior = np.array([0.5, 0.3, 0.2])
    loglik = np.log(np.array([[0.1, 0.2, 0.7], [0.6, 0.3, 0.1]]))
    w = eb.posterior_weights(loglik, prior)
    expected = np.exp(loglik) * prior
    np.testing.assert_allclose(w, expected / expected.sum(axis=1, keepdims=True), rtol=1e-12)


def test_the_fitted_prior_recovers_a_two_point_prior_and_is_stationary():
    """2,000 draws from 0.7 N(0.2, s) + 0.3 N(0.8, s) (s = 0.1): the fitted
    prior puts 0.7 of its mass below 0.5 (band ``Z_FEW`` binomial s.d.), and
    at the optimum the penalised log-likelihood's gradient is 0."""
    rng = np.random.default_rng(5)
    truth = np.where(rng.random(2000) < 0.7, 0.2, 0.8)
    x = truth + rng.normal(0, 0.1, len(truth))
    grid = np.linspace(-0.2, 1.2, 71)
    loglik = _normal_loglik(x, grid, np.full(len(x), 0.1))
    basis = eb.spline_basis(grid, 12)
    prior = eb.fit_exponential_family_prior(loglik, basis, penalty=0.1)
    low = prior[grid < 0.5].sum()
    assert abs(low - 0.7) < Z_FEW * np.sqrt(0.7 * 0.3 / len(x))
    # first-order condition (Efron 2016 eq. 3.3): sum_k (w_k - g) Q = penalty alpha/|alpha|
    w = eb.posterior_weights(loglik, prior)
    alpha = np.linalg.lstsq(basis, np.log(prior) - np.log(prior).mean(), rcond=None)[0]
    grad = (w.sum(axis=0) - len(x) * prior) @ basis
    np.testing.assert_allclose(grad, 0.1 * alpha / np.linalg.norm(alpha), atol=0.05 * np.abs(grad).max() + 1e-3)


def test_the_gamma_carrier_has_the_moments_it_is_given():
    grid = np.linspace(0.0, 0.05, 5001)
    carrier = eb.gamma_carrier(grid, 0.004, 0.003 ** 2)
    mean = carrier @ grid
    assert mean == pytest.approx(0.004, rel=1e-2)
    assert carrier @ grid ** 2 - mean ** 2 == pytest.approx(0.003 ** 2, rel=2e-2)
    point = eb.gamma_carrier(grid, 0.004, 0.0)        # no spread: a point mass (floored elsewhere)
    assert grid[np.argmax(point)] == pytest.approx(0.004, abs=1e-5) and point.max() > 0.99


def test_normal_shrinkage_solves_paule_mandel_and_shrinks_by_the_noise():
    rng = np.random.default_rng(1)
    theta = rng.normal(0.3, 0.2, 400)
    v = rng.uniform(0.005, 0.2, 400)
    y = theta + rng.normal(0, np.sqrt(v))
    post = eb.normal_shrinkage(y, v)
    w = 1 / (post.tau2 + v)
    assert np.sum(w * (y - post.mu) ** 2) == pytest.approx(len(y) - 1, rel=1e-6)     # Paule–Mandel
    np.testing.assert_allclose(post.mean, post.mu + post.tau2 / (post.tau2 + v) * (y - post.mu), rtol=1e-12)
    assert abs(post.tau2 - 0.04) < 0.015 and abs(post.mu - 0.3) < 0.05
    assert np.mean((post.mean - theta) ** 2) < np.mean((y - theta) ** 2)


def test_normal_shrinkage_without_excess_spread_gives_every_key_the_pooled_mean():
    rng = np.random.default_rng(2)
    y = 0.1 + rng.normal(0, 0.3, 200) * 0.5          # spread below the stated noise
    post = eb.normal_shrinkage(y, np.full(200, 0.09))
    assert post.tau2 == 0.0
    np.testing.assert_allclose(post.mean, post.mu)


def test_the_hierarchical_posterior_shrinks_towards_the_pooled_mean_more_for_noisier_keys():
    """Keys with true values from N(0.4, 0.15^2) and normal noise of s.d.
    0.05 or 0.5: the posterior means beat the keys' own estimates in MSE,
    move the noisy keys further towards the pooled mean, and the fitted prior
    centres near 0.4."""
    rng = np.random.default_rng(3)
    theta = np.clip(rng.normal(0.4, 0.15, 600), -1, 1)
    sd = np.where(np.arange(600) % 2 == 0, 0.05, 0.5)
    y = theta + rng.normal(0, sd)
    grid = np.linspace(-1, 1, 201)
    post = eb.hierarchical_normal_posterior(_normal_loglik(y, grid, sd), grid)
    mean = post.mean
    assert post.prior @ grid == pytest.approx(0.4, abs=0.05)
    noisy = sd == 0.5
    assert np.mean((mean[noisy] - theta[noisy]) ** 2) < 0.5 * np.mean((np.clip(y, -1, 1)[noisy] - theta[noisy]) ** 2)
    pull = np.abs(mean - np.clip(y, -1, 1)) / np.maximum(np.abs(np.clip(y, -1, 1) - 0.4), 1e-9)
    assert np.median(pull[noisy]) > 0.8 > 0.2 > np.median(pull[~noisy])


def test_an_independent_mean_pins_the_prior_the_counts_cannot():
    """Keys whose counts hardly separate a prior at 0 from one at 0.01 (noise
    s.d. 0.05, the noise's draws summing below 0): without the mean
    constraint the fit sits near 0; with an independent observation of the
    mean (0.01 +- 0.0002) the prior's mean is that observation within
    ``Z_FEW`` of its s.d."""
    rng = np.random.default_rng(9)
    truth = rng.exponential(0.01, 3000)
    x = truth + rng.normal(0, 0.05, len(truth))
    x -= x.mean() + 0.002                                  # a sum below 0, as a noisy large domain gives
    grid = np.linspace(0.0, 0.2, 201)
    loglik = _normal_loglik(x, grid, np.full(len(x), 0.05))
    free = eb.fit_log_spline_prior(loglik, grid, 1e-4)
    assert free @ grid < 0.005
    pinned = eb.fit_log_spline_prior(loglik, grid, 1e-4, mean=eb.MeanConstraint(grid, 0.01, 0.0002 ** 2))
    assert abs(pinned @ grid - 0.01) < Z_FEW * 0.0002
