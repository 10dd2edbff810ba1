"""The tables ``kvldp evaluate`` writes from its ``results.csv``:
``coverage.md`` (do the intervals mean what they say), ``postprocess.md``
(each post-processing's MSEs against ``raw``) and ``defaults.md`` (the
default output against ``raw``: MSE ratios, the frequency mass, the null
estimates and why)."""
from __future__ import annotations

import csv

import numpy as np

from kvldp.mechanisms.estimation.postprocess import RAW

FREQUENT = "f>=1/d"          # the key set of the keys with true frequency >= 1/d


def _cells(results_csv) -> dict:
    """``(dataset, mechanism, epsilon, post-processing) -> {(metric, key_set): [value per repeat]}``."""
    with open(results_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    cells: dict = {}
    for r in rows:
        key = (r["dataset"], r["mechanism"], float(r["epsilon"]), r["postprocess"])
        cells.setdefault(key, {}).setdefault((r["metric"], r["key_set"]), []).append(float(r["value"]))
    return cells


def _pooled(c, what, key_set):
    """Coverage pooled over keys and repeats, and the keys scored per repeat."""
    share, scored = c.get((f"coverage_{what}", key_set), []), c.get((f"scored_{what}", key_set), [])
    hits = sum(s * k for s, k in zip(share, scored, strict=False) if k > 0)
    total = sum(k for k in scored if k > 0)
    return (f"{hits / total:.3f}" if total else "–"), (total / len(scored) if scored else 0.0)


def coverage_table(results_csv) -> str:
    """Markdown: per dataset, mechanism, epsilon and post-processing, over
    the repeats, the coverage of the 95 % intervals ``[*_lo, *_hi]`` pooled
    over keys and repeats (all keys; keys with true frequency ``>= 1/d``),
    for frequency and mean, with the keys scored per repeat; the keys
    without an interval (uninformative, biased) and the null estimates per
    repeat; the keys with s.e. 0 (summed over repeats)."""
    cells = _cells(results_csv)
    out = ["| dataset | mechanism | eps | post-processing | repeats | freq coverage all / f>=1/d (keys) "
           "| mean coverage all / f>=1/d (keys) | #no interval f/m (per run) | #null f/m (per run) "
           "| #s.e.=0 f/m (all repeats) |",
           "|---|---|---|---|---|---|---|---|---|---|"]

    def per_run(c, metric):
        vals = c.get((metric, "all"), [])
        return f"{np.mean(vals):.4g}" if vals else "–"

    for (dataset, mech, eps, method), c in sorted(cells.items()):
        if ("coverage_frequency", "all") not in c:
            continue
        reps = len(c[("coverage_frequency", "all")])
        cov = {}
        for what in ("frequency", "mean"):
            (a, _), (b, k) = _pooled(c, what, "all"), _pooled(c, what, FREQUENT)
            cov[what] = f"{a} / {b} ({k:.1f})"
        zeros = f"{int(sum(c.get(('se_zero_frequency', 'all'), [])))}/{int(sum(c.get(('se_zero_mean', 'all'), [])))}"
        out.append(f"| {dataset} | {mech} | {eps:g} | {method} | {reps} | {cov['frequency']} | {cov['mean']} | "
                   f"{per_run(c, 'no_interval_frequency')}/{per_run(c, 'no_interval_mean')} | "
                   f"{per_run(c, 'null_frequency')}/{per_run(c, 'null_mean')} | {zeros} |")
    return "\n".join(out) + "\n"


GAIN_METRICS = (("mse_frequency", "all"), ("mse_mean", "all"), ("mse_frequency", "top50"), ("mse_mean", "top50"),
                ("ncr", "top20"), ("ncr", "top50"))


def gain_table(results_csv) -> str:
    """Markdown: per dataset, mechanism and epsilon, each metric's mean over
    the repeats for ``raw`` and every other post-processing, with the ratio
    post-processed / raw for the MSEs (< 1: the post-processing helps)."""
    cells = _cells(results_csv)
    methods = sorted({k[3] for k in cells} - {RAW})
    present = [(m, ks) for m, ks in GAIN_METRICS if any((m, ks) in c for c in cells.values())]
    head = " | ".join(f"{m.replace('mse_', 'MSE ')} {ks}" for m, ks in present)
    out = [f"| dataset | mechanism | eps | post-processing | {head} |", "|---|---|---|---|" + "---|" * len(present)]
    for (dataset, mech, eps, method), c in sorted(cells.items(), key=lambda kv: (kv[0][:3], kv[0][3] != RAW)):
        if method != RAW and method not in methods:
            continue
        raw = cells.get((dataset, mech, eps, RAW), {})
        parts = []
        for metric, ks in present:
            vals = [v for v in c.get((metric, ks), []) if v == v]
            if not vals:
                parts.append("–")
                continue
            value = np.mean(vals)
            base = [v for v in raw.get((metric, ks), []) if v == v]
            ratio = f" ({value / np.mean(base):.2f}x)" if method != RAW and metric.startswith("mse") and base else ""
            parts.append(f"{value:.3g}{ratio}")
        out.append(f"| {dataset} | {mech} | {eps:g} | {method} | " + " | ".join(parts) + " |")
    return "\n".join(out) + "\n"


RATIO_METRICS = (("mse_frequency", "top50"), ("mse_frequency", "all"), ("mse_mean", "top50"), ("mse_mean", "all"))


def _mean(c, metric, key_set="all") -> float:
    vals = [v for v in c.get((metric, key_set), []) if v == v]
    return float(np.mean(vals)) if vals else float("nan")


def _by_status(c, metric: str) -> str:
    """``status count, …`` per run (the mean over the repeats), or ``0``."""
    counts = {ks: np.mean(v) for (m, ks), v in c.items() if m == metric and np.mean(v) > 0}
    return ", ".join(f"{status} {count:.4g}" for status, count in sorted(counts.items())) or "0"


def defaults_table(results_csv) -> str:
    """Markdown: per dataset, mechanism, epsilon and post-processing other
    than ``raw``, the ratio of its MSE to ``raw``'s (each the mean over the
    repeats; top-50 and all keys, frequency and mean: <= 1 means the
    post-processing did no harm), the frequency total (pairs per user) of
    the output and as the reports measure it (``frequency_total``: the
    unclipped raw estimates' sum, or a total from reports the keys' own
    estimates do not use -- PCKV, KS-UE, KS-GRR) with its s.e. against
    the truth of the keys with an estimate (and of all keys where a
    mechanism leaves some null: F2M's keys without a report), and the
    null estimates per run by status."""
    cells = _cells(results_csv)
    present = [(m, ks) for m, ks in RATIO_METRICS if any((m, ks) in c for c in cells.values())]
    head = " | ".join(f"{m.replace('mse_', '')} {ks}" for m, ks in present)
    out = [f"| dataset | mechanism | eps | post-processing | MSE ratio {head} | total: output / measured ± s.e. / "
           "truth of the estimated keys "
           "| null frequency (per run) | null mean (per run) |",
           "|---|---|---|---|" + "---|" * len(present) + "---|---|---|"]
    for (dataset, mech, eps, method), c in sorted(cells.items()):
        raw = cells.get((dataset, mech, eps, RAW))
        if method == RAW or raw is None:
            continue
        ratios = []
        for metric, ks in present:
            value, base = _mean(c, metric, ks), _mean(raw, metric, ks)
            ratios.append("–" if not (np.isfinite(value) and np.isfinite(base)) else
                          f"{value / base:.3f}" if base > 0 else ("1.000" if value == 0 else "inf"))
        truth, estimated = _mean(raw, 'true_total_frequency'), _mean(raw, 'true_total_frequency', 'estimated')
        total = (f"{_mean(c, 'total_frequency'):.4g} / {_mean(raw, 'measured_total_frequency'):.4g} ± "
                 f"{_mean(raw, 'measured_total_frequency_se'):.2g} / {estimated:.4g}"
                 + ("" if np.isclose(estimated, truth) else f" (all keys {truth:.4g})"))
        out.append(f"| {dataset} | {mech} | {eps:g} | {method} | " + " | ".join(ratios) + f" | {total} | "
                   f"{_by_status(c, 'null_frequency_by_status')} | {_by_status(c, 'null_mean_by_status')} |")
    return "\n".join(out) + "\n"
