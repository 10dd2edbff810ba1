"""Conversions between NumPy batches and Avro/JSON records."""
from __future__ import annotations

import json
import math
from collections.abc import Sequence

import numpy as np

from kvldp.mechanisms.base import Estimates
from kvldp.mechanisms.protocol import Collection, ProtocolState


def _opt(x) -> float | None:
    x = float(x)
    return x if math.isfinite(x) else None


def _at(values, k: int) -> float | None:
    return None if values is None else _opt(values[k])


def _status(statuses, k: int) -> str:
    return "ok" if statuses is None else str(statuses[k])


def on_rating_scale(mean, se, rating_range):
    """A mean in ``[-1, 1]`` and its s.e. on the ratings' own scale ``[lo, hi]``:
    ``lo + (mean + 1)(hi - lo)/2`` and ``se (hi - lo)/2`` (the inverse of the
    ingest's normalisation, ``transforms.ratings.normalise``)."""
    lo, hi = rating_range
    half = (hi - lo) / 2.0
    return lo + (np.asarray(mean, dtype=np.float64) + 1.0) * half, np.asarray(se, dtype=np.float64) * half


def estimate_records(est: Estimates, key_names: Sequence[str], true_frequency=None,
                     true_mean=None, rating_range: tuple[float, float] | None = None) -> list[dict]:
    """One ``estimate.avsc`` record per key (truth fields only in
    simulations). NaN estimates and standard errors become null; the
    statuses say why. ``rating_range``: the ratings' own scale, for
    ``mean_rating``/``mean_rating_se`` (null without one)."""
    if len(key_names) != est.d:
        raise ValueError(f"{len(key_names)} key names for {est.d} estimates")
    scaled = (np.full(est.d, np.nan), np.full(est.d, np.nan)) if rating_range is None else \
        on_rating_scale(est.mean, est.mean_se, rating_range)
    out = []
    for k, name in enumerate(key_names):
        out.append({
            "key": str(name),
            "frequency": _opt(est.frequency[k]),
            "mean": _opt(est.mean[k]),
            "frequency_raw": _opt(est.frequency_raw[k]),
            "mean_raw": _opt(est.mean_raw[k]),
            "frequency_se": _opt(est.frequency_se[k]),
            "mean_se": _opt(est.mean_se[k]),
            "frequency_lo": _at(est.frequency_lo, k),
            "frequency_hi": _at(est.frequency_hi, k),
            "mean_lo": _at(est.mean_lo, k),
            "mean_hi": _at(est.mean_hi, k),
            "mean_rating": _opt(scaled[0][k]),
            "mean_rating_se": _opt(scaled[1][k]),
            "frequency_status": _status(est.frequency_status, k),
            "mean_status": _status(est.mean_status, k),
            "postprocess": est.postprocess or "raw",
            "n_reports": int(est.n_reports),
            "mechanism": est.mechanism,
            "epsilon": float(est.epsilon),
            "true_frequency": None if true_frequency is None else _opt(true_frequency[k]),
            "true_mean": None if true_mean is None else _opt(true_mean[k]),
        })
    return out


def broadcast_records(state, protocol, key_names: Sequence[str]) -> list[dict]:
    """One ``broadcast.avsc`` record per key from ``protocol``'s ``ProtocolState``."""
    config = dict(protocol.config())
    est = state.estimates
    cfg = json.dumps(config, sort_keys=True)
    out = []
    for rec, m_next in zip(estimate_records(est, key_names), state.broadcast, strict=True):
        out.append({"round": int(state.rounds_done), "key": rec["key"],
                    "broadcast_kind": protocol.broadcast_kind, "broadcast_value": float(m_next),
                    "stopped": bool(state.stopped), "epsilon_spent": float(state.epsilon_spent), "config": cfg,
                    "extra": json.dumps(dict(state.extra)),
                    "collection": "" if state.collection is None else state.collection.to_json(),
                    **{k: rec[k] for k in ("frequency", "mean", "frequency_raw", "mean_raw", "frequency_se",
                                           "mean_se", "frequency_status", "mean_status", "n_reports")}})
    return out


def state_from_broadcast(records: Sequence[dict], key_names: Sequence[str], protocol):
    """Inverse of :func:`broadcast_records`, keys ordered by ``key_names``;
    ``(state, the config that wrote it)``."""
    mechanism, epsilon = protocol.name, protocol.epsilon
    by_key = {r["key"]: r for r in records}
    missing = [k for k in key_names if k not in by_key]
    if missing or len(by_key) != len(key_names):
        raise ValueError(f"broadcast does not match the key dictionary (missing {missing[:5]}, "
                         f"{len(by_key)} keys vs {len(key_names)})")
    rows = [by_key[k] for k in key_names]
    col = lambda f: np.array([np.nan if r[f] is None else r[f] for r in rows], dtype=np.float64)  # noqa: E731
    kinds = {r["broadcast_kind"] for r in rows}
    if kinds != {protocol.broadcast_kind}:
        raise ValueError(f"the broadcast carries {sorted(kinds)}, but {protocol.name} broadcasts "
                         f"{protocol.broadcast_kind!r}")
    rounds = {r["round"] for r in rows}
    if len(rounds) != 1:
        raise ValueError(f"broadcast mixes rounds {sorted(rounds)}")
    status = lambda f: np.array([r.get(f) or "ok" for r in rows], dtype=object)  # noqa: E731
    est = Estimates(frequency=col("frequency"), mean=col("mean"), frequency_raw=col("frequency_raw"),
                    mean_raw=col("mean_raw"), frequency_se=col("frequency_se"), mean_se=col("mean_se"),
                    n_reports=int(rows[0]["n_reports"]), mechanism=mechanism, epsilon=epsilon,
                    frequency_status=status("frequency_status"), mean_status=status("mean_status"))
    extra = tuple(sorted(json.loads(rows[0].get("extra") or "{}").items()))
    collections = {r.get("collection") or "" for r in rows}
    if len(collections) != 1:
        raise ValueError("broadcast mixes collections")
    return ProtocolState(rounds.pop(), col("broadcast_value"), bool(rows[0]["stopped"]),
                         float(rows[0]["epsilon_spent"]), est, extra,
                         Collection.from_json(collections.pop())), json.loads(rows[0]["config"])


def ioh_counts_record(counts, mechanism, key_names: Sequence[str], truth=None) -> dict:
    """The ``ioh_counts.avsc`` record of an IOH run."""
    return {"mechanism": mechanism.name, "epsilon": mechanism.epsilon,
            "keys": [key_names[k] for k in mechanism.ioh_keys], "n_reports": int(counts[0]),
            "p": float(mechanism.p), "q": float(mechanism.q), "support": [int(c) for c in counts[1:]],
            "truth": None if truth is None else [float(t) for t in truth]}
