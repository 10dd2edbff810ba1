"""The perturbing side's privacy ledger: what each device spent, per
collection and period, in a small SQLite file (stdlib ``sqlite3``). The
rule it applies is the accountant's (``mechanisms/privacy/accountant.py``,
``fits``: exact); this module is its storage, outside the pure core a
client embeds.

The ledger is local state of the perturbing side (a device keeps its own; an
ingest job or ``kvldp publish``, which play many devices, keep one file per
deployment). It is never sent to the collector: it names devices (their
64-bit ids) and when they reported.

A row per (device ``u``, collection ``c``, fingerprint ``fp``)::

    spends(device, collection, fingerprint, at, charge, reported)

``fp`` names *what* was drawn, without revealing it (``mechanisms/privacy/memo.py``'s
``fp_u(S)``): for the longitudinal mode the device's state under the
permanent layer's configuration, so a state reported before -- in any
collection -- is recognised; for fresh perturbation the state under the
configuration *and* the collection and run seed, so only a retry of the same
draw is.

Admission of device ``u`` to collection ``c`` at time ``t`` with period
``P``, period budget ``E`` and per-report cost ``eps`` (``eps_inf`` in the
longitudinal mode, ``epsilon`` for fresh perturbation)::

    charge_u = 0    if a reported row (u, *, fp_u) exists   (the same permanent report again)
               eps  otherwise
    spent_u  = sum of charge over u's reported rows with at > t - P
    u reports  iff  spent_u + charge_u <= E

A device that may not report *sits the collection out*: it sends nothing,
and its row (``reported = 0``, ``charge = 0``) lets the run summary count it.
A row, once written, is the decision for that (device, collection, draw): a
retried batch finds it and decides the same, so a retry never charges twice
and never changes who reported. Over the window, the charges add up to what
a device's reports reveal: ``eps`` per fresh report, ``eps_inf`` per
distinct state in the longitudinal mode (any number of reports of one state
reveal at most ``eps_inf``; ``mechanisms/kv/longitudinal.py``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import sqlite3

import numpy as np

from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.kv.longitudinal import Longitudinal
from kvldp.mechanisms.privacy.accountant import exact, fits_each
from kvldp.mechanisms.privacy.memo import DeviceKeys, config_digest

SCHEMA = """
CREATE TABLE IF NOT EXISTS spends (
    device INTEGER NOT NULL,
    collection TEXT NOT NULL,
    fingerprint INTEGER NOT NULL,
    at REAL NOT NULL,
    charge REAL NOT NULL,
    reported INTEGER NOT NULL,
    PRIMARY KEY (device, collection, fingerprint)
);
CREATE INDEX IF NOT EXISTS spends_by_state ON spends (device, fingerprint);
CREATE INDEX IF NOT EXISTS spends_by_time ON spends (device, at);
"""


def _signed(values: np.ndarray) -> list[int]:
    """uint64 ids and fingerprints as SQLite's signed 64-bit integers."""
    return np.asarray(values, dtype=np.uint64).view(np.int64).tolist()


@dataclasses.dataclass(frozen=True)
class Admission:
    """One batch's decisions: who reports, what each was charged."""

    reports: np.ndarray       # bool per user
    charges: np.ndarray       # eps charged per user (0 for a repeated state or a user sitting out)

    @property
    def sat_out(self) -> int:
        return int((~self.reports).sum())


@dataclasses.dataclass(frozen=True)
class Policy:
    """What a collection may spend: ``cost`` per new draw, at most ``budget``
    per device over any ``period`` seconds (``budget=None``: record, never refuse)."""

    collection: str
    at: float                 # the collection's time, seconds since the epoch
    cost: float
    period: float
    budget: float | None = None

    def __post_init__(self):
        exact(self.cost)
        if self.budget is not None:
            exact(self.budget)
        if not self.period > 0:
            raise ValueError("a ledger policy needs cost >= 0, period > 0 and budget >= 0")


class PrivacyLedger:
    """A connection to one ledger file (created with mode 600)."""

    def __init__(self, path: str, timeout: float = 120.0):
        self.path = os.path.abspath(path)
        if not os.path.exists(self.path):
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            os.close(os.open(self.path, os.O_CREAT | os.O_WRONLY, 0o600))
        # check_same_thread=False: a runner may hand a DoFn (and its gate's connection) to another
        # thread between bundles; one DoFn instance never runs two bundles at once, and every
        # admission is one BEGIN IMMEDIATE transaction, so the connection is never shared concurrently
        self._db = sqlite3.connect(self.path, timeout=timeout, isolation_level=None, check_same_thread=False)
        self._db.executescript(SCHEMA)

    def close(self):
        self._db.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    @contextlib.contextmanager
    def _transaction(self):
        self._db.execute("BEGIN IMMEDIATE")      # one writer at a time: batches decide serially
        try:
            yield self._db
        except BaseException:
            self._db.execute("ROLLBACK")
            raise
        self._db.execute("COMMIT")

    def admit(self, devices: np.ndarray, fingerprints: np.ndarray, policy: Policy) -> Admission:
        """Decide and record one batch of devices (see the module docstring)."""
        n = len(devices)
        if n == 0:
            return Admission(np.zeros(0, bool), np.zeros(0))
        rows = list(zip(range(n), _signed(devices), _signed(fingerprints), strict=True))
        with self._transaction() as db:
            db.execute("CREATE TEMP TABLE IF NOT EXISTS batch (i INTEGER PRIMARY KEY, device INTEGER, fp INTEGER)")
            db.execute("DELETE FROM batch")
            db.executemany("INSERT INTO batch VALUES (?, ?, ?)", rows)
            decided = {i: (reported, charge) for i, reported, charge in db.execute(
                "SELECT b.i, s.reported, s.charge FROM batch b JOIN spends s ON s.device = b.device "
                "AND s.collection = ? AND s.fingerprint = b.fp", (policy.collection,))}
            seen = {i for (i,) in db.execute(
                "SELECT b.i FROM batch b WHERE EXISTS (SELECT 1 FROM spends s WHERE s.device = b.device "
                "AND s.fingerprint = b.fp AND s.reported = 1)")}
            spent = dict(db.execute(
                "SELECT b.i, SUM(s.charge) FROM batch b JOIN spends s ON s.device = b.device "
                "AND s.reported = 1 AND s.at > ? GROUP BY b.i", (policy.at - policy.period,)))
            # a retry finds its recorded decision; every other device is decided at once, by the accountant
            fresh, charge, held = np.ones(n, dtype=bool), np.full(n, float(policy.cost)), np.zeros(n)
            fresh[list(decided)], charge[list(seen)] = False, 0.0
            held[list(spent)] = list(spent.values())
            reports = fresh & fits_each(held, charge, policy.budget)
            charges = np.where(reports, charge, 0.0)
            for i, (reported, paid) in decided.items():
                reports[i], charges[i] = bool(reported), paid
            new = [(device, policy.collection, fp, policy.at, float(charges[i]), int(reports[i]))
                   for i, device, fp in rows if fresh[i]]
            db.executemany("INSERT INTO spends VALUES (?, ?, ?, ?, ?, ?)", new)
        return Admission(reports, charges)

    def spent(self, devices: np.ndarray, at: float, period: float) -> np.ndarray:
        """Each device's charges over the window ``at > at - period`` (later rows included)."""
        out = np.zeros(len(devices))
        index = {d: i for i, d in enumerate(_signed(devices))}
        for device, total in self._db.execute(
                "SELECT device, SUM(charge) FROM spends WHERE reported = 1 AND at > ? GROUP BY device",
                (at - period,)):
            if device in index:
                out[index[device]] = total
        return out

    def collection_summary(self, collection: str) -> dict:
        """Devices that reported or sat out in ``collection``, and the eps charged."""
        reported, sat_out, charged = self._db.execute(
            "SELECT COALESCE(SUM(reported), 0), COALESCE(SUM(1 - reported), 0), COALESCE(SUM(charge), 0) "
            "FROM spends WHERE collection = ?", (collection,)).fetchone()
        return {"reported": int(reported), "sat_out": int(sat_out), "epsilon_charged": float(charged)}


class LedgerGate:
    """The ledger applied to a batch on the perturbing side: who of the
    batch reports in this collection, and what it costs them.

    ``keys``: the run's device keys (fresh perturbation's fingerprints name
    the collection's draw with them); ``policy``: the collection, its time,
    cost, period and budget. The connection opens in the process that
    perturbs (a Beam worker on a local runner) and is never pickled."""

    def __init__(self, path: str, policy: Policy, keys: DeviceKeys, memoised: bool = False):
        self.path, self.policy, self.keys = os.path.abspath(path), policy, keys
        self.memoised = memoised          # fingerprints name states (longitudinal), not draws
        self._ledger = None

    def __getstate__(self):
        return {**self.__dict__, "_ledger": None}

    def __repr__(self) -> str:
        return f"LedgerGate({self.path!r}, {self.policy!r})"

    def fingerprints(self, protocol, users: UserBatch) -> np.ndarray:
        """``fp_u``: the state under the permanent layer (longitudinal), else
        the state under the configuration and the collection (a fresh draw)."""
        if isinstance(protocol, Longitudinal):
            return protocol.state_fingerprints(users)
        cfg = config_digest({**protocol.config(), "collection": self.policy.collection, "draw": "fresh"})
        return self.keys.streams(users, cfg).fingerprints()

    def admit(self, protocol, users: UserBatch) -> tuple[UserBatch, Admission]:
        """The users of the batch who report, and the batch's decisions."""
        if users.user_ids is None:
            raise ValueError("the privacy ledger needs stable user ids to record who spent what")
        if self._ledger is None:
            self._ledger = PrivacyLedger(self.path)
        decision = self._ledger.admit(users.user_ids, self.fingerprints(protocol, users), self.policy)
        return users.subset(decision.reports), decision
