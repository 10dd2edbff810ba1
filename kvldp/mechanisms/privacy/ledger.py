"""The per-device privacy ledger's rule for a simulation, vectorised in
memory (``kvldp evaluate --collections``): the same admission as the
perturbing side's SQLite ledger (``kvldp.storage.ledger``), each device's
window checked by the accountant (``accountant.fits_window``, exact)."""
from __future__ import annotations

import numpy as np

from kvldp.mechanisms.privacy.accountant import fits_window


class SimulatedLedger:
    """``PrivacyLedger``'s rule for a simulation of ``n`` devices (ids
    ``0 … n-1``) over collections ``0, 1, …`` one period unit apart,
    vectorised in memory (``kvldp evaluate --collections``).

    ``period``: the window in collections (a collection ``s`` counts at
    ``t`` iff ``s > t - period``); ``budget``: ``None`` records only."""

    def __init__(self, n: int, period: int | None = None, budget: float | None = None):
        self.n, self.period, self.budget = n, period, budget
        self._charges: list[tuple[float, np.ndarray]] = []   # per collection: its cost, who was charged it
        self._seen = np.zeros(0, dtype=np.uint64)      # sorted keys of (device, state) reported

    def _keys(self, fingerprints: np.ndarray) -> np.ndarray:
        with np.errstate(over="ignore"):
            return np.asarray(fingerprints, dtype=np.uint64) ^ (np.arange(self.n, dtype=np.uint64)
                                                               * np.uint64(0x9E3779B97F4A7C15))

    def admit(self, t: int, cost: float, fingerprints: np.ndarray | None = None) -> np.ndarray:
        """Who reports in collection ``t`` (a bool per device). ``fingerprints``:
        the devices' memoised states (``None``: a fresh draw, always charged)."""
        if t != len(self._charges):
            raise ValueError(f"collections are admitted in order: expected {len(self._charges)}, got {t}")
        if fingerprints is None:
            keys, repeat = None, np.zeros(self.n, dtype=bool)
        else:
            keys = self._keys(fingerprints)
            at = np.searchsorted(self._seen, keys)
            repeat = (at < len(self._seen)) & (self._seen[np.minimum(at, max(len(self._seen) - 1, 0))] == keys) \
                if len(self._seen) else np.zeros(self.n, dtype=bool)
        charge = np.where(repeat, 0.0, cost)
        first = 0 if self.period is None else max(0, t - self.period + 1)
        ok = fits_window(self._charges[first:], charge, self.budget)
        self._charges.append((cost, ok & ~repeat))
        if keys is not None:
            self._seen = np.union1d(self._seen, keys[ok])
        return ok

    def cumulative(self) -> np.ndarray:
        """Each device's charges over every collection so far."""
        if not self._charges:
            return np.zeros(self.n)
        return np.sum([np.where(charged, cost, 0.0) for cost, charged in self._charges], axis=0)
