"""The privacy accountant (issue 41): typed budgets in exact arithmetic, every
budget check in one place.

The tolerances it replaces (``TOLERANCE = 1e-9``, absolute, in two ledgers)
let a budget below ~1e-9 be over-spent many times over; the exact reading
refuses that and still accepts splits whose floats do not add up exactly.
"""
from __future__ import annotations

import itertools
from fractions import Fraction

import numpy as np
import pytest

from kvldp.mechanisms import registry
from kvldp.mechanisms.kv.longitudinal import longitudinal
from kvldp.mechanisms.privacy.accountant import (
    Accountant,
    BudgetExceeded,
    LongitudinalBudget,
    Share,
    check_split,
    exact,
    fits,
    fits_each,
    fits_window,
)
from kvldp.mechanisms.privacy.ledger import SimulatedLedger
from kvldp.storage.ledger import Policy, PrivacyLedger


def test_floats_are_read_as_the_fractions_they_were_written_as():
    assert exact(0.1) == Fraction(1, 10)
    assert exact(4 / 3) == Fraction(4, 3)
    assert exact(2.0 / 3.0) + exact(1.0 / 3.0) == 1
    with pytest.raises(ValueError):
        exact(float("nan"))
    with pytest.raises(ValueError):
        exact(-0.5)


@pytest.mark.parametrize("total, parts", [(1.0, 3), (4.0, 3), (0.7, 7), (2.5, 6)])
def test_an_even_split_spends_the_total_exactly(total, parts):
    acc = Accountant.of(total, [Share(r, "pair", total / parts) for r in range(parts)])
    assert acc.spent() == total


def test_ten_tenths_fit_a_budget_of_one_and_an_eleventh_does_not():
    assert sum([0.1] * 10) != 1.0                      # the floats alone would not say so
    assert fits(sum([0.1] * 10) - 0.1, 0.1, 1.0)
    assert not fits(sum([0.1] * 10), 0.1, 1.0)


def test_a_tiny_budget_cannot_be_overspent():
    """Before: ``spent > total * (1 + 1e-9) + 1e-9`` let a budget of 1e-10
    be spent five times over (and the device ledger's ``<= budget + 1e-9``)."""
    with pytest.raises(BudgetExceeded):
        Accountant.of(1e-10, [Share(0, "pair", 5e-10)])
    assert not fits(0.0, 5e-10, 1e-10)
    with pytest.raises(BudgetExceeded):
        Accountant.of(1.0, [Share(0, "key", 0.6), Share(0, "value", 0.4 + 1e-6)])


def test_groups_are_accounted_apart():
    acc = Accountant.of(1.0, [Share(0, "pair", 1.0, "group1"), Share(1, "pair", 1.0, "group2")])
    assert acc.spent() == 1.0 and acc.spent(group="group1") == 1.0 and acc.groups == ["group1", "group2"]


def test_the_longitudinal_pair_is_one_typed_budget():
    pair = LongitudinalBudget(2.0, 0.5)
    assert pair.eps_1 == 0.5 and not pair.memoised_only
    assert LongitudinalBudget(2.0).memoised_only
    with pytest.raises(ValueError, match="exceeds eps_inf"):
        LongitudinalBudget(2.0, 2.0000001)
    with pytest.raises(ValueError, match="> 0"):
        LongitudinalBudget(2.0, 0.0)
    mech = longitudinal(registry.make("pckv-ue", 10, 2.0), 0.5)
    assert mech.ledger.longitudinal == LongitudinalBudget(2.0, 0.5)
    assert mech.ledger.spent() == 2.0 and "eps_1" in mech.ledger.describe()
    with pytest.raises(ValueError, match="not the total"):
        Accountant.of(1.0, [Share(0, "permanent", 1.0)], LongitudinalBudget(2.0))


def test_a_split_of_users_adds_up_to_one_exactly():
    check_split([0.4, 0.1, 0.5])
    check_split([0.7, 0.2, 0.1])                       # 0.7 + 0.2 + 0.1 = 0.9999999999999999 in floats
    with pytest.raises(ValueError, match="add up to 1"):
        check_split([0.5, 0.5000001])
    with pytest.raises(ValueError, match="add up to 1"):
        registry.make("ks-adap", 10, 1.0, group_shares=(0.4, 0.1, 0.6))


def test_a_window_of_many_devices_is_checked_exactly():
    """``fits_window`` (integer units) agrees with ``fits`` on fractions, device by device."""
    rng = np.random.default_rng(3)
    costs = [0.1, 0.2, 1 / 3, 0.3]
    window = [(c, rng.random(50) < 0.6) for c in costs]
    charge = rng.choice([0.0, 0.1, 1 / 3], size=50)
    for budget in (0.5, 0.6, 2 / 3 + 0.1, 1.0, None):
        got = fits_window(window, charge, budget)
        spent = [sum((exact(c) for c, m in window if m[i]), Fraction(0)) for i in range(50)]
        want = [fits(s, x, budget) for s, x in zip(spent, charge, strict=True)]
        assert got.tolist() == want, budget
        floats = np.array([float(s) for s in spent])
        assert fits_each(floats, charge, budget).tolist() == want, budget


def test_the_simulated_and_the_stored_ledger_decide_alike(tmp_path):
    """Ten collections at cost 0.1 under a budget of 1 over any 20: every
    device reports in all ten (the floats' sum is 0.9999999999999999 + 0.1),
    the eleventh is refused, in memory and in the SQLite ledger alike."""
    n, ids = 5, np.arange(5, dtype=np.uint64)
    sim = SimulatedLedger(n, period=20, budget=1.0)
    with PrivacyLedger(str(tmp_path / "l.sqlite")) as book:
        for t in range(11):
            ok = sim.admit(t, 0.1)
            stored = book.admit(ids, ids * 1000 + t, Policy(f"c{t}", float(t), 0.1, 20.0, 1.0)).reports
            assert ok.tolist() == stored.tolist() == [t < 10] * n, t


@pytest.mark.parametrize("name", ["privkv", "privkvm", "ks-grr", "ks-adap", "pckv-ue", "f2m"])
def test_every_protocol_spends_at_most_its_total_exactly(name):
    proto = registry.make(name, 12, 1.3)
    for group, rounds in itertools.product(proto.ledger.groups, [None]):
        assert exact(proto.ledger.spent(rounds, group)) <= exact(1.3)
