"""Reading estimate files back and printing what a person looks at."""
from __future__ import annotations

import math
import sys

import numpy as np
from apache_beam.io.filesystems import FileSystems

from kvldp.mechanisms.estimation import metrics
from kvldp.schemas.estimate_columns import EstimateRecords, read_estimate_records
from kvldp.transforms.io import format_of


def read_text(path: str) -> str:
    with FileSystems.open(path) as fh:
        return fh.read().decode("utf-8")


def named(mechanism, key_names=None) -> str:
    """The mechanism as its header prints it, with IOH's chosen keys by the
    names the table shows (``ioh_keys=['50', '258', '100']``), not their
    0-based indices."""
    text = repr(mechanism)
    keys = getattr(mechanism, "ioh_keys", None)
    if keys is not None and key_names is not None and len(key_names):
        text = text.replace(f"ioh_keys={list(keys)!r}", f"ioh_keys={[str(key_names[k]) for k in keys]!r}")
    return text


def read_estimates(path: str) -> EstimateRecords:
    """Estimate records from an Avro, JSON Lines or CSV file (held as
    columns: ``kvldp.schemas.estimate_columns``)."""
    return read_estimate_records(path, format_of(path))


def _values(records, field):
    """A field's values, key by key (no dicts built for an ``EstimateRecords``)."""
    if isinstance(records, EstimateRecords):
        return records.column(field)
    return [r.get(field) for r in records]


def column(records, field) -> np.ndarray:
    """A numeric field of estimate records as floats, NaN where null (an
    ``EstimateRecords``' own column: no dicts built)."""
    if isinstance(records, EstimateRecords):
        return records.column(field)
    return np.array([np.nan if r.get(field) is None else r[field] for r in records], dtype=np.float64)


def mse_summary(records: list[dict], top: int = 50) -> dict[str, float]:
    """MSE of frequency and mean over all keys and over the ``top`` most
    frequent (true frequency) keys (means: keys someone holds), the NCR of
    the estimated top set and the MSEs over the true-and-estimated top set
    (KSKV's metrics)."""
    f, tf = column(records, "frequency"), column(records, "true_frequency")
    m, tm = column(records, "mean"), column(records, "true_mean")
    top_idx = metrics.top_keys(tf, top)
    inter = metrics.top_t_intersection(tf, f, top)
    return {
        "mse_frequency_all": metrics.mse(f, tf), "mse_mean_all": metrics.mse(m, tm),
        f"mse_frequency_top{top}": metrics.mse(f, tf, top_idx), f"mse_mean_top{top}": metrics.mse(m, tm, top_idx),
        f"ncr_top{top}": metrics.ncr(tf, f, top),
        f"mse_frequency_found{top}": metrics.mse(f, tf, inter), f"mse_mean_found{top}": metrics.mse(m, tm, inter),
    }


def _num(value, width: int, digits: int) -> str:
    return f"{value:{width}.{digits}f}" if value is not None else f"{'null':>{width}}"


def _interval(r, what: str, digits: int) -> str:
    lo, hi = r.get(f"{what}_lo"), r.get(f"{what}_hi")
    if lo is None or hi is None:
        return f"{'null':>{2 * digits + 7}}"
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]"


def _outside(r, what: str) -> bool:
    """The record's ``what`` estimate lies outside its own interval (empirical Bayes pulled it)."""
    x, lo, hi = r.get(what), r.get(f"{what}_lo"), r.get(f"{what}_hi")
    return None not in (x, lo, hi) and not lo - 1e-12 <= x <= hi + 1e-12


def scale_text(rating_range) -> str:
    lo, hi = rating_range
    return f"{lo:g}-{hi:g}"


def _on_scale(mean, rating_range):
    """A mean in [-1, 1] on the ratings' own scale (None stays None)."""
    lo, hi = rating_range
    return None if mean is None else lo + (mean + 1.0) * (hi - lo) / 2.0


def rating_summary(summary: dict[str, float], rating_range) -> str:
    """The mean errors of ``mse_summary`` on the ratings' own scale, as RMSEs
    (an MSE of means in [-1, 1] times ((hi - lo)/2)^2)."""
    half = (rating_range[1] - rating_range[0]) / 2.0
    parts = [f"{k.replace('mse_mean_', '')} {math.sqrt(v) * half:.4g}" for k, v in summary.items()
             if k.startswith("mse_mean_") and v == v]
    return f"mean RMSE on the {scale_text(rating_range)} scale: " + ", ".join(parts)


def print_table(records: list[dict], rows: int = 10, out=None, rating_range=None):
    """The most frequent keys: truth (when known) next to the estimate and
    its 95 % interval (``null`` where not estimable or, for a mean, where
    the reports bound it no better than [-1, 1]; the status alongside).
    With ``rating_range`` the means are shown on the ratings' own scale."""
    out = out or sys.stdout
    has_truth = bool(np.isfinite(column(records, "true_frequency")).any())
    ranked = _ranked(records, rows, has_truth, rating_range, out)
    methods = sorted({p or "raw" for p in _values(records, "postprocess")})
    f_int, m_int = "95% interval f".rjust(18), "95% interval m".rjust(16)
    if has_truth:
        print(f"{'key':>10} {'true f':>9} {'est f':>9} {f_int} {'true m':>8} {'est m':>8} {m_int}", file=out)
    else:
        print(f"{'key':>10} {'est f':>9} {f_int} {'est m':>8} {m_int}", file=out)
    notes = set()
    for r in ranked:
        notes.update(_print_row(r, has_truth, out))
    print(f"post-processing: {', '.join(methods)} (raw: the paper's estimator, interval raw ± 1.96 s.e.; "
          "otherwise kvldp.mechanisms.estimation.postprocess, intervals from each key's own reports)", file=out)
    _print_total(records, out)
    _print_notes(notes, out, ranked[0] if ranked else {})


def _print_total(records, out):
    """The frequencies' sum next to the total the reports measure
    (``frequency_total``, estimate.avsc), and what a sum far above it means."""
    if not len(records) or not np.isfinite(column(records, "frequency_total")[0]):
        return
    total, se = float(column(records, "frequency_total")[0]), float(column(records, "frequency_total_se")[0])
    got = float(np.nansum(column(records, "frequency")))
    print(f"frequencies sum to {got:.4g} pairs per user; the reports measure {total:.4g} ± {se:.2g}", file=out)
    if got > total + 2 * se:
        print("  above it by more than 2 s.e.: the many small keys' noise, raised to 0, adds that mass (the default "
              "takes it out only where that does not cost the top keys; --postprocess norm-sub always)", file=out)


def _ranked(records: list[dict], rows: int, has_truth: bool, rating_range, out) -> list[dict]:
    """The ``rows`` most frequent keys' records (by truth when known), their
    means on the ratings' scale with ``rating_range`` (said on ``out``)."""
    order = np.nan_to_num(column(records, "true_frequency" if has_truth else "frequency"), nan=0.0)
    ranked = [records[int(i)] for i in np.argsort(-order, kind="stable")[:rows]]   # only these become dicts
    if rating_range is not None:
        ranked = [{**r, "mean": r.get("mean_rating"), "mean_se": r.get("mean_rating_se"),
                   **{f: _on_scale(r.get(f), rating_range) for f in ("mean_lo", "mean_hi", "true_mean")}}
                  for r in ranked]
        print(f"(means on the ratings' {scale_text(rating_range)} scale)", file=out)
    return ranked


def _print_row(r: dict, has_truth: bool, out) -> list[str]:
    """One key's line of ``print_table``; returns its statuses (for the notes)."""
    f, m = _num(r.get("frequency"), 9, 5), _num(r.get("mean"), 8, 4)
    fi, mi = _interval(r, "frequency", 5), _interval(r, "mean", 3)
    status = [s for s in (r.get("frequency_status"), r.get("mean_status")) if s not in (None, "ok")]
    status += ["pulled"] if _outside(r, "frequency") or _outside(r, "mean") else []
    tail = f"  ({', '.join(dict.fromkeys(status))})" if status else ""
    if has_truth:
        tm = "" if r.get("true_mean") is None else f"{r['true_mean']:8.4f}"
        print(f"{r['key']:>10} {r['true_frequency']:9.5f} {f} {fi:>18} {tm:>8} {m} {mi:>16}{tail}", file=out)
    else:
        print(f"{r['key']:>10} {f} {fi:>18} {m} {mi:>16}{tail}", file=out)
    return status


def _print_notes(notes: set, out, record: dict):
    """What the statuses shown in ``print_table`` mean (``record``: one of
    the table's, for the run's padding and kept share)."""
    if "truncated" in notes:
        kept = record.get("kept_share")
        share = f"{kept:.2%}" if isinstance(kept, float) else "a share"
        print(f"truncated: each user reported one pair sampled from at most l = {record.get('padding')} of its "
              f"pairs, which keeps {share} of the pairs' frequency mass; the frequencies, their s.e. and "
              "intervals are divided by that share (exact when a key's holders hold as many pairs as the average "
              "pair's holder; see kept_share in the output)", file=out)
    if "biased" in notes:
        print("biased: this mechanism's mean estimator is biased (fake values of non-holders pull it), so it "
              "has no standard error", file=out)
    if "pulled" in notes:
        print("pulled: the estimate lies outside the key's own interval: its reports alone put it there, but "
              "among this many keys reports like these are mostly noise, so empirical Bayes pulls the estimate "
              "towards the other keys (--postprocess raw prints the paper's estimate)", file=out)
    if "uninformative" in notes:
        print("uninformative: the key's reports do not bound its mean more tightly than [-1, 1]; the estimate "
              "is mostly the pooled mean of the other keys", file=out)
