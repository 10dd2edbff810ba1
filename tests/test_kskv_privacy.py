"""KSKV privacy: exact audits of KS-UE (Algorithm 1, Theorem 4.1), of
KS-GRR's two rounds (formula (7); round 1 is OLH) and of KS-Adap's final
round, and the clients' draws checked against the audited distributions
(SPEC.md §4; Zhao et al. 2024 §4; notation in kskv_helpers.py).
"""
import itertools
import math

import numpy as np
import pytest

from kskv_helpers import formula7, ks_ue_p_a
from kvldp.mechanisms.kv.ksadap import KSAdap
from kvldp.mechanisms.kv.kskv import KSGRR, KSUE, grr_p, grr_pairs, grr_q, sample_one_pair
from kvldp.mechanisms.privacy.randomness import batch_rng
from kvldp.mechanisms.protocol import ProtocolState
from ldp_audit import all_users
from tolerances import Z, assert_counts_match, binomial_sigma
from user_batches import identical_users

EPSILONS = (0.5, 1.0, 2.0, 4.0)


def grr_matrix(n_keys, eps):
    """P(output pair j | input pair i) over the 2 n_keys pairs (index 2k + [x > 0])."""
    p, q = grr_p(n_keys, eps), grr_q(n_keys, eps)
    return np.where(np.eye(2 * n_keys, dtype=bool), p, q)


def pair_index(k, x):
    return 2 * k + (1 if x > 0 else 0)


def worst_ratio(P):
    """Largest P(y|u)/P(y|u') over all users u, u' (rows) and outputs y (columns)."""
    P = np.asarray(P)
    assert np.all(P > 0)
    return float((P.max(axis=0) / P.min(axis=0)).max())


def assert_matches(counts, probs, n):
    """``probs`` is a distribution (sums to 1) and every output's empirical
    frequency is within Z binomial sigma of it (tolerances.assert_counts_match)."""
    probs = np.asarray(probs)
    np.testing.assert_allclose(probs.sum(), 1.0, rtol=0, atol=1e-12)
    assert_counts_match(counts, probs, n)


# =====================================================================
# 1. KS-UE: parameters, exact privacy audit, perturb
# =====================================================================
@pytest.mark.parametrize("eps", [*EPSILONS, 6.0])
def test_ksue_report_distribution_is_algorithm_1(eps):
    """A single-pair user's report (l = 1, so d+1 positions with one dummy)
    is the product of formulas (3)/(4): output_probabilities reproduces the
    product written from Algorithm 1's (p, a), so KSUE's PCKV-style
    parameters (A = 1-p, B = a, P = p/(1-p)) are the paper's."""
    p, a = ks_ue_p_a(eps)
    # (the paper's "0 < a < 1/2" holds only for eps > ln 2; what the
    # estimator needs is a < 1 - p, i.e. a non-zero entry is likelier at the key)
    assert 1 / 3 < p < 1 / 2 and 0 < a < 1 - p
    d = 3
    mech = KSUE(d, eps)
    ys = mech.all_outputs().astype(int)
    for k, x in itertools.product(range(d), (-1, 1)):
        own = np.select([ys[:, k] == x, ys[:, k] == -x], [p, 1 - 2 * p], p)         # formula (4)
        other = np.where(ys == 0, 1 - a, a / 2)                                       # formula (3)
        expect = own * np.prod(np.delete(other, k, axis=1), axis=1)
        np.testing.assert_allclose(mech.output_probabilities([(k, float(x))]), expect, rtol=1e-12, atol=0)


UE_CASES = [(2, 1), (2, 2), (3, 1), (3, 2), (4, 1)]       # 3^(d+l) outputs: d + l <= 5


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("d, l", UE_CASES)
def test_ksue_exact_privacy_audit(d, l, eps):
    """Every user (all S ⊆ {0..d-1}, empty and |S| > l included, values ±1),
    every report: the worst log-ratio is exactly eps (Theorem 4.1 is tight),
    and the inherited tight-composition bound (PCKV Theorem 2) equals eps
    too, while the naive eps1 + eps2 exceeds it."""
    mech = KSUE(d, eps, padding=l)
    P = np.array([mech.output_probabilities(u) for u in all_users(d)])
    assert P.shape == (3 ** d, 3 ** (d + l))
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    audited = math.log(worst_ratio(P))
    assert audited == pytest.approx(eps, rel=1e-9)
    assert mech.theorem_epsilon() == pytest.approx(eps, rel=1e-9)
    assert mech.eps1 + mech.params.eps2 > eps + 1e-6


@pytest.mark.parametrize("pairs", [[(0, 0.5), (2, -1.0)], [(0, 0.2), (1, -0.6), (2, 1.0)], []],
                         ids=["|S|=l", "|S|>l", "empty"])
def test_ksue_perturb_matches_output_probabilities(pairs):
    """KS-UE (d=3, l=2, eps=1): the 3^5 ternary reports drawn by the
    (inherited) sparse sampler have the audited probabilities, so the audit
    describes what the client sends (200k users, 4.5 sigma per output)."""
    d, l, eps, n = 3, 2, 1.0, 200_000
    mech = KSUE(d, eps, padding=l)
    dp = d + l
    reports = mech.perturb(identical_users(pairs, n), batch_rng(61, len(pairs)))
    owner = np.repeat(np.arange(n), np.diff(reports.offsets))
    y = np.zeros((n, dp), dtype=np.int64)
    y[owner, reports.positions] = reports.symbols
    weights = 3 ** np.arange(dp - 1, -1, -1)
    np.testing.assert_array_equal((mech.all_outputs() + 1) @ weights, np.arange(3 ** dp))
    counts = np.bincount((y + 1) @ weights, minlength=3 ** dp)
    assert_matches(counts, mech.output_probabilities(pairs), n)


# =====================================================================
# 2. KS-GRR: formula (7), exact audits of both rounds, client draws
# =====================================================================
@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("t", [1, 2, 3, 20])
def test_grr_p_q_are_formula_7(t, eps):
    """grr_p/grr_q over |K'| = 2t + 1 keys are formula (7)'s e^eps/(e^eps+4t+1)
    and 1/(e^eps+4t+1), and the 4t+2 pair probabilities add up to 1."""
    p, q = formula7(t, eps)
    assert grr_p(2 * t + 1, eps) == pytest.approx(p, rel=1e-12)
    assert grr_q(2 * t + 1, eps) == pytest.approx(q, rel=1e-12)
    assert p + (4 * t + 1) * q == pytest.approx(1.0, rel=1e-12)


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("t", [1, 2])
def test_ksgrr_final_round_exact_audit(t, eps):
    """Group 2's report over K' = TKS ∪ {⊥} (2t candidates, ⊥ = index 2t).
    The user domain: a candidate holder <k, ±1>, or anyone else (a
    non-candidate key or no pair), who reports <⊥, fair coin>. The worst ratio
    over all users and outputs is exactly e^eps, and so is the worst ratio
    between a candidate holder and a ⊥ user (P(<k,x>) p vs q)."""
    n_keys = 2 * t + 1
    G = grr_matrix(n_keys, eps)
    np.testing.assert_allclose(G.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    holders = np.array([G[pair_index(k, x)] for k in range(2 * t) for x in (-1, 1)])
    bottom = 0.5 * (G[pair_index(2 * t, -1)] + G[pair_index(2 * t, 1)])
    users = np.vstack([holders, bottom])
    e = math.exp(eps)
    assert worst_ratio(users) == pytest.approx(e, rel=1e-9)
    assert worst_ratio(G) == pytest.approx(e, rel=1e-9)          # every pair of K', <⊥, ±1> included
    cross = max((holders / bottom).max(), (bottom / holders).max())
    assert cross == pytest.approx(e, rel=1e-9)
    assert (bottom / holders).max() == pytest.approx((e + 1) / 2, rel=1e-9)   # at <⊥, ±1>


@pytest.mark.parametrize("t", [1, 2])
def test_grr_pairs_draws_the_analytic_distribution(t):
    """grr_pairs over 2t + 1 keys: 200k draws of one input pair, every (key,
    sign) output within 4.5 binomial sigma of the analytic row."""
    eps, n = 1.5, 200_000
    n_keys = 2 * t + 1
    G = grr_matrix(n_keys, eps)
    for i, (k, x) in enumerate([(0, 1), (2 * t - 1, -1), (2 * t, 1)]):
        rep = grr_pairs(np.full(n, k), np.full(n, x), n_keys, eps, batch_rng(70 + t, i))
        np.testing.assert_array_equal(rep.offsets, np.arange(n + 1))
        assert set(np.unique(rep.symbols)) <= {-1, 1}
        counts = np.bincount(2 * rep.positions.astype(np.int64) + (rep.symbols > 0), minlength=2 * n_keys)
        assert_matches(counts, G[pair_index(k, x)], n)


def test_ksgrr_client_final_round_draws_the_audited_distribution():
    """KSGRR.perturb of round 2 (d = 6, t = 2, candidates = keys 3, 5, 1, 4
    by rank): a candidate holder with value v reports by GRR from
    <rank, Disc(v)>; a non-candidate holder and a user without pairs report
    from <⊥, fair coin>; multi-pair users' one sampled pair decides. 200k
    users per case, 4.5 sigma per output."""
    eps, n = 1.5, 200_000
    proto = KSGRR(6, eps, top=2)
    rank = np.array([-1, 2, -1, 0, 3, 1], dtype=float)
    state = ProtocolState(1, rank, False, eps, None)
    G = grr_matrix(5, eps)
    bottom = 0.5 * (G[pair_index(4, -1)] + G[pair_index(4, 1)])

    def holder(r, v):
        return (1 + v) / 2 * G[pair_index(r, 1)] + (1 - v) / 2 * G[pair_index(r, -1)]

    cases = {
        "candidate": ([(3, 1.0)], holder(0, 1.0)),
        "candidate-fractional": ([(5, -0.2)], holder(1, -0.2)),
        "non-candidate": ([(0, 0.7)], bottom),
        "no-pair": ([], bottom),
        "mixed": ([(2, 0.4), (4, -1.0)], 0.5 * bottom + 0.5 * holder(3, -1.0)),
    }
    for i, (pairs, expect) in enumerate(cases.values()):
        rep = proto.perturb_round(1, identical_users(pairs, n, batch_id=i), batch_rng(80, i), state)
        assert rep.n_reports == n and rep.batch_id == i
        counts = np.bincount(2 * rep.positions.astype(np.int64) + (rep.symbols > 0), minlength=10)
        assert_matches(counts, expect, n)


@pytest.mark.parametrize("eps", EPSILONS)
def test_ksgrr_round_1_olh_is_eps_ldp(eps):
    """Round 1 is OLH over the d keys plus "no pair" at the full eps: within
    the hashed domain of g values the report is GRR_g, kept w.p. p, every
    other value w.p. 1/(e^eps+g-1): p/q = e^eps exactly."""
    proto = KSGRR(30, eps, top=3)
    o = proto.olh
    assert (o.d, o.epsilon) == (31, eps)
    other = (1 - o.p) / (o.g - 1)
    assert other == pytest.approx(1 / (math.exp(eps) + o.g - 1), rel=1e-12)
    M = np.where(np.eye(o.g, dtype=bool), o.p, other)
    assert worst_ratio(M) == pytest.approx(math.exp(eps), rel=1e-9)


def test_round_1_reports_one_uniformly_sampled_key_by_olh():
    """Round 1's client: users with 3 keys report each w.p. 1/3 (the hashed
    report is kept w.p. p); users without pairs report item d."""
    eps, n, d = 2.0, 150_000, 10
    proto = KSAdap(d, eps, top=2)
    users = identical_users([(1, 0.1), (4, -0.3), (7, 0.9)], n)
    key, value, has = sample_one_pair(users, batch_rng(90, 0))
    assert has.all() and set(np.unique(key)) == {1, 4, 7}
    for k, v in ((1, 0.1), (4, -0.3), (7, 0.9)):
        share = np.mean(key == k)
        assert abs(share - 1 / 3) < Z * math.sqrt(2 / 9 / n), (k, share)
        assert np.all(value[key == k] == v)
    o = proto.olh
    for pairs, item in (([(6, 0.5)], 6), ([], d)):
        rep = proto.perturb_round(0, identical_users(pairs, n), batch_rng(91, item), proto.initial_state())
        kept = np.mean(rep.values == o.hash(rep.a, rep.b, np.full(n, item)))
        assert abs(kept - o.p) < Z * binomial_sigma(o.p, n), (item, kept)


# =====================================================================
# 3. KS-Adap: exact audit of the final round
# =====================================================================
def adap_sampling(pairs, n_c, l):
    """Padding-and-sampling written out over the 2(n_c + l) pairs of
    TKS ∪ {l dummies}: |S| <= l: each real pair 1/l, each dummy (1-|S|/l)/l
    (fair sign); |S| > l: each real pair 1/|S|."""
    w = np.zeros(2 * (n_c + l))
    s = len(pairs)
    mass = 1 / l if s <= l else 1 / s
    for k, v in pairs:
        w[pair_index(k, 1)] += mass * (1 + v) / 2
        w[pair_index(k, -1)] += mass * (1 - v) / 2
    if s < l:
        w[2 * n_c:] += (1 - s / l) / l / 2
    return w


@pytest.mark.parametrize("eps", EPSILONS)
@pytest.mark.parametrize("n_c, l", [(2, 1), (2, 2), (2, 3), (3, 1), (3, 2), (4, 2), (4, 3), (4, 5)])
def test_ksadap_final_round_exact_audit(n_c, l, eps):
    """Every user set of candidate keys (empty, <= l, > l; values ±1) after
    padding-and-sampling and GRR over TKS ∪ {l dummies}: the worst ratio is
    max P / min P = (q + (p-q)/l)/q = 1 + (e^eps-1)/l (a real pair is sampled
    w.p. at most 1/l; some user never samples it), so e^eps exactly at
    l = 1 and below it for l > 1."""
    G = grr_matrix(n_c + l, eps)
    P = []
    for pairs in all_users(n_c):
        w = adap_sampling(pairs, n_c, l)
        assert w.sum() == pytest.approx(1.0, abs=1e-12)
        P.append(w @ G)
    ratio = worst_ratio(np.array(P))
    e = math.exp(eps)
    assert ratio == pytest.approx(1 + (e - 1) / l, rel=1e-9)
    assert ratio <= e * (1 + 1e-12)
    if l == 1:
        assert ratio == pytest.approx(e, rel=1e-9)


def test_ksadap_client_final_round_draws_the_audited_distribution():
    """KSAdap.perturb of round 3 (d = 7, t = 2: candidates 2, 5, 0, 3 by
    rank; l = 2): only candidate pairs count, padding-and-sampling with l,
    GRR over the 4 + 2 keys. 200k users per case, 4.5 sigma per output."""
    eps, n, l = 1.5, 200_000, 2
    proto = KSAdap(7, eps, top=2)
    rank = np.array([2, -1, 0, 3, -1, 1, -1], dtype=float)
    state = ProtocolState(2, rank, False, eps, None, (("padding", l),))
    G = grr_matrix(4 + l, eps)
    cases = [
        ([(2, 1.0), (1, 0.3)], [(0, 1.0)]),                         # |S ∩ TKS| = 1 < l
        ([(0, -1.0), (3, 0.6), (5, 1.0), (6, 0.2)], [(2, -1.0), (3, 0.6), (1, 1.0)]),   # 3 > l
        ([], []),
        ([(1, 0.5), (4, -0.5)], []),                                # no candidate key
    ]
    for i, (pairs, ranked) in enumerate(cases):
        rep = proto.perturb_round(2, identical_users(pairs, n, batch_id=i), batch_rng(95, i), state)
        assert rep.n_reports == n
        counts = np.bincount(2 * rep.positions.astype(np.int64) + (rep.symbols > 0), minlength=2 * (4 + l))
        assert_matches(counts, adap_sampling(ranked, 4, l) @ G, n)
