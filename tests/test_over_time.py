"""``kvldp evaluate --collections T`` (pipelines/over_time.py) and the
simulator's ledger (``ledger.SimulatedLedger``)."""
from __future__ import annotations

import csv

import numpy as np
import pytest

from kvldp.cli import commands as cli
from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms.privacy.ledger import SimulatedLedger
from kvldp.pipelines.over_time import Churn, materialise
from kvldp.storage.ledger import Policy, PrivacyLedger


@pytest.mark.parametrize("budget, period", [(None, None), (5.0, 3), (2.0, 2)])
def test_simulated_ledger_decides_as_the_sqlite_ledger(tmp_path, budget, period):
    """Random states (few, so devices return to earlier ones), fresh draws
    and memoised reports, over 12 collections a day apart."""
    rng = np.random.default_rng(4)
    n, day = 300, 86400.0
    sim = SimulatedLedger(n, period, budget)
    with PrivacyLedger(str(tmp_path / "l.sqlite")) as real:
        for t in range(12):
            fresh = t % 4 == 3
            states = rng.integers(0, 3, size=n).astype(np.uint64) * np.uint64(7919) + np.arange(n, dtype=np.uint64)
            cost = 1.0 if fresh else 2.0
            ok = sim.admit(t, cost, None if fresh else states)
            fps = (np.uint64(1) << np.uint64(40)) + np.uint64(t) if fresh else states      # a fresh draw: new fp
            decision = real.admit(np.arange(n, dtype=np.uint64), np.full(n, fps) if fresh else fps,
                                  Policy(f"c{t}", t * day, cost, (period or 10_000) * day, budget))
            assert np.array_equal(ok, decision.reports), t
        totals = real.spent(np.arange(n, dtype=np.uint64), 11 * day, 1e9)
    np.testing.assert_allclose(sim.cumulative(), totals)
    if budget is not None:
        assert not ok.all() or budget >= 5        # the budget binds somewhere


def test_churn_changes_the_expected_share_and_keeps_devices():
    base = materialise(SyntheticDataset("uu", n_users=40_000, d=100, seed=1), 10_000)
    churn = Churn(base, 0.1, seed=9)
    assert churn.step(0) == 0.0 and churn.users().keys.tolist() == base.keys.tolist()
    changed = [churn.step(t) for t in range(1, 6)]
    # a donor holds the same (key, value) state w.p. about 1/d
    expected = 0.1 * (1 - 1 / 100)
    assert all(abs(c - expected) < 4 * np.sqrt(expected / 40_000) for c in changed), changed
    users = churn.users()
    assert np.array_equal(users.user_ids, np.arange(40_000)) and users.n_users == 40_000


def _rows(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def test_evaluate_collections_scores_every_collection_and_charges_the_ledger(tmp_path, capsys):
    out = tmp_path / "ot"
    argv = ["evaluate", "--collections", "4", "--churn", "0.2", "--mechanisms", "pckv-ue,kvue", "--epsilons", "2",
            "--eps-1", "0.5", "--users", "6000", "--keys", "20", "--out", str(out), "--seed", "5",
            "--parallel", "1", "--repeats", "1"]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    assert "| pckv-ue | 2 | two-layer |" in text and (out / "over_time.png").stat().st_size > 10_000
    rows = _rows(out / "results.csv")
    loss = {(r["mechanism"], r["mode"], int(r["collection"])): float(r["value"])
            for r in rows if r["metric"] == "loss_mean"}
    for mech in ("pckv-ue", "kvue"):
        for t in range(1, 5):
            assert loss[(mech, "fresh", t)] == pytest.approx(2.0 * t)              # eps per collection
            assert loss[(mech, "fresh-eps1", t)] == pytest.approx(0.5 * t)
            # eps_inf per distinct state: 2 at first, then 2 more for each user whose state changed
            assert loss[(mech, "memoised", t)] == loss[(mech, "two-layer", t)]
        assert loss[(mech, "memoised", 1)] == pytest.approx(2.0)
        growth = np.diff([loss[(mech, "memoised", t)] for t in range(1, 5)])
        assert np.all(growth > 0) and np.all(growth < 2.0 * 0.2 * 1.3)
    mse = [r for r in rows if r["metric"] == "mse_frequency" and r["key_set"] == "all"]
    assert len(mse) == 2 * 4 * 4
    # the derived variance comes with every longitudinal row (and with fresh PCKV-UE's Theorem 4)
    assert all(float(r["theory"]) > 0 for r in mse if r["mode"] in ("memoised", "two-layer")
               or r["mechanism"] == "pckv-ue")
    # raw rows beside the clipped ones: PCKV's clipping of f into [1/n, 1] (which holds every true f here)
    # is a projection, so it never adds error (KVUE's clips state counts, which can); and the raw
    # estimate's MSE is its derived variance (fresh modes: 20 keys x 4 independent collections per cell,
    # MSE/Var ~ chi2_80/80, s.d. 0.16; 4 s.d.)
    raw = {(r["mechanism"], r["mode"], r["collection"]): r for r in rows
           if r["metric"] == "mse_frequency_raw" and r["key_set"] == "all"}
    assert len(raw) == len(mse)
    for r in mse:
        if r["mechanism"] == "pckv-ue":
            assert float(r["value"]) <= float(raw[(r["mechanism"], r["mode"], r["collection"])]["value"]) + 1e-15
    for mech, mode in (("pckv-ue", "fresh"), ("pckv-ue", "fresh-eps1")):
        cell = [r for k, r in raw.items() if k[:2] == (mech, mode)]
        ratio = sum(float(r["value"]) for r in cell) / sum(float(r["theory"]) for r in cell)
        assert abs(ratio - 1) < 4 * np.sqrt(2 / 80), (mech, mode, ratio)
    assert "raw MSE f / derived variance" in text
    assert cli.main(argv) == 0                                   # a rerun resumes: nothing left to run
    assert "8 cells done, 0 to run" in capsys.readouterr().out


def test_collections_need_eps_1_for_the_two_layer_mode(tmp_path, capsys):
    code = cli.main(["evaluate", "--collections", "2", "--mechanisms", "pckv-ue", "--epsilons", "2",
                     "--out", str(tmp_path / "x"), "--users", "100"])
    assert code == 2 and "need --eps-1" in capsys.readouterr().err
