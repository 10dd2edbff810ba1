"""Privacy of F2M, KVUE and KVOH: exact audits by enumeration, the wrong
variants they catch, and the clients' draws against the audited
distributions
(SPEC.md §2; Sun et al. 2019 §IV; notation and bands in sun_helpers.py).
"""
import math

import numpy as np
import pytest

from kvldp.mechanisms.kv.sun import F2M, KVOH, KVUE
from kvldp.mechanisms.privacy.randomness import batch_rng
from ldp_audit import all_users, check_vertex_argument, keep, log_worst_ratio
from tolerances import assert_counts_match
from user_batches import identical_users, users_from_states

# =====================================================================
# 1. Exact privacy audits by enumeration
# =====================================================================
# Only vertex values v in {-1, +1} are needed: output_probabilities is affine
# in each held value (Disc(v) = +1 w.p. (1+v)/2, checked below), so a user
# with interior values has a convex combination of vertex users' output
# distributions, and a ratio of two convex combinations never exceeds the
# largest ratio between their components. The empty key set is one of the
# 3^d users enumerated.


def audit(mech):
    """ln of the worst P(y|S)/P(y|S') over all pairs of users and outputs y."""
    P = np.array([mech.output_probabilities(u) for u in all_users(mech.d)])
    assert P.shape == (3 ** mech.d, mech.d * len(mech.symbols))
    return log_worst_ratio(P)


EPSILONS = (0.5, 1.0, 2.0, 4.0)


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("cls", [KVUE, KVOH, F2M])
def test_audit_is_exactly_epsilon(cls, eps, d):
    """KVUE: GRR over 3 states, worst ratio p/q = e^eps (Theorem 3).
    KVOH: two bits of the one-hot differ, each RR at eps/2: e^eps.
    F2M with eps1 = eps2 = eps/2 and v_default = 1: a holder of <j, -1> vs a
    non-holder (whose fake value is +1) on output (key bit 0, value +1):
    p1 p2 / ((1-p1)(1-p2)) = e^(eps1+eps2) = e^eps. The bound is attained
    and never exceeded."""
    mech = cls(d, eps)
    a = audit(mech)
    assert a <= eps + 1e-9
    assert a == pytest.approx(eps, rel=1e-9)


@pytest.mark.parametrize("eps", EPSILONS)
def test_f2m_splits_the_budget_evenly(eps):
    mech = F2M(3, eps)
    assert mech.p1 == pytest.approx(keep(eps / 2), rel=1e-15)
    assert mech.p2 == pytest.approx(keep(eps / 2), rel=1e-15)


@pytest.mark.parametrize("eps", [1.0, 2.0])
def test_f2m_audit_with_other_defaults(eps):
    """v_default = -1 is a vertex as well (a holder of +1 vs a non-holder on
    (key 0, -1) attains e^eps); an interior default (0.3) gives a non-holder
    a value bit strictly between the holders' and the worst ratio is
    strictly inside the budget -- the audit tells these apart."""
    assert audit(F2M(3, eps, default_value=-1.0)) == pytest.approx(eps, rel=1e-9)
    inner = audit(F2M(3, eps, default_value=0.3))
    assert inner < eps - 1e-3, inner


@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_audit_catches_wrong_probabilities(eps):
    """Plausible wrong variants are caught: KVOH with eps (not eps/2) per bit
    audits at 2 eps; KVUE with the binary RR keep probability e^eps/(e^eps+1)
    and the rest split over the two other states audits at eps + ln 2."""
    kvoh = KVOH(3, eps)
    kvoh.p = keep(eps)
    assert audit(kvoh) == pytest.approx(2 * eps, rel=1e-9)
    kvue = KVUE(3, eps)
    kvue.p = keep(eps)
    kvue.q = (1 - kvue.p) / 2
    assert audit(kvue) == pytest.approx(eps + math.log(2), rel=1e-9)


@pytest.mark.parametrize("cls", [KVUE, KVOH, F2M])
def test_output_probabilities_affine_in_values(cls):
    """The vertex argument's premise; fractional users stay within budget."""
    check_vertex_argument(cls(3, 1.0), 1.0, users_per_size=4)


def test_symbol_probabilities_by_hand():
    """The per-state symbol distributions of Eq. (3), Eq. (7) and Alg. 3."""
    eps = 1.3
    e = math.exp(eps)
    kvue = KVUE(4, eps)
    for s in range(3):
        want = np.full(3, 1 / (e + 2))
        want[s] = e / (e + 2)
        np.testing.assert_allclose(kvue.symbol_probabilities(s, 0), want, rtol=1e-14)
    kvoh, p = KVOH(4, eps), keep(eps / 2)
    for s in range(3):
        for mask in range(8):
            want = np.prod([p if ((mask >> b) & 1) == (b == s) else 1 - p for b in range(3)])
            assert kvoh.symbol_probabilities(s, 0)[mask] == pytest.approx(want, rel=1e-14)
    f2m, p1, p2 = F2M(4, eps, default_value=0.4), keep(eps / 2), keep(eps / 2)
    up = {0: 0.0, 1: 0.7, 2: 1.0}                       # P(Disc = +1): v = -1, default 0.4, +1
    for s in range(3):
        k1 = p1 if s != 1 else 1 - p1
        plus = up[s] * p2 + (1 - up[s]) * (1 - p2)
        want = [k1 * (1 - plus), (1 - k1) * (1 - plus), (1 - k1) * plus, k1 * plus]   # -2, -1, +1, +2
        np.testing.assert_allclose(f2m.symbol_probabilities(s, 0), want, rtol=1e-14)


# =====================================================================
# 2. perturb draws the audited distribution
# =====================================================================
PERTURB_USERS = [[(0, 0.5), (2, -1.0)], [(1, -0.3)], []]


@pytest.mark.parametrize("pairs", PERTURB_USERS, ids=["two-pairs", "one-pair", "empty"])
@pytest.mark.parametrize("cls", [KVUE, KVOH, F2M])
def test_perturb_matches_output_probabilities(cls, pairs):
    """One user repeated n = 200k times (d = 3, eps = 1): every (j, symbol)
    frequency within 4.5 binomial sigma of output_probabilities (which the
    audit above bounds); accumulate counts the same symbols."""
    d, eps, n = 3, 1.0, 200_000
    mech = cls(d, eps)
    rep = mech.perturb(identical_users(pairs, n), batch_rng(71, len(pairs) + 10 * len(mech.symbols)))
    np.testing.assert_array_equal(rep.offsets, np.arange(n + 1))
    index = {s: i for i, s in enumerate(mech.symbols)}
    assert set(np.unique(rep.symbols).tolist()) <= set(index)
    sym = np.vectorize(index.get)(rep.symbols.astype(np.int64))
    counts = np.bincount(rep.positions.astype(np.int64) * len(mech.symbols) + sym,
                         minlength=d * len(mech.symbols))
    assert_counts_match(counts, mech.output_probabilities(pairs), n)
    acc = mech.accumulate(mech.new_counts(), rep)
    assert acc[0] == n
    np.testing.assert_array_equal(mech.stack(acc).T.ravel(), counts)      # stack is (symbol, key)


@pytest.mark.parametrize("cls", [KVUE, KVOH, F2M])
def test_symbol_meaning_without_noise(cls):
    """At eps = 30 the perturbation keeps everything (flip probabilities
    <= 3e-7 per bit; 5,000 users): the symbol is the documented encoding of
    the sampled key's canonical pair -- KVUE: state - 1; KVOH: mask 1 << state;
    F2M: Disc(v or v_default) * (1 + key bit). Values are +-1 so the state
    is known; users hold key sets of every size."""
    n, d = 5000, 3
    rng = np.random.default_rng(12)
    states = rng.integers(0, 3, size=(n, d))
    users = users_from_states(states)
    mech = cls(d, 30.0)
    rep = mech.perturb(users, batch_rng(5, 0))
    j = rep.positions.astype(np.int64)
    s = states[np.arange(n), j]
    assert len(np.unique(j)) == d
    if cls is KVUE:
        want = s - 1
    elif cls is KVOH:
        want = 1 << s
    else:
        held = s != 1
        want = np.where(held, s - 1, 1) * (1 + held)            # default value +1
    np.testing.assert_array_equal(rep.symbols, want)
