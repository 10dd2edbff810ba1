"""What one malicious device can do to an estimate (issue 42), measured.

LDP's poisoning bound: a device controls only its own report, so it moves a
key's count by at most what one report adds to it, and the calibrated
frequency by that times the calibration's slope. For PCKV a report adds at
most 1 to ``n1_k + n2_k``, so one device moves ``f_k`` (raw) by at most

    Delta_f = l / (n (a - b))

-- no more than an honest user whose randomised report happened to be the
extreme one, and ``1/(a - b)`` (about ``(e^eps + 1)/(e^eps - 1)``) times what
a device moves a non-private count by: the amplification Cheu, Smith and
Ullman (2021) show every LDP protocol has. What the collector enforces is
that a report is one a client can send: a crafted report listing key ``k``
10,000 times (before: accepted, ``f_k`` moved by 10,000 Delta_f) is refused,
as are signs and positions outside the domain. What it cannot enforce is
who sends: every report counts as one user, so m devices (or one publisher
inventing m users) move ``f_k`` by m Delta_f; authenticate the sources.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.base import ReportBatch
from kvldp.mechanisms.protocol import Collection

D, EPS, N = 8, 2.0, 2_000


def _honest(name: str):
    mech = registry.make(name, D, EPS)
    users = next(iter(SyntheticDataset("uu", n_users=N, d=D, seed=4).batches(N)))
    return mech, mech.perturb(users, np.random.default_rng(4))


def _with_first(reports: ReportBatch, positions, symbols) -> ReportBatch:
    """``reports`` with report 0 replaced by the entries given."""
    first = reports.offsets[1]
    return ReportBatch(np.concatenate([[0], reports.offsets[1:] - first + len(positions)]),
                       np.concatenate([positions, reports.positions[first:]]).astype(np.int32),
                       np.concatenate([symbols, reports.symbols[first:]]).astype(np.int8))


def _raw_frequency(mech, reports) -> np.ndarray:
    mech.check_reports(0, reports)
    return mech.estimate(mech.accumulate(mech.new_counts(), reports)).frequency_raw


def _extreme_reports(mech):
    """Every report a device may send that moves counts most: one entry per
    key and sign; for the UE kind also every position at once, with either sign, and none."""
    dp = mech.params.d_prime
    out = [([k], [s]) for k in range(dp) for s in (1, -1)]
    if mech.name.endswith("ue"):
        out += [(list(range(dp)), [1] * dp), (list(range(dp)), [-1] * dp), ([], [])]
    return out


@pytest.mark.parametrize("name", ["pckv-grr", "pckv-ue"])
def test_one_device_moves_a_frequency_by_at_most_its_bound_and_reaches_it(name):
    mech, reports = _honest(name)
    bound = mech.l / (N * (mech.params.a - mech.params.b))
    base = _raw_frequency(mech, _with_first(reports, [], []) if name.endswith("ue") else reports)
    shifts = np.array([np.abs(_raw_frequency(mech, _with_first(reports, p, s)) - base)
                       for p, s in _extreme_reports(mech)])
    worst = shifts.max()
    if name.endswith("ue"):
        # from the empty report, an entry at k adds exactly one report's worth: the bound is reached
        assert np.isclose(worst, bound, rtol=1e-9), (worst, bound)
    else:
        # GRR: an entry moves from the honest key to another: at most the bound on each of the two keys
        assert worst <= bound * (1 + 1e-9) and worst > 0.99 * bound, (worst, bound)
    assert np.all(shifts <= bound * (1 + 1e-9)), shifts.max() / bound


@pytest.mark.parametrize("name", ["pckv-grr", "pckv-ue", "ks-ue", "privkv", "kvue", "f2m", "privkvm"])
def test_a_report_listing_a_key_many_times_is_refused(name):
    """Before: accepted; one device added 10,000 to key 3's count."""
    mech = registry.make(name, D, EPS)
    users = next(iter(SyntheticDataset("uu", n_users=50, d=D, seed=4).batches(50)))
    state = mech.initial_state(Collection.from_seed(1))
    reports = mech.perturb_round(0, users, np.random.default_rng(4), state)
    crafted = _with_first(reports, [3] * 10_000, [1] * 10_000)
    with pytest.raises(ValueError, match="lists a position twice"):
        mech.check_reports(0, crafted)
    disordered = _with_first(reports, [5, 3], [1, 1])
    with pytest.raises(ValueError, match="out of order"):
        mech.check_reports(0, disordered)
    mech.check_reports(0, reports)            # the honest batch passes


def test_offsets_that_go_backwards_are_refused():
    mech, reports = _honest("pckv-ue")
    offsets = reports.offsets.copy()
    offsets[1], offsets[2] = offsets[2], offsets[1]
    with pytest.raises(ValueError, match="never decrease"):
        mech.check_reports(0, dataclasses.replace(reports, offsets=offsets))
