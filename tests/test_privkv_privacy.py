"""Exact privacy audits of every round's LPP (PrivKV, PrivKVM, PrivKVM+),
the uniform fake's bound, and the client's draws against the audited
distribution
(SPEC.md §1; Ye et al. 2019; bands in privkv_helpers.py).
"""
import math

import numpy as np
import pytest

from kvldp.mechanisms.kv.privkv import FAKE_UNIFORM, PrivKV, lpp_output_probabilities, lpp_perturb
from kvldp.mechanisms.kv.privkvm import PrivKVM, PrivKVMPlus
from kvldp.mechanisms.privacy.randomness import batch_rng
from ldp_audit import all_users, keep, log_worst_ratio
from tolerances import assert_counts_match
from user_batches import identical_users

# =====================================================================
# 1. Exact privacy audit of every round's LPP
# =====================================================================
# Only vertex values v in {-1, +1} are needed: lpp_output_probabilities is
# affine in each held value (Disc(v) = +1 w.p. (1+v)/2, checked below), so a
# user with interior values has a convex combination of vertex users'
# output distributions, and a ratio of two convex combinations never exceeds
# the largest ratio between their components. The fake m~ is not user data
# (uniform or the public broadcast), so it is fixed per audit.


def audit(d, p1, p2, fake):
    P = np.array([lpp_output_probabilities(u, d, p1, p2, fake) for u in all_users(d)])
    assert P.shape == (3 ** d, 3 * d)
    return log_worst_ratio(P)


EXTREME_FAKES = {2: [[-1.0, 0.3], [0.5, 1.0], [-1.0, 1.0]], 3: [[-1.0, 0.2, 1.0], [0.4, -0.3, 1.0]]}
INTERIOR_FAKES = {2: [[0.3, -0.6]], 3: [[0.1, -0.7, 0.9]]}


def _audit_round(proto, r, d):
    p1, p2 = proto.p1(r), proto.p2(r)
    assert p1 == pytest.approx(keep(proto.key_eps[r]), rel=1e-15)
    assert p2 == pytest.approx(keep(proto.value_eps[r]), rel=1e-15)
    budget = proto.key_eps[r] + proto.value_eps[r]
    for fake in EXTREME_FAKES[d]:
        # a holder of <j, +1> vs a non-holder with m~_j = -1 on output <1, +1>:
        # p1 p2 / ((1 - p1)(1 - p2)) = e^(eps1 + eps2) -- the bound is attained
        a = audit(d, p1, p2, fake)
        assert a <= budget + 1e-9
        assert a == pytest.approx(budget, rel=1e-9)
    for fake in INTERIOR_FAKES[d]:
        a = audit(d, p1, p2, fake)
        if proto.key_eps[r] > 0:
            # with no extreme m~ the non-holder's <1, +-1> has probability
            # > (1-p1)(1-p2), so the worst ratio is strictly inside the bound
            assert a < budget - 1e-6, (a, budget)
        else:
            # p1 = 1/2: the key bit says nothing, and holders of +1 vs -1 on
            # <1, +1> still attain e^eps2 whatever m~ is
            assert a == pytest.approx(budget, rel=1e-9)
    return budget


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("eps", [0.5, 2.0, 4.0])
def test_privkvm_rounds_are_exactly_eps1_plus_eps2(d, eps):
    """Each PrivKVM round (c = 3) with a broadcast fake: worst ratio =
    key_eps[r] + value_eps[r]; rounds >= 2 have p1 = 1/2, so that is eps/(2c).
    Round 1's real fake is uniform: see the next test."""
    proto = PrivKVM(d, eps, rounds=3)
    total = sum(_audit_round(proto, r, d) for r in range(3))
    assert total == pytest.approx(eps, rel=1e-12)


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("eps", [0.5, 2.0, 4.0])
def test_privkvm_plus_rounds_are_exactly_eps1_plus_eps2(d, eps):
    """PrivKVM+ rounds 1..4 (round 1's real fake m~ = 1 is extreme)."""
    proto = PrivKVMPlus(d, eps, t=2.0, max_rounds=4)
    assert audit(d, proto.p1(0), proto.p2(0), proto.initial_fake()) == pytest.approx(
        proto.key_eps[0] + proto.value_eps[0], rel=1e-9)
    total = sum(_audit_round(proto, r, d) for r in range(4))
    assert total == pytest.approx(eps * (1 - 0.5 ** 4), rel=1e-12)


@pytest.mark.parametrize("d", [2, 3])
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0])
def test_uniform_fake_audit_is_eps1_plus_ln_2p2(d, eps):
    """A uniform m~ discretises to a fair coin. Output <1, +1>: a holder of
    +1 has p1 p2, a non-holder (1 - p1)/2: ratio e^eps1 * 2 p2. The other
    ratios are e^eps1 (<0, 0>), e^eps2 (holders +1 vs -1), e^eps1 * 2(1-p2)
    and e^-eps1 / (2(1-p2)) (non-holder over holder of -1); with eps1 >= eps2
    (PrivKV's eps/2 each; PrivKVM round 1's eps/2 vs eps/6) the first is the
    largest: eps1 + ln(2 p2) >= eps2 iff e^eps1 >= (1 + e^eps2)/2, and
    >= -eps1 - ln(2(1 - p2)) iff e^eps1 >= cosh(eps2/2). It is < eps1 + eps2
    since 2 p2 < e^eps2 (i.e. 2 < 1 + e^eps2)."""
    for eps1, eps2, p1, p2 in [
            (PrivKV(d, eps).eps1, PrivKV(d, eps).eps2, PrivKV(d, eps).p1, PrivKV(d, eps).p2),
            (PrivKVM(d, eps, 3).key_eps[0], PrivKVM(d, eps, 3).value_eps[0],
             PrivKVM(d, eps, 3).p1(0), PrivKVM(d, eps, 3).p2(0))]:
        assert eps1 >= eps2
        a = audit(d, p1, p2, FAKE_UNIFORM)
        assert a == pytest.approx(eps1 + math.log(2 * p2), rel=1e-9)
        assert a < eps1 + eps2 - 1e-6
    mech = PrivKV(d, eps)
    np.testing.assert_array_equal(mech.output_probabilities([(0, 1.0)]),
                                  lpp_output_probabilities([(0, 1.0)], d, mech.p1, mech.p2, FAKE_UNIFORM))


def test_lpp_output_probabilities_affine_in_values():
    """The vertex argument's premise, and a fractional user stays in budget."""
    d, p1, p2, fake = 3, keep(1.0), keep(0.7), [0.2, -1.0, 0.6]
    for v in (-0.7, 0.0, 0.45):
        mixed = lpp_output_probabilities([(0, -1.0), (2, v)], d, p1, p2, fake)
        plus = lpp_output_probabilities([(0, -1.0), (2, 1.0)], d, p1, p2, fake)
        minus = lpp_output_probabilities([(0, -1.0), (2, -1.0)], d, p1, p2, fake)
        np.testing.assert_allclose(mixed, (1 + v) / 2 * plus + (1 - v) / 2 * minus, rtol=1e-12, atol=0)
    rng = np.random.default_rng(3)
    users = [[(k, rng.uniform(-1, 1)) for k in sorted(rng.choice(d, size=s, replace=False))]
             for s in range(d + 1) for _ in range(4)]
    P = np.array([lpp_output_probabilities(u, d, p1, p2, fake) for u in users])
    assert math.log((P.max(axis=0) / P.min(axis=0)).max()) <= 1.7 + 1e-9


LPP_CASES = [
    ([(0, 0.5), (2, -1.0)], FAKE_UNIFORM, 1.0, 1.0),
    ([(1, -0.3)], np.array([1.0, -0.4, -1.0]), 1.5, 0.5),
    ([], np.array([0.2, 1.0, -0.8]), 0.0, 0.8),      # PrivKVM later round: p1 = 1/2
]


@pytest.mark.parametrize("pairs, fake, eps1, eps2", LPP_CASES, ids=["uniform", "broadcast", "empty-p1-half"])
def test_lpp_perturb_draws_output_probabilities(pairs, fake, eps1, eps2):
    """The audit describes what the client really draws: for one user
    repeated n = 200k times, every (j, s) frequency within 4.5 binomial
    sigma of lpp_output_probabilities (Bonferroni over the 9 outputs)."""
    d, n = 3, 200_000
    p1, p2 = keep(eps1), keep(eps2)
    rep = lpp_perturb(identical_users(pairs, n), d, p1, p2, fake, batch_rng(61, len(pairs)))
    np.testing.assert_array_equal(rep.offsets, np.arange(n + 1))
    counts = np.bincount(3 * rep.positions.astype(np.int64) + rep.symbols + 1, minlength=3 * d)
    assert_counts_match(counts, lpp_output_probabilities(pairs, d, p1, p2, fake), n)
