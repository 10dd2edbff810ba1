"""The count models the mechanisms attach to their estimates
(``kvldp.mechanisms.estimation.countmodel``): they reproduce the paper's estimates and
standard errors, the real reports follow them, and their factorisation and
parametric bootstrap are what they claim."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.estimation.countmodel import binomial_loglik, binomial_loglik_rows
from kvldp.mechanisms.local import run_local
from tolerances import Z_FEW, Z, mean_square_se

MODELLED = ("pckv-ue", "pckv-grr", "ks-ue", "kvue", "kvoh", "f2m", "privkv", "privkv-a", "privkvm-vi")
FACTORISED = tuple(m for m in MODELLED if m != "kvoh")
PADDED = ("pckv-ue", "pckv-grr", "ks-ue")
D = 40


def _run(name, kind="gg", n=40_000, eps=1.5, seed=5, l=1):
    opts = {"padding": l} if name in PADDED else {}
    mech = registry.make(name, D, eps, **opts)
    data = SyntheticDataset(kind, n_users=n, d=D, seed=4)
    res = run_local(mech, data, seed)
    f, m = res.true_values(D)
    return mech, res.estimates, f, m


@pytest.mark.parametrize("name", MODELLED)
def test_the_model_gives_the_papers_estimate_and_standard_error(name):
    """The model's frequency estimator on the observed counts is the paper's
    raw estimate; its variance at the (clipped) estimate is the paper's
    s.e.^2, up to the variance of holding the key: the model draws users
    i.i.d., so its binomial variance exceeds the fixed population's (PCKV
    Theorem 4) by ``n f (1 - f) (a - b)^2`` -- under 2 % here."""
    _, est, _, _ = _run(name)
    model = est.count_model
    assert model is not None and model.d == D
    np.testing.assert_allclose(model.raw_frequency, est.frequency_raw, rtol=1e-12, atol=1e-15)
    ratio = np.sqrt(model.frequency_variance(np.clip(est.frequency, 0.0, 1.0))) / est.frequency_se
    assert np.all((ratio > 1 - 1e-6) & (ratio < 1.02)), (ratio.min(), ratio.max())
    assert model.factorises == (name in FACTORISED)


@pytest.mark.parametrize("name", FACTORISED)
def test_the_factorisation_is_a_distribution_and_its_mle_is_the_paper_estimate(name):
    _, est, _, _ = _run(name)
    model = est.count_model
    f, m = np.linspace(0.0, 1.0, D), np.linspace(-1.0, 1.0, D)
    pi = model.probabilities(f, m)
    np.testing.assert_allclose(pi.sum(axis=0), 1.0, atol=1e-12)
    # the chance of a present report does not depend on the value; the split does
    np.testing.assert_allclose(model.present_probability(f),
                               model.probabilities(f, -m)[list(model.present)].sum(axis=0), atol=1e-12)
    rho = model.plus_share(np.full(D, 0.5), m)
    assert np.all((rho > 0) & (rho < 1)) and np.all(np.diff(rho) > 0)
    # the binomial likelihood of S_k peaks at the paper's estimate (clipped into [0, 1])
    grid = np.linspace(0.0, 1.0, 20_001)
    peak = grid[np.argmax(model.frequency_loglik(grid), axis=1)]
    np.testing.assert_allclose(peak, np.clip(est.frequency_raw, 0.0, 1.0), atol=grid[1])


@pytest.mark.parametrize("name", FACTORISED)
def test_the_reports_follow_the_model_at_the_truth(name):
    """Real perturbations of real (single-pair) users: the key counts ``S_k``
    and the value splits at the true ``(f, m)`` have z-scores of mean 0 and
    mean square 1 over the keys (bands ``Z_FEW`` s.e.)."""
    _, est, f, m = _run(name, n=60_000)
    model = est.count_model
    S, M, plus = model.present_counts, model.totals, model.plus_counts
    P = model.present_probability(f)
    rho = model.plus_share(f, np.nan_to_num(m))
    z = np.concatenate([(S - M * P) / np.sqrt(M * P * (1 - P)), (plus - S * rho) / np.sqrt(S * rho * (1 - rho))])
    assert abs(z.mean()) < Z_FEW / np.sqrt(len(z)), z.mean()
    assert abs(np.mean(z ** 2) - 1) < Z_FEW * mean_square_se(len(z)), np.mean(z ** 2)


@pytest.mark.parametrize("name", ["pckv-grr", "kvue", "privkv"])
def test_the_parametric_bootstrap_has_the_models_moments(name):
    """``sample`` at ``(f, m)``: the raw frequency estimates' mean is ``f``
    and their variance the model's (``Z`` per key over ``D`` keys)."""
    _, est, f, m = _run(name)
    model = est.count_model
    draws, _ = model.sample(f, np.nan_to_num(m), np.random.default_rng(3), 2000)
    var = model.frequency_variance(f)
    assert np.all(np.abs(draws.mean(axis=0) - f) < Z * np.sqrt(var / 2000))
    assert np.all(np.abs(draws.var(axis=0, ddof=1) / var - 1) < Z * np.sqrt(2 / 1999))


@pytest.mark.parametrize("name", PADDED)
def test_the_total_from_the_dummy_keys_is_the_pairs_per_user(name):
    """Padding-and-sampling: the real keys' frequencies add up to ``l`` minus
    the dummy keys' -- what they estimate, ``mean(min(|S|, l))`` pairs per
    user -- estimated with the variance of ``l`` keys, not of ``d``."""
    l = 3
    _, est, _, _ = _run(name, kind="multi", l=l, eps=2.0)
    model = est.count_model
    data = SyntheticDataset("multi", n_users=40_000, d=D, seed=4)
    sizes = np.concatenate([b.sizes for b in data.batches(10_000)])
    assert abs(model.total - np.mean(np.minimum(sizes, l))) < Z * np.sqrt(model.total_variance)
    assert model.total_variance < np.sum(est.frequency_se ** 2) / 5


def test_a_model_refuses_inconsistent_symbols():
    _, est, _, _ = _run("kvue")
    model = est.count_model
    with pytest.raises(ValueError):
        dataclasses.replace(model, holder_plus=model.holder_plus[:2])
    with pytest.raises(ValueError):
        dataclasses.replace(model, plus=1)             # not a present symbol


def test_the_rows_kernel_is_binomial_loglik_bit_for_bit():
    """``binomial_loglik_rows`` (per-key counts against one shared table, the
    posterior means' hot path) against ``binomial_loglik`` broadcast, on
    counts with zeros and probabilities with 0, 1 and 0/0."""
    rng = np.random.default_rng(5)
    trials = rng.integers(0, 40, 300).astype(np.float64)
    successes = np.floor(trials * rng.random(300))
    successes[:20], trials[20:40] = 0, successes[20:40]          # no successes; no failures
    p = rng.random((7, 11))
    p[0, :3], p[1, :3], p[2, :3] = 0.0, 1.0, np.nan
    want = binomial_loglik(successes[:, None, None], trials[:, None, None], p[None], constant=False)
    got = binomial_loglik_rows(successes, trials, p)
    assert np.isneginf(want).any() and not np.isnan(want).any()
    np.testing.assert_array_equal(got.view(np.int64), want.view(np.int64))


@pytest.mark.parametrize("name", ["pckv-ue", "ks-ue"])
def test_the_split_likelihood_of_a_shared_model_is_the_broadcast_one(name):
    data = SyntheticDataset("uu", n_users=3_000, d=30, seed=2)
    model = run_local(registry.make(name, data.d, 2.0), data, seed=3).estimates.count_model
    assert model.shared
    keys, f, m = np.arange(data.d), np.linspace(0, 0.5, 9), np.linspace(-1, 1, 5)
    broadcast = dataclasses.replace(model)
    broadcast.__dict__["shared"] = False        # the general path: per-key symbol columns
    np.testing.assert_array_equal(model.split_loglik(keys, f, m).view(np.int64),
                                  broadcast.split_loglik(keys, f, m).view(np.int64))
