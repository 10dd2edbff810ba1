"""Exact privacy audit of PCKV-UE and PCKV-GRR (PCKV.md "Privacy";
Theorems 2 and 3 of Gu et al. 2020).

For small d and l every possible user is enumerated: every key set
S ⊆ {0..d-1} (empty set and sets larger than l included) with every
assignment of values in {-1, +1}. The worst ratio P(y|S)/P(y|S') over all
pairs of users and all outputs y must equal the tight-composition epsilon of
the theorem -- which the optimised allocation makes exactly the requested
eps -- and be strictly below the naive eps1 + eps2.

Only the vertices v ∈ {-1, +1} are needed: ``output_probabilities`` is affine
in each value v (Disc(v) is +1 w.p. (1+v)/2), so the distribution of a user
with fractional values is a convex combination of vertex distributions, and
a ratio of convex combinations never exceeds the worst vertex ratio
(``test_output_probabilities_affine_in_values`` checks the affinity).

Finally ``output_probabilities`` is checked against ``perturb``: the audit is
only meaningful if it describes the distribution the client really draws.
"""

import numpy as np
import pytest

from kvldp.mechanisms.kv.pckv import PCKVGRR, PCKVUE, PCKVParams
from kvldp.mechanisms.privacy.randomness import batch_rng
from ldp_audit import all_users, check_vertex_argument, log_worst_ratio
from tolerances import assert_counts_match
from user_batches import identical_users

EPSILONS = (0.5, 1.0, 2.0, 4.0)
# UE enumerates 3^(d+l) outputs: keep d + l <= 5.
UE_CASES = [(2, 1), (2, 2), (3, 1), (3, 2), (4, 1)]
GRR_CASES = [(2, 1), (2, 2), (3, 1), (3, 2), (4, 2), (5, 3), (3, 4), (6, 1)]




def audit(mech):
    """ln of the worst ratio over every pair of users and every output."""
    P = np.array([mech.output_probabilities(pairs) for pairs in all_users(mech.d)])
    assert P.shape == (3 ** mech.d, len(mech.all_outputs()))
    return log_worst_ratio(P)


def _check_exact(mech, eps):
    audited = audit(mech)
    assert audited == pytest.approx(mech.theorem_epsilon(), rel=1e-9)
    assert audited <= eps + 1e-9
    assert mech.theorem_epsilon() == pytest.approx(eps, rel=1e-9)
    naive = mech.eps1 + mech.params.eps2
    assert naive > audited + 1e-6, (naive, audited)


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("d, l", UE_CASES)
def test_pckv_ue_audit_matches_theorem_2(d, l, eps):
    _check_exact(PCKVUE(d, eps, padding=l), eps)


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("d, l", GRR_CASES)
def test_pckv_grr_audit_matches_theorem_3(d, l, eps):
    _check_exact(PCKVGRR(d, eps, padding=l), eps)


@pytest.mark.parametrize("eps", EPSILONS)
def test_pckv_ue_with_l_above_d_stays_within_budget(eps):
    """With l > d no user can fill l slots, so Theorem 2 is an upper bound
    that is not attained; the audited epsilon must still respect it."""
    mech = PCKVUE(2, eps, padding=3)
    audited = audit(mech)
    assert audited <= mech.theorem_epsilon() + 1e-9
    assert audited <= eps + 1e-9


@pytest.mark.parametrize("cls, d, l", [(PCKVUE, 2, 2), (PCKVUE, 3, 1), (PCKVUE, 3, 2),
                                       (PCKVGRR, 2, 1), (PCKVGRR, 3, 2), (PCKVGRR, 4, 2)])
def test_theorems_are_exact_for_arbitrary_parameters(cls, d, l):
    """Theorems 2/3 hold with equality for any (a, b, p), not just the optimum:
    the audit tracks the theorem when the parameters move, so it can fail."""
    rng = np.random.default_rng(100 * d + l)
    mech = cls(d, 1.0, padding=l)
    for _ in range(4):
        p = rng.uniform(0.55, 0.95)
        if cls is PCKVUE:
            b = rng.uniform(0.05, 0.45)
            a = rng.uniform(b + 0.05, 0.95)
        else:
            a = rng.uniform(0.4, 0.9)
            b = (1 - a) / (d + l - 1)
        mech.params = PCKVParams(a=a, b=b, p=p, d=d, l=l)
        assert audit(mech) == pytest.approx(mech.theorem_epsilon(), rel=1e-9)
        assert mech.theorem_epsilon() > 0


@pytest.mark.parametrize("cls", [PCKVUE, PCKVGRR])
def test_output_probabilities_affine_in_values(cls):
    """The vertex argument: P(y | v) = (1+v)/2 P(y | +1) + (1-v)/2 P(y | -1),
    and fractional users stay within the audited budget."""
    check_vertex_argument(cls(3, 1.0, padding=2), 1.0, users_per_size=3)


# ----------------------------------------- perturb draws that distribution --
UE_USERS = [[(0, 0.5), (2, -1.0)], [(0, 0.2), (1, -0.6), (2, 1.0)], []]


@pytest.mark.parametrize("pairs", UE_USERS, ids=["|S|=l", "|S|>l", "empty"])
def test_pckv_ue_perturb_matches_output_probabilities(pairs):
    """PCKV-UE (d=3, l=2, eps=0.5): the 3^5 ternary vectors drawn by perturb
    have the exact probabilities of output_probabilities."""
    d, l, eps, n = 3, 2, 0.5, 200_000
    mech = PCKVUE(d, eps, padding=l)
    dp = mech.params.d_prime
    reports = mech.perturb(identical_users(pairs, n), batch_rng(41, len(pairs)))
    assert reports.n_reports == n
    assert set(np.unique(reports.symbols)) <= {-1, 1}
    owner = np.repeat(np.arange(n), np.diff(reports.offsets))
    assert np.all(np.diff(reports.positions)[owner[1:] == owner[:-1]] > 0)  # sorted, no duplicates
    y = np.zeros((n, dp), dtype=np.int64)
    y[owner, reports.positions] = reports.symbols
    weights = 3 ** np.arange(dp - 1, -1, -1)
    outputs = mech.all_outputs()
    np.testing.assert_array_equal((outputs + 1) @ weights, np.arange(len(outputs)))  # index map
    counts = np.bincount((y + 1) @ weights, minlength=len(outputs))
    assert_counts_match(counts, mech.output_probabilities(pairs), n)


GRR_USERS = [[(1, 0.3)], [(0, -0.4), (2, 1.0), (3, 0.8)], []]


@pytest.mark.parametrize("pairs", GRR_USERS, ids=["|S|<l", "|S|>l", "empty"])
def test_pckv_grr_perturb_matches_output_probabilities(pairs):
    """PCKV-GRR (d=4, l=2, eps=2): the (key, sign) reports drawn by perturb
    have the exact probabilities of output_probabilities."""
    d, l, eps, n = 4, 2, 2.0, 200_000
    mech = PCKVGRR(d, eps, padding=l)
    reports = mech.perturb(identical_users(pairs, n), batch_rng(42, len(pairs)))
    np.testing.assert_array_equal(reports.offsets, np.arange(n + 1))
    assert set(np.unique(reports.symbols)) <= {-1, 1}
    outputs = mech.all_outputs()
    index = {(int(k), int(s)): i for i, (k, s) in enumerate(outputs)}
    assert len(index) == len(outputs) == 2 * mech.params.d_prime
    idx = 2 * reports.positions.astype(np.int64) + (reports.symbols > 0)
    assert all(index[(k, s)] == 2 * k + (s > 0) for k, s in index)
    counts = np.bincount(idx, minlength=len(outputs))
    assert_counts_match(counts, mech.output_probabilities(pairs), n)
