"""The PrivKV family's budget ledgers (PBA, PBAt), validation and the
report format (SPEC.md §1; Ye et al. 2019).
"""
import math

import numpy as np
import pytest

from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms.base import ReportBatch, UserBatch
from kvldp.mechanisms.kv.privkv import (
    PrivKV,
    PrivKVA,
    PrivKVMVirtual,
    lpp_perturb,
)
from kvldp.mechanisms.kv.privkvm import PrivKVM, PrivKVMPlus
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.privacy.accountant import Accountant, BudgetExceeded, Share
from kvldp.mechanisms.privacy.randomness import batch_rng
from privkv_helpers import tabular_users


# =====================================================================
# 1. The budget ledger
# =====================================================================
@pytest.mark.parametrize("eps, c", [(0.1, 1), (1.0, 3), (2.0, 6), (4.0, 7), (7.3, 10)])
def test_privkvm_ledger_sums_to_epsilon(eps, c):
    proto = PrivKVM(5, eps, rounds=c)
    assert math.isclose(proto.ledger.spent(), eps, rel_tol=1e-12)
    assert math.isclose(math.fsum(proto.key_eps) + math.fsum(proto.value_eps), eps, rel_tol=1e-12)
    assert proto.key_eps == [eps / 2] + [0.0] * (c - 1)
    np.testing.assert_allclose(proto.value_eps, eps / (2 * c), rtol=1e-15)


@pytest.mark.parametrize("eps, t, R", [(1.0, 2.0, 10), (4.0, 3.0, 5), (2.0, 1.5, 1), (0.5, 10.0, 20)])
def test_privkvm_plus_ledger_is_pbat(eps, t, R):
    """Round r (from 0) spends eps (1 - 1/t)^r / t, half on keys and half on
    values; over R rounds eps (1 - (1 - 1/t)^R) <= eps."""
    proto = PrivKVMPlus(5, eps, t=t, max_rounds=R)
    assert math.isclose(proto.ledger.spent(), eps * (1 - (1 - 1 / t) ** R), rel_tol=1e-12)
    assert proto.ledger.spent() <= eps
    for r in range(R):
        share = eps * (1 - 1 / t) ** r / t
        assert math.isclose(proto.key_eps[r], share / 2, rel_tol=1e-12)
        assert math.isclose(proto.value_eps[r], share / 2, rel_tol=1e-12)


def test_ledger_rejects_overspending():
    with pytest.raises(BudgetExceeded):
        Accountant.of(1.0, [Share(0, "key", 0.6), Share(0, "value", 0.6)])
    Accountant.of(1.0, [Share(0, "key", 0.5), Share(0, "value", 0.5)])      # exactly the total is fine

    class Greedy(PrivKVM):
        """Every round spends the full value budget eps/2 (c times too much)."""
        def shares(self):
            return [Share(0, "key", self.epsilon / 2)] + [Share(r, "value", self.epsilon / 2)
                                                           for r in range(self.max_rounds)]

    with pytest.raises(BudgetExceeded):
        Greedy(5, 1.0, rounds=3)
    assert Greedy(5, 1.0, rounds=1).ledger.spent() == 1.0     # c = 1 is not over budget


# =====================================================================
# 2. Validation and report format
# =====================================================================
@pytest.mark.parametrize("make", [
    lambda: PrivKVM(5, 1.0, rounds=0), lambda: PrivKVM(5, 1.0, rounds=-1),
    lambda: PrivKVMVirtual(5, 1.0, rounds=0),
    lambda: PrivKVMPlus(5, 1.0, max_rounds=0),
    lambda: PrivKVMPlus(5, 1.0, t=1.0), lambda: PrivKVMPlus(5, 1.0, t=0.5), lambda: PrivKVMPlus(5, 1.0, t=float("nan")),
    lambda: PrivKVMPlus(5, 1.0, a0=-0.01), lambda: PrivKVMPlus(5, 1.0, a0=float("nan")),
    lambda: PrivKV(5, 0.0), lambda: PrivKV(5, -1.0), lambda: PrivKVA(5, 0.0), lambda: PrivKVMVirtual(5, -0.5),
    lambda: PrivKVM(5, 0.0), lambda: PrivKVMPlus(5, -2.0), lambda: PrivKV(5, float("nan")),
    lambda: PrivKV(0, 1.0), lambda: PrivKVM(0, 1.0),
    lambda: PrivKV(5, 1.0, key_share=0.0), lambda: PrivKVA(5, 1.0, key_share=1.0),
])
def test_constructors_reject_bad_parameters(make):
    with pytest.raises(ValueError):
        make()


def test_accumulate_rejects_out_of_range_positions():
    d = 5
    mech, proto = PrivKV(d, 1.0), PrivKVM(d, 1.0, rounds=2)
    for bad in (d, d + 3, -1):
        with pytest.raises(ValueError):
            mech.accumulate(mech.new_counts(), ReportBatch([0, 1, 2], [0, bad], [1, 0]))
        with pytest.raises(ValueError):
            proto.accumulate_round(1, proto.new_round_counts(1), ReportBatch([0, 1, 2], [bad, 1], [-1, 1]))
    counts = mech.accumulate(mech.new_counts(), ReportBatch([0, 1, 2, 3], [0, d - 1, 2], [1, -1, 0]))
    assert counts[0] == 3 and counts[1 + 0] == 1 and counts[1 + d + d - 1] == 1 and counts[1 + 2 * d + 2] == 1
    assert counts.sum() == 6


def test_report_signs_zero_exactly_when_key_bit_is_zero():
    """With p1 = 1 the key bit is the holding bit, with p1 = 0 its negation;
    with p2 = 1 and +-1 values the value bit is the value. So a report's sign
    is 0 exactly for the users whose key bit is 0 and otherwise the (fake)
    value -- every report is one (j, s) with s in {-1, 0, +1}."""
    n, d = 20_000, 4
    users = tabular_users(n, [0.2, 0.5, 0.0, 0.9], [1.0, -1.0, 0.0, 1.0], 0.0, seed=5)
    users = UserBatch(users.offsets, users.keys, np.where(users.keys == 1, -1.0, 1.0))
    flat = set(zip(users.owners.tolist(), users.keys.tolist(), strict=True))
    fake = np.array([-1.0, 1.0, -1.0, 1.0])
    for p1 in (1.0, 0.0):
        rep = lpp_perturb(users, d, p1, 1.0, fake, batch_rng(5, int(p1)))
        np.testing.assert_array_equal(rep.offsets, np.arange(n + 1))
        assert rep.symbols.dtype == np.int8 and set(np.unique(rep.symbols)) <= {-1, 0, 1}
        held = np.array([(i, int(j)) in flat for i, j in enumerate(rep.positions)])
        key_bit = held if p1 == 1.0 else ~held
        np.testing.assert_array_equal(rep.symbols == 0, ~key_bit)
        value = np.where(held, np.where(rep.positions == 1, -1, 1), fake[rep.positions])
        np.testing.assert_array_equal(rep.symbols[key_bit], value[key_bit])
        assert held.any() and (~held).any()
    # general parameters: signs in {-1, 0, +1}, one report per user, j in [0, d)
    rep = PrivKV(d, 1.0).perturb(users, batch_rng(6, 0))
    assert set(np.unique(rep.symbols)) == {-1, 0, 1}
    assert rep.positions.min() >= 0 and rep.positions.max() < d and rep.n_reports == n


def test_protocol_rejects_mismatched_dataset():
    data = SyntheticDataset("uu", n_users=100, d=4, seed=0)
    with pytest.raises(ValueError):
        run_local(PrivKVM(5, 1.0), data, seed=1)
