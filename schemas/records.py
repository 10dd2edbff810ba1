"""Conversions between NumPy batches and Avro/JSON records."""
from __future__ import annotations

import math
from typing import Iterable, Sequence

import numpy as np

from mechanisms.base import Estimates, ReportBatch


def _opt(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def estimate_records(est: Estimates, key_names: Sequence[str], true_frequency=None,
                     true_mean=None) -> list[dict]:
    """One ``estimate.avsc`` record per key (truth fields only in simulations)."""
    if len(key_names) != est.d:
        raise ValueError(f"{len(key_names)} key names for {est.d} estimates")
    out = []
    for k, name in enumerate(key_names):
        out.append({
            "key": str(name),
            "frequency": float(est.frequency[k]),
            "mean": float(est.mean[k]),
            "frequency_raw": float(est.frequency_raw[k]),
            "mean_raw": _opt(est.mean_raw[k]),
            "frequency_se": float(est.frequency_se[k]),
            "mean_se": _opt(est.mean_se[k]),
            "n_reports": int(est.n_reports),
            "mechanism": est.mechanism,
            "epsilon": float(est.epsilon),
            "true_frequency": None if true_frequency is None else _opt(true_frequency[k]),
            "true_mean": None if true_mean is None else _opt(true_mean[k]),
        })
    return out


def report_records(reports: ReportBatch) -> Iterable[dict]:
    """One ``report.avsc`` record per user."""
    offsets = reports.offsets.tolist()
    positions = reports.positions.tolist()
    signs = reports.signs.tobytes()
    for i in range(reports.n_reports):
        lo, hi = offsets[i], offsets[i + 1]
        yield {"positions": positions[lo:hi], "signs": signs[lo:hi]}


def reports_from_records(records: Iterable[dict], batch_id: int = 0) -> ReportBatch:
    """Inverse of :func:`report_records`; validates entry counts and signs."""
    sizes, positions, signs = [], [], []
    for r in records:
        pos, sg = r["positions"], r["signs"]
        if len(pos) != len(sg):
            raise ValueError("report with different numbers of positions and signs")
        sizes.append(len(pos))
        positions.extend(pos)
        signs.append(sg)
    sign_arr = np.frombuffer(b"".join(signs), dtype=np.int8)
    if len(sign_arr) and not np.all(np.abs(sign_arr) <= 1):
        raise ValueError("report signs must be -1, 0 or +1")
    return ReportBatch(np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]),
                       np.asarray(positions, dtype=np.int32), sign_arr, batch_id)
