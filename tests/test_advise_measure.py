"""``kvldp advise``'s measurement: the pilot population, the projection of
a run's errors to n users, and the recommendation by error and time."""
import math

import numpy as np
import pytest

from kvldp.cli import commands as cli
from kvldp.datasets.pilot import pilot_population, weighted_sets, zipf_weights
from kvldp.mechanisms.privacy.randomness import batch_rng
from kvldp.pipelines import advise_measure
from kvldp.pipelines.advise_measure import MATERIAL_SECONDS, projected_mse, recommend
from tolerances import Z_FEW


def test_weighted_sets_are_successive_sampling_without_replacement():
    """Weights (0.5, 0.3, 0.2), two keys each: P({0,1}) = .5*.3/.5 + .3*.5/.7,
    P({0,2}) = .5*.2/.5 + .2*.5/.8, P({1,2}) = .3*.2/.7 + .2*.3/.8; every
    user's keys distinct and sorted."""
    n = 60_000
    owner, key = weighted_sets(np.full(n, 2), np.array([0.5, 0.3, 0.2]), batch_rng(3, 0))
    assert np.array_equal(np.bincount(owner, minlength=n), np.full(n, 2))
    first, second = key[0::2], key[1::2]
    assert np.all(first < second)
    expected = {(0, 1): .5 * .3 / .5 + .3 * .5 / .7, (0, 2): .5 * .2 / .5 + .2 * .5 / .8,
                (1, 2): .3 * .2 / .7 + .2 * .3 / .8}
    for (a, b), p in expected.items():
        share = np.mean((first == a) & (second == b))
        assert abs(share - p) < Z_FEW * math.sqrt(p * (1 - p) / n), (a, b, share, p)


def test_a_set_as_large_as_the_domain_holds_every_key():
    owner, key = weighted_sets(np.array([5, 9]), zipf_weights(5, 1.0), batch_rng(3, 1))
    assert key.tolist() == [0, 1, 2, 3, 4] * 2 and owner.tolist() == [0] * 5 + [1] * 5


def test_the_pilot_follows_the_set_sizes_and_the_zipf_popularity():
    """Sizes drawn from the histogram (each size's share within 4 sigma); a
    one-pair user's key is Zipf(s): key 0's share within 4 sigma of w_0."""
    hist = np.array([0, 600, 300, 100])
    data = pilot_population(40_000, 50, hist, zipf=1.0, seed=5)
    sizes = data.users.sizes
    for k, share in enumerate(hist / hist.sum()):
        assert abs(np.mean(sizes == k) - share) < Z_FEW * math.sqrt(share * (1 - share) / len(sizes)) + 1e-12
    single = data.users.keys[data.users.offsets[:-1][sizes == 1]]
    w0 = zipf_weights(50, 1.0)[0]
    assert abs(np.mean(single == 0) - w0) < Z_FEW * math.sqrt(w0 * (1 - w0) / len(single))
    assert data.d == 50 and np.all(np.abs(data.users.values) <= 1)


@pytest.mark.parametrize("bias", [0.0, 0.004])
def test_the_projection_scales_the_noise_and_keeps_the_bias(bias):
    """Estimates truth + bias + N(0, se) over 4,000 keys from a run at n_p:
    at n = 10 n_p the projected MSE is bias^2 + se^2/10 within 4 of its s.e."""
    rng = np.random.default_rng(7)
    keys, se = 4000, 0.01
    truth = rng.uniform(0, 0.1, keys)
    estimate = truth + bias + rng.normal(0, se, keys)
    at_n, at_n_se = projected_mse(estimate, np.full(keys, se), truth, np.arange(keys), 0.1)
    expected = bias ** 2 + se ** 2 * 0.1
    assert abs(at_n - expected) < Z_FEW * at_n_se + 2 * se ** 2 * 0.1 / math.sqrt(keys) * Z_FEW, (at_n, expected)
    # a missing estimate counts as 0 and is all bias: it does not shrink with n
    estimate[:10] = np.nan
    with_missing, _ = projected_mse(estimate[:20], np.full(20, se), truth[:20], np.arange(20), 0.1)
    assert with_missing >= np.mean(truth[:10] ** 2) / 2 * 0.9


def _row(name, mse, se, seconds):
    return {"mechanism": name, "mse_frequency_top_at_n": mse, "mse_frequency_top_at_n_se": se,
            "mse_frequency_at_n": mse, "seconds_at_n": seconds, "n": 10 ** 6, "users": 20_000}


def test_time_decides_only_between_tied_errors_and_only_where_it_matters():
    slow_best, fast_tied = _row("pckv-ue", 1.0e-6, 0.2e-6, 10 * MATERIAL_SECONDS), _row("ks-grr", 1.3e-6, 0.2e-6, 30)
    fast_worse = _row("pckv-grr", 5e-6, 0.2e-6, 1)
    pick, reason = recommend([slow_best, fast_tied, fast_worse])
    assert pick is fast_tied and "ks-grr is within 2 s.e." in reason and "faster" in reason
    quick_best = _row("pckv-ue", 1.0e-6, 0.2e-6, MATERIAL_SECONDS / 2)       # under a minute: the error decides
    assert recommend([quick_best, fast_tied, fast_worse])[0] is quick_best
    assert recommend([slow_best, fast_worse])[0] is slow_best                 # not tied: the error decides
    pick, reason = recommend([slow_best, fast_worse], max_seconds=MATERIAL_SECONDS)
    assert pick is fast_worse and "1 of 2 run within 60 s" in reason
    pick, reason = recommend([slow_best, fast_worse], max_seconds=0.5)
    assert pick is slow_best and "none runs within 0.5 s" in reason


def test_advise_measures_every_candidate_on_a_pilot_and_projects_to_n(capsys):
    """No dataset: a pilot of --pilot-users with the set sizes; every
    candidate measured, times and errors projected to n (10x the pilot);
    the recommendation is the smallest projected top-20 MSE (every time
    here is far under a minute)."""
    assert cli.main(["advise", "--users", "30000", "--keys", "40", "--epsilon", "2", "--set-sizes",
                     "1:600,2:300,3:100", "--pilot-users", "3000"]) == 0
    text = capsys.readouterr().out
    assert "measured on pilot (Zipf 1, 3,000 users)" in text and "projected from a run of 3,000" in text
    rows = {}
    for name in advise_measure.MEASURED:
        line = next(x for x in text.splitlines() if x.split()[:1] == [name])
        rows[name] = float(line.split()[1])
    recommended = text.splitlines()[0].removeprefix("recommended: ")
    assert recommended == min(rows, key=rows.get), (rows, text)
