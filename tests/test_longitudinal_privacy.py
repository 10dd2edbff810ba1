"""Exact privacy audits of the longitudinal mode (enumeration, small d and l).

For every user state with vertex values (``ldp_audit.all_users``) the joint
distribution of ``T <= 4`` reports of that unchanged state is computed
exactly (``Longitudinal.joint_output_probabilities``: permanent layer once,
instantaneous layer per report). Asserted:

* two-layer and memoised: the worst likelihood ratio of the joint output
  between any two states is <= e^eps_inf, for every T;
* one two-layer report is e^eps_1-LDP, and tightly so;
* fresh perturbation (the base mechanism drawn anew per report) composes to
  exactly T eps;
* the composed channel is the base mechanism's at the composed parameters
  (so the base estimator is unbiased for it).
"""
from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from kvldp.mechanisms import registry
from kvldp.mechanisms.kv import layers
from kvldp.mechanisms.kv.longitudinal import longitudinal
from ldp_audit import all_users

# (mechanism, d, options): domains small enough to enumerate 4 reports
CASES = [("pckv-grr", 3, {"padding": 2}), ("pckv-ue", 2, {"padding": 1}), ("ks-ue", 2, {"padding": 1}),
         ("kvue", 3, {})]
BUDGETS = [(2.0, 0.5), (1.5, 1.0), (4.0, 1.0)]


def log_worst(P) -> float:
    """``ln max P(y|u)/P(y|u')`` over outputs some user can produce; every
    user must be able to produce each of them (else the ratio is infinite)."""
    P = np.asarray(P, dtype=np.float64)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-11)
    possible = P.max(axis=0) > 0
    assert np.all(P[:, possible] > 0), "an output only some users can produce"
    return math.log((P[:, possible].max(axis=0) / P[:, possible].min(axis=0)).max())


def build(name, d, options, eps_inf, eps_1):
    return longitudinal(registry.make(name, d, eps_inf, **options), eps_1)


@pytest.mark.parametrize("name, d, options", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("eps_inf, eps_1", BUDGETS)
def test_repeated_reports_of_one_state_lose_at_most_eps_inf(name, d, options, eps_inf, eps_1):
    mech = build(name, d, options, eps_inf, eps_1)
    users = list(all_users(d))
    worst = [log_worst([mech.joint_output_probabilities(u, T) for u in users]) for T in (1, 2, 3, 4)]
    assert worst[0] == pytest.approx(eps_1, abs=1e-9)                  # one report: eps_1, tight
    assert all(w <= eps_inf + 1e-9 for w in worst), worst               # any T: at most eps_inf
    assert all(b >= a - 1e-12 for a, b in itertools.pairwise(worst))   # more reports never say less
    assert worst[3] > eps_1 + 0.3 * (min(4 * eps_1, eps_inf) - eps_1)   # the audit sees the accumulation


@pytest.mark.parametrize("name, d, options", CASES, ids=[c[0] for c in CASES])
def test_memoised_single_layer_is_eps_inf_for_every_count(name, d, options):
    mech = build(name, d, options, 1.5, None)
    assert mech.t == 1.0
    users = list(all_users(d))
    for T in (1, 2, 3, 4):
        assert log_worst([mech.joint_output_probabilities(u, T) for u in users]) == pytest.approx(1.5, abs=1e-9)


@pytest.mark.parametrize("name, d, options", CASES, ids=[c[0] for c in CASES])
def test_fresh_perturbation_composes_to_count_times_eps(name, d, options):
    """The base mechanism drawn afresh per report (today's behaviour): T
    independent reports, the worst ratio is exactly T eps."""
    eps = 1.5
    fresh = registry.make(name, d, eps, **options)
    users = list(all_users(d))
    single = [fresh.output_probabilities(u) for u in users]
    for T in (1, 2, 3, 4):
        joint = []
        for p in single:
            out = p
            for _ in range(T - 1):
                out = np.outer(out, p).ravel()
            joint.append(out)
        assert log_worst(joint) == pytest.approx(T * eps, abs=1e-9)


@pytest.mark.parametrize("name, d, options", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("eps_inf, eps_1", BUDGETS)
def test_composed_channel_is_the_base_mechanism_at_composed_parameters(name, d, options, eps_inf, eps_1):
    mech = build(name, d, options, eps_inf, eps_1)
    for user in all_users(d):
        np.testing.assert_allclose(mech.output_probabilities(user), mech.composed.output_probabilities(user),
                                   rtol=0, atol=1e-14)


def test_joint_distribution_is_affine_in_each_value():
    """The premise of enumerating vertex values only (ldp_audit): a held
    value enters through Disc in the permanent layer, linearly."""
    for name, d, options in CASES:
        mech = build(name, d, options, 2.0, 0.5)
        for v in (-0.6, 0.0, 0.35):
            mixed = mech.joint_output_probabilities([(0, 1.0), (1, v)], 2)
            plus = mech.joint_output_probabilities([(0, 1.0), (1, 1.0)], 2)
            minus = mech.joint_output_probabilities([(0, 1.0), (1, -1.0)], 2)
            np.testing.assert_allclose(mixed, (1 + v) / 2 * plus + (1 - v) / 2 * minus, rtol=1e-12, atol=1e-15)


def test_larger_padding_domain_two_reports():
    """PCKV-UE with l = 2 (d' = 5, 3^5 outputs per report): two reports."""
    mech = build("pckv-ue", 3, {"padding": 2}, 2.0, 0.5)
    users = list(all_users(3))
    assert log_worst([mech.output_probabilities(u) for u in users]) == pytest.approx(0.5, abs=1e-9)
    assert log_worst([mech.joint_output_probabilities(u, 2) for u in users]) <= 2.0 + 1e-9


def _l_grr_p2(k: int, eps_inf: float, eps_1: float) -> float:
    """multi-freq-ldpy's ``L_GRR_Client`` second-round keep probability
    (Arcolezi et al. 2021), written out."""
    p1 = math.exp(eps_inf) / (math.exp(eps_inf) + k - 1)
    q1 = (1 - p1) / (k - 1)
    e1 = math.exp(eps_1)
    return (q1 - e1 * p1) / (-p1 * e1 + k * q1 * e1 - q1 * e1 - p1 * (k - 1) + q1)


def _composed_grr_epsilon(k: int, eps_inf: float, p2: float) -> float:
    p1 = math.exp(eps_inf) / (math.exp(eps_inf) + k - 1)
    q1, q2 = (1 - p1) / (k - 1), (1 - p2) / (k - 1)
    return math.log((p1 * p2 + (k - 1) * q1 * q2) / (p1 * q2 + q1 * p2 + (k - 2) * q1 * q2))


def test_kvue_second_layer_is_exact_l_grr():
    """KVUE's instantaneous layer is L-GRR's second round, solved on the exact
    composed channel: its keep probability ``t + (1-t)/k`` equals
    multi-freq-ldpy's closed form for k = 2; for k = 3 that closed form (which
    solves the two-state ratio ``(p1 p2 + q1 q2)/(p1 q2 + q1 p2) = e^eps_1``)
    is conservative -- its report loses less than eps_1 -- while ours loses
    exactly eps_1 and keeps more of the permanent report."""
    for eps_inf, eps_1 in BUDGETS:
        t2 = layers.grr_mixing(2, eps_1, eps_inf)
        assert t2 + (1 - t2) / 2 == pytest.approx(_l_grr_p2(2, eps_inf, eps_1), rel=1e-12)
        mech = build("kvue", 4, {}, eps_inf, eps_1)
        ours, theirs = mech.t + (1 - mech.t) / 3, _l_grr_p2(3, eps_inf, eps_1)
        assert _composed_grr_epsilon(3, eps_inf, ours) == pytest.approx(eps_1, abs=1e-12)
        assert _composed_grr_epsilon(3, eps_inf, theirs) < eps_1 - 1e-3
        assert ours > theirs


def test_per_report_formulas_reproduce_the_pckv_theorems():
    """layers.py's general per-report losses, at the base mechanisms' own
    parameters, are PCKV's Theorems 2 and 3 (and KS-UE's eps)."""
    for eps in (0.5, 2.0, 4.0):
        for l in (1, 2, 3):
            for name in ("pckv-ue", "ks-ue"):
                m = registry.make(name, 10, eps, padding=l)
                assert layers.ue_epsilon(layers.of(m.params), l) == pytest.approx(m.theorem_epsilon(), abs=1e-12)
                assert m.theorem_epsilon() == pytest.approx(eps, abs=1e-12)
            m = registry.make("pckv-grr", 10, eps, padding=l)
            assert layers.grr_pairs_epsilon(layers.of(m.params), l) == pytest.approx(m.theorem_epsilon(), abs=1e-12)


def test_eps_1_above_eps_inf_is_refused():
    with pytest.raises(ValueError, match="exceeds eps_inf"):
        build("pckv-grr", 3, {}, 1.0, 2.0)
    with pytest.raises(ValueError, match="implemented for"):
        longitudinal(registry.make("privkv", 3, 1.0), 0.5)
