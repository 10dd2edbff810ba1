"""``kvldp simulate --draw-counts``: a simulation that draws each batch's
counts instead of making its reports must draw them from the reports' own
distribution (issue 17: "only simulate may draw aggregate counts directly,
and only behind a flag with a test that the distributions are equal").

Exact check: for a batch of three users, the distribution of the counts
vector is computed by enumerating every report of every user
(``output_probabilities``, the privacy audit's enumeration) and convolving;
both samplers -- the reports added up, and the direct draw -- must pass a
chi-square goodness-of-fit test against it (p > 1e-3, fixed seeds), and a
draw at another epsilon must fail it (p < 1e-6), so the test can tell
distributions apart. Then the pipeline: Beam's draw equals the NumPy loop's
for the same seed, and the flag is refused where no draw exists.
"""
from __future__ import annotations

import collections
import itertools

import numpy as np
import pytest
from scipy.stats import chisquare

from kvldp.cli import commands as cli
from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.local import run_local
from kvldp.pipelines.query import load_counts
from kvldp.plots.tables import read_estimates
from kvldp.transforms.rounds import RunProtocol

DRAWS = 4000
MIN_EXPECTED = 5.0        # chi-square bins below this many expected draws are pooled

# three users of a d = 2 dictionary: interior and vertex values, no pair, two pairs
USERS = [[(0, 0.4)], [], [(0, -1.0), (1, 0.5)]]


def batch(users) -> UserBatch:
    sizes = [len(u) for u in users]
    pairs = [p for u in users for p in u]
    return UserBatch(np.concatenate([[0], np.cumsum(sizes)]), np.array([k for k, _ in pairs], dtype=np.int64),
                     np.array([v for _, v in pairs], dtype=np.float64))


def ioh_outcomes(mech):
    """IOH's reports in ``output_probabilities``' order (``itertools.product``
    of bits) and what each adds to the counts after ``n``: its bits."""
    return np.array(list(itertools.product((0, 1), repeat=mech.n_cells)), dtype=np.int64)


def pckv_outcomes(mech):
    """PCKV-UE's ternary reports (``all_outputs``) and what each adds to
    ``[n1 over d', n2 over d']``: its +1 and its -1 entries."""
    ys = mech.all_outputs()
    return np.concatenate([(ys == 1), (ys == -1)], axis=1).astype(np.int64)


def make(name, eps):
    if name.startswith("ioh"):
        return registry.make(name, 2, eps, ioh_keys=[0]), ioh_outcomes
    return registry.make(name, 2, eps, padding=1), pckv_outcomes


def exact_pmf(mech, contributions, users) -> dict:
    """P(counts after ``n`` = c) for the batch ``users``, by convolving every
    user's exact report distribution."""
    pmf = {(0,) * contributions.shape[1]: 1.0}
    for pairs in users:
        probs = mech.output_probabilities(pairs)
        np.testing.assert_allclose(probs.sum(), 1.0, atol=1e-12)
        out = collections.defaultdict(float)
        for c, pc in pmf.items():
            for o in np.flatnonzero(probs > 0):
                out[tuple(np.add(c, contributions[o]))] += pc * probs[o]
        pmf = out
    return dict(pmf)


def goodness_of_fit(pmf: dict, samples) -> float:
    """Chi-square p-value of ``samples`` (count vectors) against ``pmf``;
    bins expected fewer than ``MIN_EXPECTED`` times are pooled into one."""
    seen = collections.Counter(tuple(int(x) for x in s) for s in samples)
    impossible = set(seen) - set(pmf)
    assert not impossible, f"drew counts the reports cannot add up to: {sorted(impossible)[:3]}"
    n = sum(seen.values())
    big = [c for c, p in pmf.items() if p * n >= MIN_EXPECTED]
    small = [c for c in pmf if c not in set(big)]
    observed = [seen.get(c, 0) for c in big] + [sum(seen.get(c, 0) for c in small)]
    expected = [pmf[c] * n for c in big] + [sum(pmf[c] for c in small) * n]
    if expected[-1] == 0:
        observed, expected = observed[:-1], expected[:-1]
    return chisquare(observed, expected).pvalue


def reported_counts(mech, users, rng):
    counts = mech.accumulate(mech.new_counts(), mech.perturb(users, rng))
    assert counts[0] == users.n_users
    return counts[1:]


def drawn_counts(mech, users, rng):
    counts = mech.draw_counts(users, rng)
    assert counts[0] == users.n_users and counts.dtype == np.int64 and len(counts) == mech.counts_size
    return counts[1:]


@pytest.mark.parametrize("name", ["ioh-sue", "ioh-oue", "pckv-ue", "ks-ue"])
def test_drawn_counts_have_the_reports_exact_distribution(name):
    eps = 1.0
    mech, outcomes = make(name, eps)
    pmf = exact_pmf(mech, outcomes(mech), USERS)
    assert abs(sum(pmf.values()) - 1) < 1e-12
    users = batch(USERS)
    for i, sample in enumerate((reported_counts, drawn_counts)):
        rng = np.random.default_rng([17, i])
        p = goodness_of_fit(pmf, [sample(mech, users, rng) for _ in range(DRAWS)])
        assert p > 1e-3, f"{name} {sample.__name__}: chi-square p = {p:.2e}"
    # the same check rejects counts drawn at another epsilon: it has the power to fail
    other, _ = make(name, 2 * eps)
    rng = np.random.default_rng([17, 2])
    p = goodness_of_fit(pmf, [drawn_counts(other, users, rng) for _ in range(DRAWS)])
    assert p < 1e-6, f"{name}: a draw at eps = {2 * eps} passed as eps = {eps} (p = {p:.2e})"


def test_mechanisms_without_a_draw_refuse_it(capsys):
    assert not registry.can_draw_counts("pckv-grr") and registry.can_draw_counts("ioh-sue")
    with pytest.raises(NotImplementedError, match="cannot draw its counts"):
        registry.make("pckv-grr", 4, 1.0).draw_counts(batch(USERS), np.random.default_rng(0))
    with pytest.raises(ValueError, match="cannot draw its counts"):
        run_local(registry.make("kvue", 4, 1.0), SyntheticDataset("uu", 100, 4, seed=1), seed=1, draw_counts=True)
    with pytest.raises(ValueError, match="cannot draw its counts"):
        RunProtocol(registry.make("privkvm", 4, 1.0), seed=1, draw_counts=True)
    code = cli.main(["simulate", "--mechanism", "pckv-grr", "--epsilon", "1", "--users", "100", "--keys", "4",
                     "--draw-counts"])
    err = capsys.readouterr().err
    assert code == 2 and "--draw-counts: pckv-grr cannot draw its counts" in err and "ioh-sue" in err
    # a deployment's clients send reports: perturb has no such flag
    code = cli.main(["perturb", "--mechanism", "ioh-sue", "--epsilon", "1", "--users", "100", "--keys", "4",
                     "--output", "R.avro", "--draw-counts"])
    assert code == 2 and "unrecognized argument --draw-counts" in capsys.readouterr().err


SIM = ["--epsilon", "3", "--dataset", "synthetic-corr", "--users", "40000", "--keys", "6", "--seed", "2",
       "--batch-size", "10000", "--draw-counts"]


def test_simulate_draws_the_counts_the_numpy_loop_draws(tmp_path, capsys):
    """Beam's ``DrawCountsFn`` uses each batch's generator as the NumPy loop
    does: the same counts, bit for bit; no report is made or counted."""
    out = tmp_path / "ioh.jsonl"
    assert cli.main(["simulate", "--mechanism", "ioh-sue", *SIM, "--ioh-keys", "1,3,4", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "40000 users, their counts drawn without reports" in text
    mech = registry.make("ioh-sue", 6, 3.0, ioh_keys=[1, 3, 4])
    local = run_local(mech, SyntheticDataset("corr", 40_000, 6, seed=2), seed=2, batch_size=10_000,
                      draw_counts=True)
    counts = load_counts(str(out) + ".counts.avro")
    assert counts.record["n_reports"] == 40_000
    assert np.array_equal(counts.record["support"], local.counts[1:])
    reported = run_local(mech, SyntheticDataset("corr", 40_000, 6, seed=2), seed=2, batch_size=10_000)
    assert not np.array_equal(reported.counts, local.counts)     # another sampler: other draws

    out = tmp_path / "pckv.jsonl"
    assert cli.main(["simulate", "--mechanism", "pckv-ue", *SIM, "--postprocess", "raw", "--padding", "2",
                     "--output", str(out)]) == 0
    mech = registry.make("pckv-ue", 6, 3.0, padding=2)
    local = run_local(mech, SyntheticDataset("corr", 40_000, 6, seed=2), seed=2, batch_size=10_000,
                      draw_counts=True)
    records = sorted(read_estimates(str(out)), key=lambda r: int(r["key"]))
    np.testing.assert_array_equal([r["frequency"] for r in records], local.estimates.frequency)


def test_drawn_estimates_are_within_their_standard_errors():
    """PCKV-UE at d = 1,000 over 200k users: every key's raw frequency
    within 4.5 exact standard errors (Theorem 4) of the truth."""
    mech = registry.make("pckv-ue", 1000, 2.0, padding=1)
    data = SyntheticDataset("uu", 200_000, 1000, seed=5)
    run = run_local(mech, data, seed=5, draw_counts=True)
    f, m = run.true_values(1000)
    var_f, _ = mech.variance(200_000, f, m)
    z = (run.estimates.frequency_raw - f) / np.sqrt(var_f)
    assert np.abs(z).max() < 4.5, f"worst z = {np.abs(z).max():.2f}"
    assert 0.8 < z.std() < 1.2          # the spread is the exact path's, not a narrower one
