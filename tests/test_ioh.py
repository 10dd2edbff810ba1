"""IOH and the L-way conditional queries (SPEC.md §2; Sun et al. 2019 §V,
Alg. 6, Definitions 2-6, Table III; Sun et al. 2021 §3, 表 1, 算法 1).

Notation: state ``<1,-1> -> 0``, ``<0,0> -> 1``, ``<1,+1> -> 2``; with k
chosen keys the cell of a user is ``I = sum_j 3^(k-1-j) s_j`` (key 0 most
significant); the report is the one-hot of I over 3^k bits perturbed by
unary encoding (p, q): SUE p = e^(eps/2)/(e^(eps/2)+1), q = 1 - p; OUE
p = 1/2, q = 1/(e^eps+1). ``A_s[i] = (C[i] - n q)/(p - q)``.

Statistical checks use fixed seeds; bands are 4.5 s.e. (P(|z| > 4.5) =
7e-6 each: Bonferroni over 27 cells, and over the 216 estimates of the
k = 4 queries a family-wise rate < 0.2%). Expectations and
variances are written out in this file from the papers, never read back
from the code under test.
"""
import functools
import itertools
import math

import numpy as np
import pytest

from kvldp.mechanisms.base import ReportBatch, UserBatch
from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms.ioh import (IOH, MAX_IOH_KEYS, PackedReportBatch, bit_sums, calibrate_cells, cell_variance, pack_positions, packed_width)
from kvldp.mechanisms.cells import index_states, state_index
from kvldp.mechanisms.query import (HELD, NOT_HELD, CellTable, parse_alpha_beta, parse_given, parse_query,
                              pattern_truth, true_conditional)
from kvldp.mechanisms.randomness import batch_rng
from kvldp.mechanisms.registry import make

Z = 4.5


def ue_params(variant, eps):
    """(p, q) of SUE / OUE (Wang et al. 2017), written out."""
    if variant == "sue":
        e = math.exp(eps / 2)
        return e / (e + 1), 1 / (e + 1)
    return 0.5, 1 / (math.exp(eps) + 1)


def users_from_pairs(rows):
    """``rows``: one list of (key, value) per user."""
    sizes = [len(r) for r in rows]
    keys = [k for r in rows for k, _ in r]
    values = [v for r in rows for _, v in r]
    return UserBatch(np.concatenate([[0], np.cumsum(sizes)]), np.array(keys, dtype=np.int64),
                     np.array(values, dtype=np.float64))


def users_from_states(states, keys=None):
    """Deterministic users: state 2 -> value +1, 0 -> -1, 1 -> key not held;
    column j of ``states`` is dictionary key ``keys[j]`` (default j)."""
    states = np.asarray(states)
    keys = np.arange(states.shape[1]) if keys is None else np.asarray(keys)
    held = states != 1
    owner, col = np.nonzero(held)
    return UserBatch(np.concatenate([[0], np.cumsum(held.sum(axis=1))]), keys[col],
                     (states[owner, col] - 1).astype(np.float64))


# =====================================================================
# 1. Test vectors from the papers
# =====================================================================
def test_state_index_test_vector():
    """SPEC / Sun et al. 2019 §V: User1 of Table III, <1,1>,<0,0>,<1,-1>
    -> states 2, 1, 0 -> 210 in base 3 = 2*9 + 1*3 + 0 = 21 (the English
    paper's text says "index 12", a typo: 12 would be 110 in base 3)."""
    assert state_index(np.array([[2, 1, 0]])).tolist() == [21]
    assert index_states(21, 3).tolist() == [2, 1, 0]
    assert index_states(np.array([21, 3, 5, 23]), 3).tolist() == [[2, 1, 0], [0, 1, 0], [0, 1, 2], [2, 1, 2]]
    # key 0 is the most significant digit
    assert state_index(np.array([[1, 0, 0], [0, 0, 1]])).tolist() == [9, 1]


@pytest.mark.parametrize("k", [1, 2, 3, 5])
def test_state_index_round_trip(k):
    cells = np.arange(3 ** k)
    states = index_states(cells, k)
    assert states.shape == (3 ** k, k) and states.min() == 0 and states.max() == 2
    np.testing.assert_array_equal(state_index(states), cells)
    # written out: I = sum_j 3^(k-1-j) s_j
    np.testing.assert_array_equal(sum(3 ** (k - 1 - j) * states[:, j] for j in range(k)), cells)


def selected_cells(table_k, constraints):
    """The set of cell indices ``CellTable.select`` sums: cells are 2^i, so
    the (exact in float64) sum spells the set in binary."""
    table = CellTable.from_vector(2.0 ** np.arange(3 ** table_k))
    total, _ = table.select(constraints)
    total = int(total)
    return {i for i in range(3 ** table_k) if (total >> i) & 1}


def test_condition_to_frequency_index_101():
    """Definition 5 / 2021 §3.2: I(101) = I(1)|I(0)|I(1) = {010, 012, 210,
    212} in base 3 = {3, 5, 21, 23}: keys 0 and 2 held, key 1 not."""
    assert selected_cells(3, {0: HELD, 1: NOT_HELD, 2: HELD}) == {3, 5, 21, 23}
    states = index_states(np.arange(27), 3)
    direct = np.flatnonzero(np.isin(states[:, 0], [0, 2]) & (states[:, 1] == 1) & np.isin(states[:, 2], [0, 2]))
    assert set(direct.tolist()) == {3, 5, 21, 23}


@pytest.mark.parametrize("gamma", list(itertools.product((0, 1), repeat=3)))
def test_condition_to_frequency_index_every_gamma(gamma):
    """|I(gamma)| = 2^(number of 1s), and its cells are exactly the cells
    whose digit j is in {0, 2} where gamma_j = 1 and is 1 where gamma_j = 0."""
    got = selected_cells(3, {j: HELD if g else NOT_HELD for j, g in enumerate(gamma)})
    assert len(got) == 2 ** sum(gamma)
    for i in got:
        assert all((s != 1) == bool(g) for s, g in zip(index_states(i, 3), gamma))


def test_frequency_counting_operator_expands_like_eq_10():
    """Eq. (10): F^alpha_beta = sum over gamma with gamma & alpha = beta of
    F_gamma. The paper's examples: F^101_101 = F_101 + F_111 and
    F^001_000 = F_000 + F_100 + F_010 + F_110 (on a random table)."""
    rng = np.random.default_rng(2)
    table = CellTable.from_vector(rng.uniform(0, 100, 27), rng.uniform(0, 5, 27))
    H, O = HELD, NOT_HELD

    def F(gamma):
        return np.array(table.select({j: H if g == "1" else O for j, g in enumerate(gamma)}))

    np.testing.assert_allclose(table.select({0: H, 2: H}), F("101") + F("111"), rtol=1e-12)
    np.testing.assert_allclose(table.select({2: O}), F("000") + F("100") + F("010") + F("110"), rtol=1e-12)
    np.testing.assert_allclose(table.select({}), [table.cells.sum(), table.variance.sum()], rtol=1e-12)
    with pytest.raises(ValueError):
        table.select({3: H})


# Table 1 of Sun et al. 2021 (= Table III of Sun et al. 2019 with keys
# Hamburger, Fries, Pepsi): keys 癌症 (cancer), 发热 (fever), 咳嗽 (cough).
KEYS = ["癌症", "发热", "咳嗽"]
TABLE_1 = {
    "A": [(1, 1), (0, 0), (1, -1)],
    "B": [(1, -1), (1, 1), (1, 1)],
    "C": [(0, 0), (1, -1), (1, -1)],
}
TABLE_1_STATES = [[2, 1, 0], [0, 2, 2], [1, 0, 0]]          # state = k * v + 1

# (target, given, f, m): derived by hand from the table.
TABLE_1_QUERIES = [
    # 咳嗽 held by A, B, C; of them 发热 held by B (+1) and C (-1): f = 2/3, m = 0
    ("发热", {"咳嗽": 1}, 2 / 3, 0.0),
    # 咳嗽 held and 癌症 not: C only; C's 发热 is -1: f = 1, m = -1 (2021 §3.1's example)
    ("发热", {"咳嗽": 1, "癌症": 0}, 1.0, -1.0),
    # no condition: 癌症 held by A (+1), B (-1): f = 2/3, m = 0
    ("癌症", {}, 2 / 3, 0.0),
    # 咳嗽 held by all: -1, +1, -1: f = 1, m = -1/3
    ("咳嗽", {}, 1.0, -1 / 3),
    # 发热 held by B, C; of them 癌症 held by B (-1): f = 1/2, m = -1
    ("癌症", {"发热": 1}, 0.5, -1.0),
    # 癌症 held by A, B; of them 发热 held by B (+1): f = 1/2, m = +1
    ("发热", {"癌症": 1}, 0.5, 1.0),
    # 发热 not held: A only; A's 癌症 is +1: f = 1, m = +1
    ("癌症", {"发热": 0}, 1.0, 1.0),
    # 发热 not held and 咳嗽 held: A (2019's "ordered Pepsi but not Fries" = User1)
    ("癌症", {"发热": 0, "咳嗽": 1}, 1.0, 1.0),
    # 癌症 and 发热 held: B; B's 咳嗽 is +1
    ("咳嗽", {"癌症": 1, "发热": 1}, 1.0, 1.0),
    # 癌症 not held: C; C's 咳嗽 is -1
    ("咳嗽", {"癌症": 0}, 1.0, -1.0),
    # 癌症 and 咳嗽 held: A, B; 发热 held by B (+1): f = 1/2, m = +1
    ("发热", {"癌症": 1, "咳嗽": 1}, 0.5, 1.0),
    # 发热 held but 咳嗽 not: nobody: the ratios are undefined
    ("癌症", {"发热": 1, "咳嗽": 0}, float("nan"), float("nan")),
]


def table_1_users():
    return users_from_pairs([[(j, float(v)) for j, (k, v) in enumerate(row) if k] for row in TABLE_1.values()])


def test_table_1_states_and_cells():
    """IOH's client digits for the table are state = k * Disc(v) + 1 (values
    are +-1, so Disc is the identity): A -> 210 = 21, B -> 022 = 8,
    C -> 100 = 9."""
    users = table_1_users()
    mech = IOH(3, 1.0, ioh_keys=[0, 1, 2])
    np.testing.assert_array_equal(mech.states(users, np.random.default_rng(0)), TABLE_1_STATES)
    assert state_index(np.array(TABLE_1_STATES)).tolist() == [21, 8, 9]
    table = CellTable.exact(TABLE_1_STATES)
    assert table.cells.shape == (3, 3, 3)
    assert table.cells[2, 1, 0] == table.cells[0, 2, 2] == table.cells[1, 0, 0] == 1 and table.cells.sum() == 3
    # 2019 §V-A: F^101_101 (keys a and c held) = 2 (User1, User2); F^001_001 = 3;
    # f(k_a | k_c = 1) = 2/3.   2021 §3.2: F^011_011 = 2 (B, C), so f(发热|咳嗽=1) = 2/3
    assert table.select({0: HELD, 2: HELD})[0] == 2
    assert table.select({2: HELD})[0] == 3
    assert table.select({1: HELD, 2: HELD})[0] == 2


@pytest.mark.parametrize("target, given, f, m", TABLE_1_QUERIES)
def test_table_1_conditional_values(target, given, f, m):
    """CellTable.exact (the estimator fed exact counts) gives the values
    derived by hand, with zero standard errors; pattern_truth /
    true_conditional (the non-private truth) agree."""
    table = CellTable.exact(TABLE_1_STATES)
    t = KEYS.index(target)
    g = {KEYS.index(k): bool(v) for k, v in given.items()}
    res = table.conditional(t, g)
    tf, tm, inside = true_conditional(pattern_truth(table_1_users(), [0, 1, 2], 3), 3, t, g)
    if math.isnan(f):
        assert math.isnan(res.frequency_raw) and math.isnan(res.mean_raw)
        assert res.frequency == 0 and res.mean == 0 and res.users_in_condition == 0
        assert math.isnan(tf) and inside == 0
        return
    assert res.frequency_raw == pytest.approx(f, abs=1e-12)
    assert res.frequency == pytest.approx(f, abs=1e-12)
    assert res.mean_raw == pytest.approx(m, abs=1e-12)
    assert res.mean == pytest.approx(m, abs=1e-12)
    assert res.frequency_se == 0 and res.mean_se == 0
    assert (tf, tm) == (pytest.approx(f, abs=1e-12), pytest.approx(m, abs=1e-12))
    assert res.users_in_condition == inside


def test_alpha_beta_and_key_forms_agree():
    """2021 Fig. 3: "咳嗽, 癌症 = 1, 0" and "癌症, 咳嗽 = 0, 1" are both
    (alpha, beta) = (101, 001); every (alpha, beta) gives the answer of the
    KEY=v form on the table."""
    want = {0: False, 2: True}
    assert parse_alpha_beta("101", "001") == want
    assert parse_given("咳嗽=1,癌症=0", KEYS) == want
    assert parse_given("癌症=0, 咳嗽=1", KEYS) == want
    assert parse_query("target=发热 given 咳嗽=1,癌症=0", KEYS) == (1, want)
    assert parse_query("发热", KEYS) == (1, {})
    # 2019 Definition 3's example: {Hamburger = 1, Fries = 0} = (110, 100)
    assert parse_alpha_beta("110", "100") == {0: True, 1: False}
    table = CellTable.exact(TABLE_1_STATES)
    for alpha in itertools.product("01", repeat=3):
        for beta in itertools.product("01", repeat=3):
            if any(a == "0" and b == "1" for a, b in zip(alpha, beta)):
                continue
            given = parse_alpha_beta("".join(alpha), "".join(beta))
            text = ",".join(f"{KEYS[j]}={int(h)}" for j, h in given.items())
            assert parse_given(text, KEYS) == given
            for target in set(range(3)) - set(given):
                a = table.conditional(target, given).as_tuple()
                b = table.conditional(*parse_query(f"target={KEYS[target]} given {text}", KEYS)).as_tuple()
                np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("call", [
    lambda: parse_alpha_beta("10", "1"), lambda: parse_alpha_beta("100", "010"),
    lambda: parse_alpha_beta("102", "000"), lambda: parse_given("咳嗽=2", KEYS),
    lambda: parse_given("咳嗽", KEYS), lambda: parse_given("头痛=1", KEYS),
    lambda: parse_query("target=头痛", KEYS), lambda: CellTable.exact(TABLE_1_STATES).conditional(0, {0: True}),
    lambda: CellTable.from_vector(np.zeros(10)),
])
def test_query_parsing_rejects_bad_input(call):
    with pytest.raises(ValueError):
        call()


# =====================================================================
# 2. Client: digits at the right keys
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
        assert abs(rate - p) < Z * math.sqrt(p * (1 - p) / n), (a, b, rate, p)


# =====================================================================
# 3. Privacy: exact audit of the unary encoding over 3^k cells
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
    Rows are ceil(27/8) = 4 bytes; padding bits 0."""
    n = 200_000
    mech = IOH(4, eps, variant, ioh_keys=[0, 1, 3])
    p, q = ue_params(variant, eps)
    users = UserBatch(np.arange(n + 1) * 3, np.tile([0, 2, 3], n), np.tile([v0, 0.9, -1.0], n))
    rep = mech.perturb(users, batch_rng(55, int(10 * eps + 100 * v0) + (variant == "sue")))
    assert isinstance(rep, PackedReportBatch) and rep.bits.shape == (n, 4) and rep.n_cells == 27
    bits = np.unpackbits(rep.bits, axis=1)
    assert not bits[:, 27:].any()
    bits = bits[:, :27].astype(bool)
    cell_prob = np.zeros(27)
    cell_prob[21], cell_prob[3] = (1 + v0) / 2, (1 - v0) / 2
    want = cell_prob * p + (1 - cell_prob) * q
    z = (bits.mean(axis=0) - want) / np.sqrt(want * (1 - want) / n)
    assert np.all(np.abs(z) < Z), z

    def rate(i, c):
        return p if i == c else q

    for a, b in ((21, 3), (0, 26), (21, 0)):
        w = sum(cell_prob[c] * rate(a, c) * rate(b, c) for c in (21, 3))
        got = np.mean(bits[:, a] & bits[:, b])
        assert abs(got - w) < Z * math.sqrt(w * (1 - w) / n), (a, b, got, w)


# =====================================================================
# 4. A_s is unbiased, with the exact variance
# =====================================================================
AS_EPS, AS_R, AS_CHUNK = 2.0, 200, 20


@functools.lru_cache(maxsize=None)
def cell_population(kind):
    """``(users, ioh_keys, d, expected cells E[N_i], Disc variance of N_i)``.

    'det': k = 3, d = 3, deterministic users (values +-1): 0..1499 users per
    cell (4 cells empty), so N_i is known exactly.
    'frac': k = 2 of d = 4 keys (3, 1), values drawn from {-1, -0.5, 0, 0.3,
    1}: Disc is random; E[N_i] = sum over users of prod_j P(s_j), and
    N_i = sum of independent Bernoulli(pi_ui) adds Var = sum pi (1 - pi)."""
    rng = np.random.default_rng(9)
    if kind == "det":
        per_cell = rng.integers(0, 1500, 27)
        per_cell[[0, 7, 13, 26]] = 0
        states = index_states(np.repeat(np.arange(27), per_cell), 3)
        states = states[rng.permutation(len(states))]
        return users_from_states(states), [0, 1, 2], 3, per_cell.astype(np.float64), np.zeros(27)
    n, keys = 15_000, [3, 1]
    held = rng.random((n, 4)) < [0.2, 0.5, 0.6, 0.35]
    vals = rng.choice([-1.0, -0.5, 0.0, 0.3, 1.0], size=(n, 4))
    owner, col = np.nonzero(held)
    users = UserBatch(np.concatenate([[0], np.cumsum(held.sum(axis=1))]), col, vals[owner, col])
    # per user and chosen key: P(state 0), P(state 1), P(state 2)
    P = np.zeros((n, 2, 3))
    for a, key in enumerate(keys):
        h, v = held[:, key], vals[:, key]
        P[:, a, 0] = np.where(h, (1 - v) / 2, 0)
        P[:, a, 1] = np.where(h, 0, 1)
        P[:, a, 2] = np.where(h, (1 + v) / 2, 0)
    pi = (P[:, 0, :, None] * P[:, 1, None, :]).reshape(n, 9)       # cell 3 s_0 + s_1
    return users, keys, 4, pi.sum(axis=0), (pi * (1 - pi)).sum(axis=0)


def cell_repeats(kind, variant, R=AS_R):
    return _cell_repeats(kind, variant, R)


@functools.lru_cache(maxsize=None)
def _cell_repeats(kind, variant, R):
    """A_s over R runs on the same users (perturbed AS_CHUNK runs at a time
    as one tiled batch, accumulated run by run as packed reports)."""
    users, keys, d, EN, disc_var = cell_population(kind)
    mech = IOH(d, AS_EPS, variant, ioh_keys=keys)
    n = users.n_users
    tiled = UserBatch.concat([users] * AS_CHUNK)
    A, V = [], []
    for c in range(R // AS_CHUNK):
        rep = mech.perturb(tiled, batch_rng(6200 + c, 0))
        for r in range(AS_CHUNK):
            counts = mech.accumulate(mech.new_counts(), PackedReportBatch(rep.bits[r * n:(r + 1) * n], mech.n_cells))
            assert counts[0] == n
            a, v = mech.cell_counts(counts)
            A.append(a)
            V.append(v)
    return mech, np.array(A), np.array(V), EN, disc_var, n


AS_CASES = [("det", "oue"), ("det", "sue"), ("frac", "oue"), ("frac", "sue")]


@pytest.mark.parametrize("kind, variant", AS_CASES)
def test_cell_counts_unbiased(kind, variant):
    """E[A_s[i]] = E[N_i]: the average over R = 200 runs is within 4.5 s.e. of
    the expected cell count for every cell, with the exact s.e.
    sqrt(([E N_i p(1-p) + (n - E N_i) q(1-q)]/(p-q)^2 + Var_Disc N_i)/R)
    (the UE part is linear in N_i, so its expectation is the formula at E N_i)."""
    check_cells(kind, variant, AS_R)


@pytest.mark.slow
@pytest.mark.parametrize("kind, variant", AS_CASES)
def test_cell_counts_unbiased_high_power(kind, variant):
    """R = 2000 (~50 s in all): the per-cell s.e. of the average is ~0.5% of
    a 1000-user cell, and the pooled variance band is +-2.7%."""
    check_cells(kind, variant, 2000)


def check_cells(kind, variant, R):
    mech, A, _, EN, disc_var, n = cell_repeats(kind, variant, R)
    p, q = ue_params(variant, AS_EPS)
    var = (EN * p * (1 - p) + (n - EN) * q * (1 - q)) / (p - q) ** 2 + disc_var
    z = (A.mean(axis=0) - EN) / np.sqrt(var / len(A))
    assert np.all(np.abs(z) < Z), z
    # the spread matches too: pooled over cells and runs, mean z^2 = 1 within
    # 4.5 s.e. of a mean of R * 3^k squared normals (relative s.e. sqrt(2/(R 3^k)))
    z2 = ((A - EN) ** 2 / var).mean()
    assert abs(z2 - 1) < Z * math.sqrt(2 / A.size), z2


def test_cell_counts_catch_the_wrong_calibration():
    """The unbiasedness check has power: Eq. (9) of Sun et al. 2019,
    ((e^(eps/2)+1) C - N)/(e^(eps/2)-1), is the SUE calibration (identical
    to A_s for SUE reports), but applied to OUE reports it misses most
    cells by > 10 s.e."""
    users, keys, d, EN, _ = cell_population("det")
    n = users.n_users
    e = math.exp(AS_EPS / 2)
    mech = IOH(d, AS_EPS, "sue", ioh_keys=keys)
    counts = mech.accumulate(mech.new_counts(), mech.perturb(users, batch_rng(77, 0)))
    np.testing.assert_allclose(mech.cell_counts(counts)[0], ((e + 1) * counts[1:] - n) / (e - 1),
                               rtol=1e-12, atol=1e-8)
    _, A, _, EN, _, _ = cell_repeats("det", "oue")
    p, q = ue_params("oue", AS_EPS)
    C = A * (p - q) + n * q                                          # the runs' support counts
    wrong = ((e + 1) * C - n) / (e - 1)
    var = (EN * p * (1 - p) + (n - EN) * q * (1 - q)) / (p - q) ** 2
    z = (wrong.mean(axis=0) - EN) / np.sqrt(var / len(A))
    assert np.mean(np.abs(z) > 10) > 0.9, z


@pytest.mark.parametrize("variant", ["oue", "sue"])
def test_conditional_se_is_the_empirical_sd(variant):
    """The reported s.e. of every conditional query (27 for k = 3) is the
    s.d. of the estimate: over the R = 200 runs on the deterministic
    population (its spread is the perturbation's only), the root-mean-square
    reported s.e. is within +-25% of the empirical s.d. (relative s.e. of a
    sample s.d. from 200 runs: 5%, so 25% is 5 s.e.). This is the check
    that tells the delta method's weights apart: f = X/(X+Z) has
    Var = (Z^2 Var X + X^2 Var Z)/(X+Z)^4, m = (P-N)/(P+N) has
    Var = 4 (N^2 Var P + P^2 Var N)/(P+N)^4, both written out below (the
    swapped weights, X^2 Var X + Z^2 Var Z, give ratios up to 1.5 here)."""
    mech, A, V, EN, _, n = cell_repeats("det", variant)
    queries = all_queries(3)
    est = np.empty((len(A), len(queries), 2))
    se = np.empty_like(est)
    for r in range(len(A)):
        table = CellTable.from_vector(A[r], V[r])
        for i, (t, g) in enumerate(queries):
            res = table.conditional(t, g)
            est[r, i] = res.frequency_raw, res.mean_raw
            se[r, i] = res.frequency_se, res.mean_se
            if r < 3:
                cond = {j: HELD if h else NOT_HELD for j, h in g.items()}
                X, vX = table.select({**cond, t: HELD})
                Zc, vZ = table.select({**cond, t: NOT_HELD})
                P, vP = table.select({**cond, t: (2,)})
                N, vN = table.select({**cond, t: (0,)})
                f_se = math.sqrt(Zc ** 2 * vX + X ** 2 * vZ) / (X + Zc) ** 2
                m_se = 2 * math.sqrt(N ** 2 * vP + P ** 2 * vN) / (P + N) ** 2
                assert (res.frequency_se, res.mean_se) == (pytest.approx(f_se, rel=1e-9), pytest.approx(m_se, rel=1e-9))
    ratio = np.sqrt((se ** 2).mean(axis=0)) / est.std(axis=0, ddof=1)
    assert np.all(np.abs(ratio - 1) < 0.25), ratio


def test_cell_counts_and_plug_in_variance_formulas():
    """cell_counts = (C - n q)/(p - q) and the plug-in variance is the exact
    formula at N_i = A_s clipped into [0, n] (here at a value below 0 and
    one above n)."""
    for variant in ("oue", "sue"):
        mech = IOH(2, 1.5, variant, ioh_keys=[0, 1])
        p, q = ue_params(variant, 1.5)
        C = np.array([0, 5, 50, 200, 400, 399, 120, 60, 1000])
        n = 400
        counts = np.concatenate([[n], C])
        A, V = mech.cell_counts(counts)
        np.testing.assert_allclose(A, (C - n * q) / (p - q), rtol=1e-12)
        Nc = np.clip(A, 0, n)
        assert A.min() < 0 and A.max() > n
        np.testing.assert_allclose(V, (Nc * p * (1 - p) + (n - Nc) * q * (1 - q)) / (p - q) ** 2, rtol=1e-12)
        np.testing.assert_allclose(calibrate_cells(C, n, p, q)[0], A, rtol=1e-15)
        np.testing.assert_allclose(cell_variance(n, Nc, p, q), V, rtol=1e-15)
        np.testing.assert_allclose(mech.cell_variance(n, Nc), V, rtol=1e-15)


# =====================================================================
# 5. Conditional queries converge on correlated data
# =====================================================================
CONV_D, CONV_EPS, CONV_SEED = 5, 4.0, 2
CONV_KEYS = [0, 2, 3]
CONV_SIZES = (50_000, 800_000)
CONV_CASES = [(v, keys) for keys in ((0, 2, 3), (0, 1, 2, 3)) for v in ("oue", "sue")]


def all_queries(k):
    """Every target with every condition on the other keys (held / not)."""
    out = []
    for t in range(k):
        others = [j for j in range(k) if j != t]
        for r in range(k):
            for keys in itertools.combinations(others, r):
                for vals in itertools.product((True, False), repeat=r):
                    out.append((t, dict(zip(keys, vals))))
    return out


@functools.lru_cache(maxsize=None)
def conv_runs(variant, keys):
    """Per size: (CellTable, pattern truth). 'corr' latent-class data (3
    classes; holding and values correlated across keys; d = 5, key
    frequencies 0.31, 0.14, 0.38, 0.20 for keys 0, 1, 2, 3); the 50k users are the first batch of the 800k
    ones; fresh perturbation seeds per size."""
    out = []
    k = len(keys)
    for i, n in enumerate(CONV_SIZES):
        data = SyntheticDataset("corr", n_users=n, d=CONV_D, seed=CONV_SEED)
        mech = IOH(CONV_D, CONV_EPS, variant, ioh_keys=list(keys))
        counts, truth = mech.new_counts(), np.zeros(2 ** k * (1 + k))
        for users in data.batches():
            mech.accumulate(counts, mech.perturb(users, batch_rng(4400 + i, users.batch_id)))
            truth += pattern_truth(users, list(keys), CONV_D)
        assert counts[0] == n and truth[:2 ** k].sum() == n
        out.append((CellTable.from_counts(mech, counts), truth))
    return out


@pytest.mark.parametrize("variant, keys", CONV_CASES)
def test_conditional_estimates_converge(variant, keys):
    """Every query (k targets x every held / not-held condition on the
    other keys: 27 for k = 3, 108 for k = 4) at n = 50k and 800k: every raw
    conditional frequency and mean is within 4.5 reported s.e. of the truth
    (pattern_truth / true_conditional; the mean's target is E[Disc(v)] = v);
    the squared errors summed over the queries shrink. The data really are
    correlated: at 800k some conditional frequency and some conditional mean
    differ from the key's marginal (estimated) by > 10 s.e. And the check
    has power: the joint share F(C, k held)/n -- the conditional frequency
    with the wrong denominator -- misses > 3/4 of the conditioned queries by
    > 10 s.e. (it equals f * F(C)/n, so it is close only where f is small
    and C holds most users)."""
    k = len(keys)
    errs = []
    for table, truth in conv_runs(variant, keys):
        ef, em = 0.0, 0.0
        n = truth[:2 ** k].sum()
        for t, g in all_queries(k):
            res = table.conditional(t, g)
            f, m, inside = true_conditional(truth, k, t, g)
            assert inside > 0.005 * n
            assert abs(res.frequency_raw - f) < Z * res.frequency_se, (t, g, res, f)
            assert abs(res.mean_raw - m) < Z * res.mean_se, (t, g, res, m)
            ef += (res.frequency_raw - f) ** 2
            em += (res.mean_raw - m) ** 2
        errs.append((ef, em))
    assert errs[1][0] < errs[0][0] and errs[1][1] < errs[0][1], errs
    table, truth = conv_runs(variant, keys)[1]
    n = truth[:2 ** k].sum()
    wrong = []
    for t, g in all_queries(k):
        if g:
            X = table.select({**{j: HELD if h else NOT_HELD for j, h in g.items()}, t: HELD})[0]
            res = table.conditional(t, g)
            wrong.append(abs(X / n - true_conditional(truth, k, t, g)[0]) > 10 * res.frequency_se)
    assert np.mean(wrong) > 0.75, np.mean(wrong)
    gap_f, gap_m = [], []
    for t, g in all_queries(k):
        a, b = table.conditional(t, g), table.conditional(t, {})
        gap_f.append(abs(a.frequency_raw - b.frequency_raw) / math.hypot(a.frequency_se, b.frequency_se))
        gap_m.append(abs(a.mean_raw - b.mean_raw) / math.hypot(a.mean_se, b.mean_se))
    assert max(gap_f) > 10 and max(gap_m) > 10, (max(gap_f), max(gap_m))


def se_reliable(table, t, g, scale):
    """A plug-in s.e. is itself an estimate: it moves with the errors of the
    cell sums it is computed from. Predicted relative error of the s.e. at a
    size ``scale`` times smaller: scale * max(sd(X)/X, sd(Z)/Z) for f (X =
    users in the condition holding t, Z = not holding) and
    scale * max(sd(P)/P, sd(N)/N) for m (P, N = holders at +1 / -1),
    computed from the large run. (Measured over 30 seeds it overstates the
    s.e.'s actual relative s.d. by ~2x.)"""
    cond = {j: HELD if h else NOT_HELD for j, h in g.items()}
    X, vX = table.select({**cond, t: HELD})
    Zc, vZ = table.select({**cond, t: NOT_HELD})
    P, vP = table.select({**cond, t: (2,)})
    N, vN = table.select({**cond, t: (0,)})
    return scale * max(math.sqrt(vX) / X, math.sqrt(vZ) / Zc), scale * max(math.sqrt(vP) / P, math.sqrt(vN) / N)


@pytest.mark.parametrize("variant, keys", CONV_CASES)
def test_conditional_standard_errors_shrink_like_root_n(variant, keys):
    """16x the users: the reported s.e. shrink by sqrt(16) = 4 within +-20%,
    on every query whose plug-in s.e. is stable enough at 50k for +-20% to
    be >= 4 of its predicted relative errors (<= 5%; see se_reliable): 25
    and 23 of the 54 s.e. for k = 3, more for k = 4."""
    (small, _), (large, _) = conv_runs(variant, keys)
    checked = 0
    for t, g in all_queries(len(keys)):
        rf, rm = se_reliable(large, t, g, scale=4.0)
        a, b = small.conditional(t, g), large.conditional(t, g)
        for ok, sa, sb in ((rf <= 0.05, a.frequency_se, b.frequency_se), (rm <= 0.05, a.mean_se, b.mean_se)):
            if ok:
                assert abs(sa / sb / 4 - 1) < 0.2, (t, g, sa / sb)
                checked += 1
    assert checked >= 10, checked


def test_ioh_estimate_is_the_marginal_query():
    """IOH.estimate reports each chosen key's unconditional query."""
    data = SyntheticDataset("corr", n_users=20_000, d=CONV_D, seed=CONV_SEED)
    mech = IOH(CONV_D, 2.0, "oue", ioh_keys=CONV_KEYS)
    users = data.batch(0, 0, 20_000)
    counts = mech.accumulate(mech.new_counts(), mech.perturb(users, batch_rng(1, 0)))
    est = mech.estimate(counts)
    table = CellTable.from_counts(mech, counts)
    assert est.d == 3 and est.n_reports == 20_000
    for j in range(3):
        np.testing.assert_array_equal(
            [est.frequency[j], est.mean[j], est.frequency_raw[j], est.mean_raw[j], est.frequency_se[j],
             est.mean_se[j]], table.marginal(j))
        res = table.conditional(j, {})
        P, N, Zc = (max(table.select({j: s})[0], 0.0) for s in ((2,), (0,), (1,)))
        assert res.frequency == pytest.approx(min(max((P + N) / (P + N + Zc), 0), 1), rel=1e-12)
        assert res.mean == pytest.approx((P - N) / (P + N), rel=1e-12)


# =====================================================================
# 6. Plumbing: packing, both report forms, validation
# =====================================================================
@pytest.mark.parametrize("n_cells", [1, 3, 8, 9, 13, 16, 27, 81, 100, 243])
def test_pack_positions_and_bit_sums_round_trip(n_cells):
    """Random sparse rows (some empty, some full) -> packed rows equal to
    np.packbits of the dense rows, width ceil(n_cells/8), zero padding;
    bit_sums equals the bincount of the positions (chunked or not)."""
    rng = np.random.default_rng(n_cells)
    n = 50
    dense = rng.random((n, n_cells)) < rng.uniform(0, 1, (n, 1))
    dense[0] = False
    dense[1] = True
    owner, positions = np.nonzero(dense)
    offsets = np.concatenate([[0], np.cumsum(dense.sum(axis=1))])
    width = packed_width(n_cells)
    assert width == math.ceil(n_cells / 8)
    want = np.packbits(np.pad(dense, ((0, 0), (0, 8 * width - n_cells))), axis=1)
    for chunk in (7, 4096):
        packed = pack_positions(offsets, positions, n_cells, chunk_rows=chunk)
        assert packed.shape == (n, width) and packed.dtype == np.uint8
        np.testing.assert_array_equal(packed, want)
    unpacked = np.unpackbits(packed, axis=1)
    assert not unpacked[:, n_cells:].any()
    for chunk in (3, 8192):
        np.testing.assert_array_equal(bit_sums(packed, n_cells, chunk_rows=chunk),
                                      np.bincount(positions, minlength=n_cells))


@pytest.mark.parametrize("variant", ["oue", "sue"])
def test_accumulate_packed_and_sparse_forms_agree(variant):
    """The client's sparse set positions, sent as a ReportBatch or packed,
    give identical counts; counts merge in any order."""
    mech = IOH(4, 1.0, variant, ioh_keys=[0, 1, 3])
    rng = np.random.default_rng(8)
    cells = rng.integers(0, 27, 3000)
    offsets, positions = mech.oracle.perturb(cells, rng)
    sparse = ReportBatch(offsets, positions, np.ones(len(positions)))
    packed = PackedReportBatch(pack_positions(offsets, positions, 27), 27)
    a = mech.accumulate(mech.new_counts(), sparse)
    b = mech.accumulate(mech.new_counts(), packed)
    np.testing.assert_array_equal(a, b)
    assert a[0] == 3000 and a[1:].sum() == len(positions)
    np.testing.assert_array_equal(a[1:], np.bincount(positions, minlength=27))
    halves = [PackedReportBatch(packed.bits[:1000], 27), PackedReportBatch(packed.bits[1000:], 27)]
    parts = [mech.accumulate(mech.new_counts(), h) for h in halves]
    np.testing.assert_array_equal(mech.merge(parts[::-1]), a)


def test_accumulate_rejects_foreign_reports():
    mech = IOH(3, 1.0)
    assert mech.n_cells == 27 and mech.counts_size == 28 and mech.report_domain == 27
    with pytest.raises(ValueError):
        mech.accumulate(mech.new_counts(), PackedReportBatch(np.zeros((2, 2), np.uint8), 9))
    with pytest.raises(ValueError):
        mech.accumulate(mech.new_counts(), PackedReportBatch(np.zeros((2, 4), np.uint8), 28))
    with pytest.raises(ValueError):
        PackedReportBatch(np.zeros((2, 3), np.uint8), 27)             # 27 cells need 4 bytes
    with pytest.raises(ValueError):
        PackedReportBatch(np.zeros(4, np.uint8), 27)
    for bad in (27, -1):
        with pytest.raises(ValueError):
            mech.accumulate(mech.new_counts(), ReportBatch([0, 1, 2], [3, bad], [1, 1]))
    with pytest.raises(TypeError):
        mech.accumulate(mech.new_counts(), np.zeros((2, 4), np.uint8))
    counts = mech.accumulate(mech.new_counts(), PackedReportBatch(np.zeros((5, 4), np.uint8), 27))
    assert counts[0] == 5 and not counts[1:].any()
    assert PackedReportBatch(np.ones((2, 4)), 27).equals(PackedReportBatch(np.ones((2, 4), np.uint8), 27))


@pytest.mark.parametrize("kwargs", [
    dict(d=5, variant="grr"), dict(d=5, variant="OUE"),
    dict(d=12, ioh_keys=list(range(MAX_IOH_KEYS + 1))), dict(d=5, ioh_keys=[]),
    dict(d=5, ioh_keys=[0, 2, 0]), dict(d=5, ioh_keys=[0, 5]), dict(d=5, ioh_keys=[-1, 2]),
    dict(d=0), dict(d=3, epsilon=0.0),
])
def test_constructor_validation(kwargs):
    kwargs = {"epsilon": 1.0, **kwargs}
    with pytest.raises(ValueError):
        IOH(**kwargs)


def test_constructor_defaults_and_registry():
    assert IOH(2, 1.0).ioh_keys == [0, 1] and IOH(7, 1.0).ioh_keys == [0, 1, 2]
    assert IOH(1, 1.0).n_cells == 3
    assert IOH(12, 1.0, ioh_keys=list(range(MAX_IOH_KEYS))).n_cells == 3 ** MAX_IOH_KEYS
    for variant in ("oue", "sue"):
        mech = make(f"ioh-{variant}", 6, 1.5, ioh_keys=[4, 0])
        assert isinstance(mech, IOH) and mech.variant == variant and mech.name == f"ioh-{variant}"
        assert mech.estimate_keys == [4, 0] and mech.n_cells == 9
        p, q = ue_params(variant, 1.5)
        assert (mech.p, mech.q) == (pytest.approx(p, rel=1e-15), pytest.approx(q, rel=1e-15))


# =====================================================================
# 7. MovieLens-100k
# =====================================================================
def test_movielens_100k_loader():
    import importlib.util

    if importlib.util.find_spec("recbole") is None:
        pytest.skip("MovieLens-100k ships with recbole==1.2.1, which is not installed")
    from kvldp.datasets import load_movielens_100k

    data = load_movielens_100k()
    u = data.users
    assert data.n_users == 943 and data.d == 1682 and len(u.keys) == 100_000
    assert set(np.unique(u.values).tolist()) == {-1.0, -0.5, 0.0, 0.5, 1.0}
    assert u.sizes.min() >= 20                        # every ML-100k user rated >= 20 movies
    assert u.keys.min() == 0 and u.keys.max() == 1681
    flat = u.owners * data.d + u.keys
    assert len(np.unique(flat)) == len(flat)          # distinct keys per user
    ids = [int(k) for k in data.key_names]
    assert ids == sorted(ids) and len(set(ids)) == 1682
