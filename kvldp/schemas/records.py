"""Conversions between NumPy batches and Avro/JSON records."""
from __future__ import annotations

import csv
import io
import json
import re
from collections.abc import Sequence
from json.encoder import encode_basestring_ascii

import numpy as np

from kvldp.mechanisms.base import Estimates
from kvldp.mechanisms.estimation.consistency import measured_total
from kvldp.mechanisms.protocol import Collection, ProtocolState


def on_rating_scale(mean, se, rating_range):
    """A mean in ``[-1, 1]`` and its s.e. on the ratings' own scale ``[lo, hi]``:
    ``lo + (mean + 1)(hi - lo)/2`` and ``se (hi - lo)/2`` (the inverse of the
    ingest's normalisation, ``transforms.ratings.normalise``)."""
    lo, hi = rating_range
    half = (hi - lo) / 2.0
    return lo + (np.asarray(mean, dtype=np.float64) + 1.0) * half, np.asarray(se, dtype=np.float64) * half


def _doubles(values, d: int) -> list:
    """A per-key double column as Python values: floats, None where not
    finite (null) or where the column is not given."""
    if values is None:
        return [None] * d
    arr = np.asarray(values, dtype=np.float64)
    out = arr.tolist()
    for k in np.flatnonzero(~np.isfinite(arr)).tolist():
        out[k] = None
    return out


def estimate_columns(est: Estimates, key_names: Sequence[str], true_frequency=None, true_mean=None,
                     rating_range: tuple[float, float] | None = None) -> dict[str, list]:
    """The ``estimate.avsc`` fields as columns of d Python values each (the
    values ``estimate_records`` puts in its records: floats or None, the
    statuses as str, the run's scalars repeated), built a column at a time."""
    d = est.d
    if len(key_names) != d:
        raise ValueError(f"{len(key_names)} key names for {d} estimates")
    scaled = (None, None) if rating_range is None else on_rating_scale(est.mean, est.mean_se, rating_range)
    # the per-key doubles, in estimate.avsc's order
    doubles = {"frequency": est.frequency, "mean": est.mean, "frequency_raw": est.frequency_raw,
               "mean_raw": est.mean_raw, "frequency_se": est.frequency_se, "mean_se": est.mean_se,
               "frequency_lo": est.frequency_lo, "frequency_hi": est.frequency_hi, "mean_lo": est.mean_lo,
               "mean_hi": est.mean_hi, "mean_rating": scaled[0], "mean_rating_se": scaled[1]}
    columns: dict[str, list] = {"key": [str(name) for name in key_names]}
    columns.update((name, _doubles(values, d)) for name, values in doubles.items())
    for name in ("frequency_status", "mean_status"):
        statuses = getattr(est, name)
        columns[name] = ["ok"] * d if statuses is None else [str(x) for x in statuses]
    columns["postprocess"] = [est.postprocess or "raw"] * d
    columns["n_reports"] = [int(est.n_reports)] * d
    columns["mechanism"] = [est.mechanism] * d
    columns["epsilon"] = [float(est.epsilon)] * d
    columns["padding"] = [None if est.padding is None else int(est.padding)] * d
    columns["kept_share"] = [float(est.kept_share)] * d
    for name, value in zip(("frequency_total", "frequency_total_se"), measured_total(est), strict=True):
        columns[name] = _doubles(np.full(d, value), d)
    columns["true_frequency"] = _doubles(true_frequency, d)
    columns["true_mean"] = _doubles(true_mean, d)
    return columns


def estimate_records(est: Estimates, key_names: Sequence[str], true_frequency=None,
                     true_mean=None, rating_range: tuple[float, float] | None = None) -> list[dict]:
    """One ``estimate.avsc`` record per key (truth fields only in
    simulations). NaN estimates and standard errors become null; the
    statuses say why. ``rating_range``: the ratings' own scale, for
    ``mean_rating``/``mean_rating_se`` (null without one)."""
    columns = estimate_columns(est, key_names, true_frequency, true_mean, rating_range)
    names = list(columns)
    return [dict(zip(names, row, strict=True)) for row in zip(*columns.values(), strict=True)]


def _json_strings(values: list) -> list[str]:
    """Each value as ``json.dumps`` writes it (floats by ``repr``, None as null)."""
    kinds = {type(v) for v in values}
    if kinds <= {str}:
        return list(map(encode_basestring_ascii, values))
    if kinds <= {float, type(None)}:
        return ["null" if v is None else float.__repr__(v) for v in values]
    return _each_distinct(json.dumps, values)


def _csv_strings(values: list) -> list[str]:
    """Each value as the ``csv`` module writes it in a row (None as empty,
    a string quoted only where it holds a delimiter, quote or line break)."""
    kinds = {type(v) for v in values}
    if kinds <= {float, type(None)}:
        return ["" if v is None else float.__repr__(v) for v in values]
    if kinds <= {str}:
        return [_csv_text(v) if _CSV_SPECIAL.search(v) else v for v in values]
    return _each_distinct(_csv_text, values)


def _each_distinct(fmt, values: list) -> list[str]:
    """``fmt`` of each value, computed once per distinct value (the run's scalars repeat d times)."""
    done: dict = {}
    return [done[v] if v in done else done.setdefault(v, fmt(v)) for v in values]


_CSV_SPECIAL = re.compile(r'[,"\r\n]')


def _csv_text(value) -> str:
    if value is None:
        return ""
    buf = io.StringIO()
    csv.writer(buf, lineterminator="").writerow([value, ""])      # two fields: an empty value stays unquoted
    return buf.getvalue()[:-1]


def estimate_lines(est: Estimates, key_names: Sequence[str], fmt: str, true_frequency=None, true_mean=None,
                   rating_range: tuple[float, float] | None = None) -> list[str]:
    """The records of ``estimate_records`` as the text lines of ``fmt``
    (``jsonl``: byte for byte ``json.dumps`` of each record; ``csv``: the
    ``csv`` module's row of the values, empty for null), formatted a column
    at a time: ``json.dumps`` of a dict per key was a third of a d = 10^6 run."""
    columns = estimate_columns(est, key_names, true_frequency, true_mean, rating_range)
    if fmt == "jsonl":
        texts = [_json_strings(values) for values in columns.values()]
        template = "{" + ", ".join(f"{json.dumps(name)}: %s" for name in columns) + "}"
        return [template % row for row in zip(*texts, strict=True)]
    if fmt == "csv":
        texts = [_csv_strings(values) for values in columns.values()]
        return list(map(",".join, zip(*texts, strict=True)))
    raise ValueError(f"estimate lines are jsonl or csv, not {fmt!r}")


def broadcast_records(state, protocol, key_names: Sequence[str]) -> list[dict]:
    """One ``broadcast.avsc`` record per key from ``protocol``'s ``ProtocolState``."""
    config = dict(protocol.config())
    est = state.estimates
    cfg = json.dumps(config, sort_keys=True)
    chain = protocol.round_counts(est) if hasattr(protocol, "round_counts") else None
    # one list of Python floats per key, converted at once (not per key)
    per_key = None if chain is None else np.asarray(chain, dtype=np.float64).T.tolist()
    out = []
    for k, (rec, m_next) in enumerate(zip(estimate_records(est, key_names), state.broadcast, strict=True)):
        out.append({"round": int(state.rounds_done), "key": rec["key"],
                    "broadcast_kind": protocol.broadcast_kind, "broadcast_value": float(m_next),
                    "stopped": bool(state.stopped), "epsilon_spent": float(state.epsilon_spent), "config": cfg,
                    "extra": json.dumps(dict(state.extra)),
                    "collection": "" if state.collection is None else state.collection.to_json(),
                    **{k: rec[k] for k in ("frequency", "mean", "frequency_raw", "mean_raw", "frequency_se",
                                           "mean_se", "frequency_status", "mean_status", "n_reports")},
                    "round_counts": [] if per_key is None else per_key[k]})
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
                    frequency_status=status("frequency_status"), mean_status=status("mean_status"),
                    count_model=_rounds_model(rows, protocol))
    extra = tuple(sorted(json.loads(rows[0].get("extra") or "{}").items()))
    collections = {r.get("collection") or "" for r in rows}
    if len(collections) != 1:
        raise ValueError("broadcast mixes collections")
    return ProtocolState(rounds.pop(), col("broadcast_value"), bool(rows[0]["stopped"]),
                         float(rows[0]["epsilon_spent"]), est, extra,
                         Collection.from_json(collections.pop())), json.loads(rows[0]["config"])


def _rounds_model(rows: Sequence[dict], protocol):
    """The count model of the rounds so far from the records' ``round_counts``
    (PrivKVM, PrivKVM+), or ``None`` (none kept: an older file, another protocol)."""
    chain = [r.get("round_counts") or [] for r in rows]
    if not hasattr(protocol, "model_from_round_counts") or not chain[0]:
        return None
    if len({len(c) for c in chain}) != 1:
        raise ValueError("broadcast: the keys' round_counts differ in length")
    return protocol.model_from_round_counts(np.array(chain, dtype=np.float64).T)


def ioh_counts_record(counts, mechanism, key_names: Sequence[str], truth=None) -> dict:
    """The ``ioh_counts.avsc`` record of an IOH run."""
    return {"mechanism": mechanism.name, "epsilon": mechanism.epsilon,
            "keys": [key_names[k] for k in mechanism.ioh_keys], "n_reports": int(counts[0]),
            "p": float(mechanism.p), "q": float(mechanism.q), "support": [int(c) for c in counts[1:]],
            "truth": None if truth is None else [float(t) for t in truth]}
