"""IOH's client and its privacy: each digit at its key, independent
discretisation per key, the exact audit of the unary encoding over 3^k cells
and the report bits' distribution
(SPEC.md §2; Sun et al. 2019 §V; Sun et al. 2021 §3; notation and bands
in ioh_helpers.py).
"""
import itertools
import math

import numpy as np
import pytest

from ioh_helpers import ue_params
from kvldp.mechanisms.base import ReportBatch, UserBatch
from kvldp.mechanisms.kv.cells import state_index
from kvldp.mechanisms.kv.ioh import IOH, PackedReportBatch
from kvldp.mechanisms.privacy.randomness import batch_rng
from tolerances import Z, binomial_sigma, binomial_z
from user_batches import users_from_pairs


# =====================================================================
# 1. Client: digits at the right keys
# =====================================================================
def test_states_put_each_digit_at_its_key():
    """Column j of IOH.states is dictionary key ioh_keys[j], keys outside
    ioh_keys are ignored, and the index makes ioh_keys[0] most significant."""
    mech = IOH(6, 1.0, ioh_keys=[5, 1, 3])
    users = users_from_pairs([
        [(5, 1.0)],                          # (2, 1, 1) -> 18 + 3 + 1 = 22
        [(1, -1.0), (4, 1.0)],               # key 4 not chosen: (1, 0, 1) -> 9 + 0 + 1 = 10
        [(0, 1.0), (3, 1.0), (5, -1.0)],     # (0, 1, 2) -> 0 + 3 + 2 = 5
        [],                                  # (1, 1, 1) -> 13
    ])
    states = mech.states(users, np.random.default_rng(0))
    np.testing.assert_array_equal(states, [[2, 1, 1], [1, 0, 1], [0, 1, 2], [1, 1, 1]])
    np.testing.assert_array_equal(state_index(states), [22, 10, 5, 13])
    assert mech.estimate_keys == [5, 1, 3] and mech.config()["ioh_keys"] == [5, 1, 3]


def test_states_discretise_each_key_independently():
    """A holder of v is at state 2 w.p. (1 + v)/2, independently per key:
    200k users holding key 0 at 0.5 and key 1 at -0.2."""
    n = 200_000
    mech = IOH(2, 1.0, ioh_keys=[0, 1])
    users = UserBatch(np.arange(n + 1) * 2, np.tile([0, 1], n), np.tile([0.5, -0.2], n))
    s = mech.states(users, np.random.default_rng(3))
    assert set(np.unique(s)) == {0, 2}
    probs = {(a, b): pa * pb for (a, pa), (b, pb) in itertools.product([(2, 0.75), (0, 0.25)], [(2, 0.4), (0, 0.6)])}
    for (a, b), p in probs.items():
        rate = np.mean((s[:, 0] == a) & (s[:, 1] == b))
        assert abs(rate - p) < Z * binomial_sigma(p, n), (a, b, rate, p)


# =====================================================================
# 2. Privacy: exact audit of the unary encoding over 3^k cells
# =====================================================================
def all_reports(n_cells):
    return ((np.arange(2 ** n_cells)[:, None] >> np.arange(n_cells)) & 1).astype(bool)


def ioh_audit(mech):
    """Enumerate every true cell and every report bit vector (2^(3^k))."""
    reports = all_reports(mech.n_cells)
    P = np.array([[mech.output_probability(c, y) for y in reports] for c in range(mech.n_cells)])
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(P > 0)
    return math.log((P.max(axis=0) / P.min(axis=0)).max())


@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("eps", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("variant", ["oue", "sue"])
def test_ioh_audit_by_enumeration(variant, eps, k):
    """k = 1 (3 cells, 8 reports) and k = 2 (9 cells, 512 reports): the worst
    ratio over every pair of true cells and every report is e^eps. Any user
    is one of the 3^k cells once discretised, and a fractional value mixes
    cells (Disc), so the vertex argument covers interior values."""
    mech = IOH(k, eps, variant, ioh_keys=list(range(k)))
    p, q = ue_params(variant, eps)
    assert (mech.p, mech.q) == (pytest.approx(p, rel=1e-15), pytest.approx(q, rel=1e-15))
    a = ioh_audit(mech)
    assert a <= eps + 1e-9
    assert a == pytest.approx(eps, rel=1e-9)


@pytest.mark.parametrize("variant", ["oue", "sue"])
@pytest.mark.parametrize("eps", [0.5, 2.0])
def test_ioh_audit_k3_factorised(variant, eps):
    """k = 3: 2^27 reports are too many. P(y | c) = prod_i P(y_i | c), and
    every bit but c and c' has the same law under both cells, so
    P(y|c)/P(y|c') = r_c(y_c) * r_c'(y_c') with r_c(1) = p/q, r_c(0) =
    (1-p)/(1-q), r_c'(1) = q/p, r_c'(0) = (1-q)/(1-p). The max over y is
    max(p/q, (1-p)/(1-q)) * max(q/p, (1-q)/(1-p)) = (p/q) ((1-q)/(1-p)),
    which is e^eps for SUE (e^(eps/2) twice) and OUE ((e^eps+1)/2 * 2e^eps/
    (e^eps+1)). Checked: the factorisation on random reports, the bound's
    value, and that the argmax report (y_c = 1, y_c' = 0, rest random)
    attains it for all 27 x 26 ordered pairs."""
    mech = IOH(3, eps, variant)
    p, q = mech.p, mech.q
    bound = max(p / q, (1 - p) / (1 - q)) * max(q / p, (1 - q) / (1 - p))
    assert bound == pytest.approx(math.exp(eps), rel=1e-12)
    rng = np.random.default_rng(4)
    worst = 0.0
    for c, c2 in itertools.permutations(range(27), 2):
        y = rng.random(27) < 0.3
        ratio = mech.output_probability(c, y) / mech.output_probability(c2, y)
        factor = (p / q if y[c] else (1 - p) / (1 - q)) * (q / p if y[c2] else (1 - q) / (1 - p))
        assert ratio == pytest.approx(factor, rel=1e-9)
        worst = max(worst, ratio)
        y[c], y[c2] = True, False
        assert mech.output_probability(c, y) / mech.output_probability(c2, y) == pytest.approx(math.exp(eps), rel=1e-9)
    assert worst <= math.exp(eps) * (1 + 1e-9)


def test_ioh_audit_catches_per_bit_epsilon():
    """A plausible wrong variant -- SUE with eps (not eps/2) per bit -- audits at 2 eps."""
    eps = 1.0
    mech = IOH(2, eps, "sue", ioh_keys=[0, 1])
    mech.p, mech.q = math.exp(eps) / (math.exp(eps) + 1), 1 / (math.exp(eps) + 1)
    assert ioh_audit(mech) == pytest.approx(2 * eps, rel=1e-9)


@pytest.mark.parametrize("variant, eps, v0", [("oue", 1.0, 1.0), ("sue", 1.0, 1.0),
                                               ("oue", 1.0, 0.5), ("sue", 1.0, 0.5), ("oue", 3.0, 0.5)])
def test_perturb_bit_rates(variant, eps, v0):
    """n = 200k copies of one user. k = 3, d = 4, keys (0, 1, 3): the user
    holds key 0 at v0, not key 1, key 3 at -1 (and key 2, not chosen, at
    0.9): cell (2,1,0) = 21 w.p. (1 + v0)/2, else (0,1,0) = 3. Bit i is set
    w.p. P(cell = i) p + (1 - P(cell = i)) q -- p at the true cell and q
    elsewhere when v0 = 1 -- every bit within 4.5 binomial sigma. Bits are
    independent given the cell: P(bits a and b) = sum_c P(c) P(a|c) P(b|c).
    Packed rows are ceil(27/8) = 4 bytes, padding bits 0; sparse reports list
    each user's set positions in order."""
    n = 200_000
    mech = IOH(4, eps, variant, ioh_keys=[0, 1, 3])
    p, q = ue_params(variant, eps)
    users = UserBatch(np.arange(n + 1) * 3, np.tile([0, 2, 3], n), np.tile([v0, 0.9, -1.0], n))
    rep = mech.perturb(users, batch_rng(55, int(10 * eps + 100 * v0) + (variant == "sue")))
    if mech.sparse:                      # q < 1/16 (OUE at eps 3): the sorted set positions
        assert isinstance(rep, ReportBatch) and rep.n_reports == n
        bits = np.zeros((n, 27), dtype=bool)
        bits[np.repeat(np.arange(n), np.diff(rep.offsets)), rep.positions] = True
        spans = zip(rep.offsets[:50], rep.offsets[1:51], strict=True)
        assert all(np.all(np.diff(rep.positions[a:b]) > 0) for a, b in spans)
    else:
        assert isinstance(rep, PackedReportBatch) and rep.bits.shape == (n, 4) and rep.n_cells == 27
        bits = np.unpackbits(rep.bits, axis=1)
        assert not bits[:, 27:].any()
        bits = bits[:, :27].astype(bool)
    assert mech.sparse == (q < 1 / 16)
    cell_prob = np.zeros(27)
    cell_prob[21], cell_prob[3] = (1 + v0) / 2, (1 - v0) / 2
    want = cell_prob * p + (1 - cell_prob) * q
    z = binomial_z(bits.mean(axis=0), want, n)
    assert np.all(np.abs(z) < Z), z

    def rate(i, c):
        return p if i == c else q

    for a, b in ((21, 3), (0, 26), (21, 0)):
        w = sum(cell_prob[c] * rate(a, c) * rate(b, c) for c in (21, 3))
        got = np.mean(bits[:, a] & bits[:, b])
        assert abs(got - w) < Z * binomial_sigma(w, n), (a, b, got, w)
