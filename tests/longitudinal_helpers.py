"""Shared pieces of the longitudinal tests: devices holding one state, report
indices in ``output_probabilities``' enumeration, the variance sweep."""
from __future__ import annotations

import dataclasses

import numpy as np

from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.kv.longitudinal import longitudinal
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.privacy.memo import DeviceKeys


def same_state_devices(pairs, n: int, first_id: int = 0, batch_id: int = 0) -> UserBatch:
    """``n`` devices (ids ``first_id …``) all holding ``pairs``."""
    keys = np.array([k for k, _ in pairs] * n, dtype=np.int64)
    values = np.array([v for _, v in pairs] * n, dtype=np.float64)
    return UserBatch(np.arange(n + 1) * len(pairs), keys, values, batch_id, first_id + np.arange(n))


def report_index(mech, reports) -> np.ndarray:
    """Each report's index in the mechanism's ``output_probabilities``."""
    if mech.name == "pckv-grr":
        return 2 * reports.positions.astype(np.int64) + (reports.symbols > 0)
    if mech.name == "kvue":
        return 3 * reports.positions.astype(np.int64) + reports.symbols + 1
    width = mech.report_domain
    dense = np.zeros((reports.n_reports, width), np.int64)
    owner = np.repeat(np.arange(reports.n_reports), np.diff(reports.offsets))
    dense[owner, reports.positions] = reports.symbols
    return ((dense + 1) * 3 ** np.arange(width - 1, -1, -1)).sum(axis=1)


@dataclasses.dataclass
class Sweep:
    """Frequency errors of ``reps`` independent populations of devices
    (fresh device secrets each) over the same users."""

    errors: np.ndarray          # (reps, d): f_raw - f
    variances: np.ndarray       # (reps, d): the derived exact variance at the true f
    mean_errors: np.ndarray     # (reps, d): m_raw - m, NaN where not estimated
    mean_variances: np.ndarray  # (reps, d)

    @property
    def mse_over_variance(self) -> float:
        return float(np.mean(self.errors ** 2) / np.mean(self.variances))

    @property
    def terms(self) -> int:
        return self.errors.size


def variance_sweep(name: str, eps_inf: float, eps_1: float | None, n: int, d: int, reps: int, seed: int,
                   **options) -> Sweep:
    data = SyntheticDataset("uu", n_users=n, d=d, seed=seed)
    errs, vars_, merrs, mvars = [], [], [], []
    for r in range(reps):
        mech = longitudinal(registry.make(name, d, eps_inf, **options), eps_1,
                            DeviceKeys.from_seed(seed * 1000 + r), collection=f"rep-{r}")
        run = run_local(mech, data, seed=seed * 1000 + r)
        f, m = run.true_values(d)
        errs.append(run.estimates.frequency_raw - f)
        vars_.append(mech.frequency_variance(n, f))
        merrs.append(run.estimates.mean_raw - m)
        mean_var = mech.theoretical_variance(n, f, m)[1]
        mvars.append(np.full(d, np.nan) if mean_var is None else mean_var)
    return Sweep(*(np.array(a) for a in (errs, vars_, merrs, mvars)))
