"""IOH's cell index and the L-way conditional queries on the papers' test
vectors: state index, Definition 5's condition-to-cells map, Eq. (10), Table 1
of Sun et al. 2021 (= Table III of 2019) and the query syntax
(SPEC.md §2; Sun et al. 2019 §V; Sun et al. 2021 §3; notation and bands
in ioh_helpers.py).
"""
import itertools
import math

import numpy as np
import pytest

from kvldp.mechanisms.kv.cells import index_states, state_index
from kvldp.mechanisms.kv.ioh import IOH
from kvldp.mechanisms.kv.query import (
    HELD,
    NOT_HELD,
    CellTable,
    parse_alpha_beta,
    parse_given,
    parse_query,
    pattern_truth,
    true_conditional,
)
from user_batches import users_from_pairs


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
        assert all((s != 1) == bool(g) for s, g in zip(index_states(i, 3), gamma, strict=True))


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
            if any(a == "0" and b == "1" for a, b in zip(alpha, beta, strict=True)):
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
