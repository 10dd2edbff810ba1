"""PrivKVM+: the F >= 0 stopping rule and the budget it spends (PBAt)
(SPEC.md §1; Ye et al. 2019; bands in privkv_helpers.py).
"""
import functools

import numpy as np
import pytest

from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms.kv.privkvm import PrivKVMPlus
from kvldp.mechanisms.local import run_local

# =====================================================================
# 1. PrivKVM+: the F >= 0 stopping rule and the budget it spends
# =====================================================================
P_D, P_N, P_EPS, P_T, P_MAX = 10, 200_000, 4.0, 2.0, 6


@functools.cache
def plus_run(a0, seed=77):
    data = SyntheticDataset("uu", n_users=P_N, d=P_D, seed=2)
    proto = PrivKVMPlus(P_D, P_EPS, t=P_T, a0=a0, max_rounds=P_MAX)
    return proto, run_local(proto, data, seed=seed)


def distances(result):
    """mean_k |m^(r) - m~^(r)| per executed round, m~^(1) = 1, m~^(r) = m^(r-1)."""
    out, prev = [], np.ones(P_D)
    for st in result.states:
        out.append(float(np.mean(np.abs(st.estimates.mean - prev))))
        prev = st.broadcast
    return out


def check_stop_rule(proto, res, a0, expected_stop):
    """Rounds 1..stop: F < 0 before the stop, F >= 0 (or max_rounds) at it;
    after the stop nothing is reported and nothing is spent."""
    stop = next(i for i, st in enumerate(res.states) if st.stopped)
    assert stop == expected_stop, (stop, expected_stop)
    prev = np.ones(P_D)
    for r in range(stop + 1):
        st = res.states[r]
        assert st.rounds_done == r + 1
        np.testing.assert_array_equal(st.broadcast, st.estimates.mean)
        F = a0 - float(np.mean(np.abs(st.estimates.mean - prev)))
        if r < stop:
            assert F < 0 and not st.stopped, (r, F)
        else:
            assert F >= 0 or r == P_MAX - 1, (r, F)
        # PBAt: after r + 1 rounds eps (1 - (1 - 1/t)^(r+1)) is spent
        spent = P_EPS * (1 - (1 - 1 / P_T) ** (r + 1))
        assert st.epsilon_spent == pytest.approx(spent, rel=1e-12)
        assert st.epsilon_spent == pytest.approx(proto.ledger.spent(rounds=range(r + 1)), rel=1e-15)
        prev = st.broadcast
    final = res.state
    assert final.stopped and final.rounds_done == stop + 1
    assert final.epsilon_spent < P_EPS
    for r in range(stop + 1, P_MAX):
        assert res.states[r] is res.states[stop]
        assert not np.any(res.round_counts[r]), r
    for r in range(stop + 1):
        assert res.round_counts[r][0] == P_N
    # output: round 1's frequency, the stopping round's mean
    np.testing.assert_array_equal(res.estimates.frequency, res.states[0].estimates.frequency)
    np.testing.assert_array_equal(res.estimates.mean, res.states[stop].estimates.mean)


def test_privkvm_plus_a0_zero_runs_max_rounds():
    proto, res = plus_run(0.0)
    check_stop_rule(proto, res, 0.0, P_MAX - 1)


def test_privkvm_plus_huge_a0_stops_after_one_round():
    proto, res = plus_run(10.0)
    check_stop_rule(proto, res, 10.0, 0)
    assert res.state.epsilon_spent == pytest.approx(P_EPS / P_T, rel=1e-12)


def test_privkvm_plus_intermediate_a0_stops_where_the_rule_says():
    """Same seed => the rounds before the stop are identical whatever A0 is,
    so the distances D_r of the A0 = 0 run predict where A0 > 0 stops: at
    the first r with D_r <= A0. Two A0 chosen from the data: halfway between
    D_1 and min(D_2..), and A0 = D_2 exactly (F = 0 at round 2: the rule is
    F >= 0, so it must stop there)."""
    _, base = plus_run(0.0)
    D = distances(base)
    assert min(D[1:]) < D[0], D            # precondition for a stop at round >= 2
    for a0 in ((D[0] + min(D[1:])) / 2, D[1]):
        expected = next((r for r, x in enumerate(D) if x <= a0), P_MAX - 1)
        assert expected >= 1
        proto, res = plus_run(a0)
        check_stop_rule(proto, res, a0, expected)
        for r in range(expected + 1):
            np.testing.assert_array_equal(res.round_counts[r], base.round_counts[r])
    # just below D_2 it does not stop at round 2
    a0 = float(np.nextafter(D[1], -np.inf))
    proto, res = plus_run(a0)
    check_stop_rule(proto, res, a0, next((r for r, x in enumerate(D) if x <= a0), P_MAX - 1))
    assert not res.states[1].stopped
