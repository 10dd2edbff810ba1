"""The perturbing side's privacy ledger (kvldp/storage/ledger.py, ``perturb
--ledger --period-budget E --period 30d``): the admission rule, retries,
and the run summary that counts who sat a collection out."""
from __future__ import annotations

import csv
import os
import sqlite3
import stat

import fastavro
import numpy as np
import pytest

from example_data import example_ratings
from kvldp.cli import commands as cli
from kvldp.cli.units import parse_instant_ms
from kvldp.mechanisms.privacy.memo import user_uid
from kvldp.pipelines import run_seed
from kvldp.storage.ledger import Policy, PrivacyLedger

DAY = 86400.0
SEED = 0x5EED0F1ED6E50000000000000000ABCD
RATINGS = example_ratings()


def policy(collection, day, cost=2.0, budget=3.0, period=30 * DAY):
    return Policy(collection, day * DAY, cost, period, budget)


def test_admission_charges_new_draws_and_refuses_over_the_period_budget(tmp_path):
    with PrivacyLedger(str(tmp_path / "l.sqlite")) as ledger:
        devices, fps = np.arange(4, dtype=np.uint64), np.array([10, 11, 12, 13], dtype=np.uint64)
        first = ledger.admit(devices, fps, policy("c1", 0))
        assert first.reports.all() and np.allclose(first.charges, 2.0)
        # a new draw for every device: 2 + 2 > 3 -> all sit out, charged nothing
        second = ledger.admit(devices, fps + 100, policy("c2", 1))
        assert not second.reports.any() and second.sat_out == 4 and np.all(second.charges == 0)
        # the same state again (a memoised report): free, so it may report
        again = ledger.admit(devices, fps, policy("c3", 2))
        assert again.reports.all() and np.all(again.charges == 0)
        # after the period the first charge has left the window
        late = ledger.admit(devices, fps + 200, policy("c4", 31))
        assert late.reports.all()
        assert np.allclose(ledger.spent(devices, 31 * DAY, 30 * DAY), 2.0)
        assert ledger.collection_summary("c2") == {"reported": 0, "sat_out": 4, "epsilon_charged": 0.0}
        assert ledger.collection_summary("c1") == {"reported": 4, "sat_out": 0, "epsilon_charged": 8.0}


def test_a_retried_batch_gets_the_recorded_decision(tmp_path):
    path = str(tmp_path / "l.sqlite")
    devices, fps = np.array([1, 2**64 - 1], dtype=np.uint64), np.array([5, 2**63 + 7], dtype=np.uint64)
    with PrivacyLedger(path) as ledger:
        ledger.admit(devices[:1], fps[:1] + 1, policy("c0", 0, budget=2.0))   # device 1 has spent 2
        first = ledger.admit(devices, fps, policy("c1", 1, budget=2.0))
    assert first.reports.tolist() == [False, True]
    with PrivacyLedger(path) as ledger:                      # a retry, in another process
        retry = ledger.admit(devices, fps, policy("c1", 1, budget=2.0))
        assert retry.reports.tolist() == first.reports.tolist()
        assert np.array_equal(retry.charges, first.charges)
        assert ledger.collection_summary("c1")["epsilon_charged"] == 2.0       # not charged twice
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600


def _perturb(tmp_path, collection: int, day: str, *extra, mechanism=("--mechanism", "pckv-grr", "--epsilon", "2")):
    return cli.main(["perturb", *mechanism, "--input", RATINGS, "--rating-range", "1,5",
                     "--output", str(tmp_path / "out" / f"R{collection}.avro"),
                     "--collection-id", f"{collection:032x}", "--ledger", str(tmp_path / "state" / "ledger.sqlite"),
                     "--period-budget", "3", "--period", "7d", "--collection-time", f"2026-03-{day}T06:00:00",
                     "--overwrite", *extra])


def test_perturb_refuses_a_collection_over_the_period_budget_and_says_how_many_sat_out(tmp_path, capsys,
                                                                                        monkeypatch):
    monkeypatch.setenv(run_seed.SEED_ENV, f"{SEED:032x}")
    assert _perturb(tmp_path, 1, "01") == 0
    assert "2000 users reported, 0 sat it out (period budget 3 over 7 d" in capsys.readouterr().out
    assert _perturb(tmp_path, 2, "02") == 0                  # 2 + 2 > 3: every user sits it out
    out, err = capsys.readouterr()
    assert "0 users reported, 2000 sat it out (period budget 3 over 7 d; they sent nothing)" in out
    assert "WARNING: 2000 users sat collection" in err
    assert "0 reports of" in out                             # nothing was sent for them
    assert _perturb(tmp_path, 2, "02") == 0                  # a rerun of collection 2: the same decisions
    assert "0 users reported, 2000 sat it out" in capsys.readouterr().out
    assert _perturb(tmp_path, 3, "09") == 0                  # 8 days later: the first charge left the window
    assert "2000 users reported, 0 sat it out" in capsys.readouterr().out


def test_longitudinal_collections_charge_only_changed_states(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(run_seed.SEED_ENV, f"{SEED:032x}")
    lon = ("--mechanism", "pckv-ue", "--epsilon", "2", "--longitudinal", "--eps-1", "0.5")
    for c, day in ((1, "01"), (2, "02"), (3, "03")):
        assert _perturb(tmp_path, c, day, mechanism=lon) == 0
        out = capsys.readouterr().out
        charged = "4000" if c == 1 else "0"        # 2000 users x eps_inf 2, then their states repeat
        assert (f"2000 users reported, 0 sat it out (period budget 3 over 7 d; they sent nothing); eps charged "
                f"this collection: {charged} (a state reported before costs 0)") in out
    # the memoised permanent reports repeat, the instantaneous layer does not
    one, two = (tmp_path / "out" / f"R{c}-00000.avro" for c in (1, 2))
    assert one.read_bytes() != two.read_bytes()


def _reports_sent(prefix) -> int:
    """Reports in the files perturb wrote for the collector."""
    total = 0
    for path in prefix.parent.glob(f"{prefix.name}-*.avro"):
        with open(path, "rb") as fh:
            total += sum(int(r["n_reports"]) for r in fastavro.reader(fh))
    return total


def test_only_users_whose_state_changed_sit_out_and_the_period_rolls_over(tmp_path, capsys, monkeypatch):
    """Longitudinal PCKV-UE, eps_inf 2, period budget 3 over 7 days. Day 1:
    everyone reports (2 each). Day 2: 300 users re-rated; a new state would
    cost 2 more (4 > 3), so exactly they sit out and send nothing, while the
    unchanged users report their memoised state for free. Day 9: day 1 has
    left the window, so the changed users report (2) and the others still
    pay nothing."""
    monkeypatch.setenv(run_seed.SEED_ENV, f"{SEED:032x}")
    with open(RATINGS, newline="") as fh:
        rows = list(csv.reader(fh))
    users = sorted({r[0] for r in rows[1:]})
    changed = set(users[:300])
    rerated = tmp_path / "rerated.csv"
    with open(rerated, "w", newline="") as fh:
        csv.writer(fh).writerows([rows[0]] + [[u, item, str(int(r) % 5 + 1) if u in changed else r]
                                              for u, item, r in rows[1:]])
    lon = ("--mechanism", "pckv-ue", "--epsilon", "2", "--longitudinal", "--eps-1", "0.5")
    ledger = tmp_path / "state" / "ledger.sqlite"

    def collection(c, day, ratings):
        assert cli.main(["perturb", *lon, "--input", str(ratings), "--rating-range", "1,5",
                         "--output", str(tmp_path / "out" / f"R{c}.avro"), "--collection-id", f"{c:032x}",
                         "--ledger", str(ledger), "--period-budget", "3", "--period", "7d",
                         "--collection-time", f"2026-03-{day}T06:00:00"]) == 0
        out, err = capsys.readouterr()
        return out, err, _reports_sent(tmp_path / "out" / f"R{c}")

    out, _, sent = collection(1, "01", RATINGS)
    assert "2000 users reported, 0 sat it out" in out and "eps charged this collection: 4000 " in out
    assert sent == 2000
    out, err, sent = collection(2, "02", rerated)
    assert "1700 users reported, 300 sat it out (period budget 3 over 7 d; they sent nothing); eps charged " \
           "this collection: 0 " in out
    assert "WARNING: 300 users sat collection" in err
    assert sent == 1700                                   # the 300 sent nothing
    with sqlite3.connect(ledger) as db:
        sat = {d for (d,) in db.execute("SELECT device FROM spends WHERE collection = ? AND reported = 0",
                                         (f"{2:032x}",))}
    assert sat == set(np.asarray(user_uid(sorted(changed)), dtype=np.uint64).view(np.int64).tolist())
    out, _, sent = collection(3, "09", rerated)           # 8 days after day 1: its charges left the window
    assert "2000 users reported, 0 sat it out" in out and "eps charged this collection: 600 " in out
    assert sent == 2000
    with PrivacyLedger(str(ledger)) as book:
        ids = user_uid(users)
        spent = book.spent(ids, parse_instant_ms("2026-03-09T06:00:00") / 1000, 7 * DAY)
    np.testing.assert_allclose(spent, [2.0 if u in changed else 0.0 for u in users])


@pytest.mark.parametrize("extra, message", [
    (["--period-budget", "3"], "--period-budget needs --ledger"),
    (["--ledger", "L.sqlite"], "name this one with --collection-id"),
    # no persistent seed: a fresh one would make every state look new
    (["--ledger", "L.sqlite", "--collection-id", "0" * 32], "needs a persistent run seed"),
])
def test_ledger_misuse_is_refused(tmp_path, capsys, monkeypatch, extra, message):
    monkeypatch.delenv(run_seed.SEED_ENV, raising=False)
    code = cli.main(["perturb", "--mechanism", "pckv-grr", "--epsilon", "2", "--input", RATINGS, "--rating-range",
                     "1,5", "--output", str(tmp_path / "out" / "R.avro"), *extra])
    assert code == 2 and message in capsys.readouterr().err


def test_perturb_refuses_a_ledger_beside_the_reports(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(run_seed.SEED_ENV, f"{SEED:032x}")
    code = cli.main(["perturb", "--mechanism", "pckv-grr", "--epsilon", "2", "--input", RATINGS, "--rating-range",
                     "1,5", "--output", str(tmp_path / "R.avro"), "--collection-id", "1" * 32,
                     "--ledger", str(tmp_path / "ledger.sqlite")])
    assert code == 2 and "must stay on the perturbing side" in capsys.readouterr().err


def test_a_gate_admits_from_another_thread_than_the_one_that_opened_it(tmp_path):
    """A runner may run a DoFn's next bundle on another thread: the gate's
    connection must follow it (one bundle at a time)."""
    import threading

    from kvldp.mechanisms import registry
    from kvldp.mechanisms.base import UserBatch
    from kvldp.mechanisms.privacy.memo import DeviceKeys
    from kvldp.storage.ledger import LedgerGate

    gate = LedgerGate(str(tmp_path / "l.sqlite"), policy("c1", 0, cost=1.0, budget=1.5), DeviceKeys.from_seed(3))
    mech = registry.make("pckv-grr", 5, 1.0)
    users = UserBatch(np.arange(4), np.array([0, 1, 2]), np.array([1.0, -1.0, 0.5]), 0, np.arange(3))
    first = gate.admit(mech, users)[1]                 # opens the connection on this thread
    later = []
    worker = threading.Thread(target=lambda: later.append(gate.admit(mech, users.subset(np.array([1, 0, 1],
                                                                                             bool)))[1]))
    worker.start()                                      # (this thread lives on: its ident is not reused)
    worker.join()
    assert first.reports.tolist() == [True, True, True]
    assert len(later) == 1 and later[0].reports.tolist() == [True, True]   # the same draw: the recorded decision
