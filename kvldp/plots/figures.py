"""The evaluation's figures: PNGs read off ``results.csv``.

MSE of frequency and of mean against epsilon (log scale), one colour per
mechanism and one line style per post-processing (``raw`` solid: the
paper's estimator; so the gain of post-processing is the gap between a
colour's lines), mean over repeats with min-max bars, the paper's
closed-form theory thin and dotted in the same colour; NCR against epsilon
for each top-t set; the coverage of the 95 % intervals (frequency and mean,
keys with true frequency ``>= 1/d``) against epsilon with the nominal 0.95.

A mechanism has one colour and one marker in every figure of every sweep
(``style``). The y-axis spans the measured values: a closed-form theory far
above them (the variance of an unclipped estimator at small epsilon, up to
10^6 where clipped estimates have MSE <= 4) leaves the axis instead of
squashing the measurements into one line.
"""
from __future__ import annotations

import csv
from collections import defaultdict
from pathlib import Path

from kvldp.mechanisms import registry
from kvldp.runtime import atomic

FIGSIZE = (8, 5)        # inches
DPI = 100               # -> 800 x 500 pixels
MARKERS = "osD^vP*Xh<>p"
LINESTYLES = ("-", "--", "-.", ":", (0, (6, 2, 1, 2, 1, 2)), (0, (3, 1, 1, 1)), (0, (8, 3)))   # per post-processing
THEORY_STYLE = (0, (1, 4))      # sparse dots: the paper's closed form


def style(series: str) -> dict:
    """Colour and marker of a series: fixed per mechanism (its place in the
    registry), whatever else a figure shows; a variant ``"MECH (…)"``
    keeps its mechanism's colour and marker, with a dotted line."""
    mechanism = series.split(" (", 1)[0]
    known = registry.names()
    i = known.index(mechanism) if mechanism in known else len(known) + sum(map(ord, mechanism)) % 20
    return {"color": _PALETTE[i % len(_PALETTE)], "marker": MARKERS[i % len(MARKERS)],
            "linestyle": ":" if mechanism != series else "-"}


# matplotlib's tab20, dark shades first: 20 colours told apart in print
_PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
            "#bcbd22", "#17becf", "#aec7e8", "#ffbb78", "#98df8a", "#ff9896", "#c5b0d5", "#c49c94",
            "#f7b6d2", "#c7c7c7", "#dbdb8d", "#9edae5"]


def _load(path: Path):
    rows = []
    with open(path, newline="") as fh:
        for r in csv.DictReader(fh):
            r["epsilon"], r["value"] = float(r["epsilon"]), float(r["value"])
            r["theory"] = float(r["theory"]) if r["theory"] not in ("", None) else None
            rows.append(r)
    return rows


def _series(rows, metric, key_set):
    """(mechanism, post-processing) -> sorted [(eps, mean, min, max, theory mean or None)]."""
    cells = defaultdict(list)
    for r in rows:
        if r["metric"] == metric and r["key_set"] == key_set:
            cells[((r["mechanism"], r.get("postprocess") or "raw"), r["epsilon"])].append(r)
    out = defaultdict(list)
    for (mech, eps), rs in sorted(cells.items()):
        vals = [r["value"] for r in rs if r["value"] == r["value"]]
        th = [r["theory"] for r in rs if r["theory"] is not None]
        if vals:
            # a float mean of equal values can fall an ulp outside them (0.1 x 3 -> 0.10000000000000002),
            # and matplotlib refuses a negative error bar
            mean = min(max(sum(vals) / len(vals), min(vals)), max(vals))
            out[mech].append((eps, mean, min(vals), max(vals), sum(th) / len(th) if th else None))
    return out


def _plot(series, title: str, ylabel: str, path: Path, log: bool, reference: float | None = None):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=FIGSIZE, dpi=DPI)
    # a key is (mechanism, post-processing), or a mechanism alone (its raw estimates)
    series = {(k, "raw") if isinstance(k, str) else k: pts for k, pts in series.items()}
    mechanisms = sorted({m for m, _ in series})
    methods = sorted({p for _, p in series}, key=lambda p: (p != "raw", p))
    measured = _draw_series(ax, series, methods)
    if reference is not None:
        ax.axhline(reference, color="grey", linestyle=":", label=f"nominal {reference:g}")
        measured.append(reference)
    if log:
        ax.set_yscale("log")
    _fit_to_measurements(ax, measured, log)
    ax.set_xlabel("epsilon")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    _legend(ax, mechanisms, methods, reference)
    fig.tight_layout()
    with atomic.replaced(path) as temp:
        fig.savefig(temp, dpi=DPI)
    plt.close(fig)
    return path


def _draw_series(ax, series, methods) -> list[float]:
    """Each (mechanism, post-processing)'s means with min-max bars, and each
    mechanism's theory once; returns the values measured (for the y-axis)."""
    measured, with_theory = [], set()
    for (mech, method), pts in sorted(series.items(), key=lambda kv: (kv[0][0], methods.index(kv[0][1]))):
        look = {**style(mech), "linestyle": LINESTYLES[methods.index(method) % len(LINESTYLES)]}
        label = mech if len(methods) == 1 else f"{mech} ({method})"
        eps = [p[0] for p in pts]
        mean = [p[1] for p in pts]
        measured += [p[2] for p in pts] + [p[3] for p in pts]
        err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
        ax.errorbar(eps, mean, yerr=err, ms=4, capsize=2, label=label, **look)
        theory = [(p[0], p[4]) for p in pts if p[4] is not None and p[4] > 0]
        if theory and mech not in with_theory:      # the theory once per mechanism
            with_theory.add(mech)
            ax.plot(*zip(*theory, strict=True), linestyle=THEORY_STYLE, linewidth=0.8, color=look["color"],
                    alpha=0.8, label=f"{mech} (theory)")
    return measured


def _legend(ax, mechanisms, methods, reference: float | None):
    """The figure's legend: one entry per line, or with several post-processings
    one per mechanism (colour, marker) and one per post-processing (line style)."""
    if len(methods) > 1:     # colour and marker = mechanism, line style = post-processing: one legend entry each
        from matplotlib.lines import Line2D
        handles = [Line2D([], [], color=style(m)["color"], marker=style(m)["marker"], label=m) for m in mechanisms]
        handles += [Line2D([], [], color="black", linestyle=LINESTYLES[i % len(LINESTYLES)], label=p)
                    for i, p in enumerate(methods)]
        if any(h.get_label().endswith("(theory)") for h in ax.get_lines()):
            handles.append(Line2D([], [], color="grey", linestyle=THEORY_STYLE, linewidth=0.8, label="paper's theory"))
        if reference is not None:
            handles.append(Line2D([], [], color="grey", linestyle=":", label=f"nominal {reference:g}"))
        ax.legend(handles=handles, fontsize=8, ncol=2)
    else:
        ax.legend(fontsize=8)


def _fit_to_measurements(ax, values, log: bool):
    """The y-axis around the measured values (with a margin), not the theory's."""
    values = [v for v in values if v == v and (v > 0 or not log)]
    if not values:
        return
    lo, hi = min(values), max(values)
    if log:
        ax.set_ylim(lo / 2.0, hi * 2.0)
    else:
        pad = 0.05 * (hi - lo) or 0.05 * abs(hi) or 0.05
        ax.set_ylim(lo - pad, hi + pad)


def plot_results(results_csv, out_dir) -> list[Path]:
    rows = _load(Path(results_csv))
    out_dir = Path(out_dir)
    dataset = rows[0]["dataset"] if rows else ""
    pngs = []
    key_sets = sorted({r["key_set"] for r in rows if r["metric"] == "mse_frequency"},
                      key=lambda k: (k != "all", len(k), k))
    for key_set in key_sets:
        for metric, label in (("mse_frequency", "MSE of frequency"), ("mse_mean", "MSE of mean")):
            series = _series(rows, metric, key_set)
            if series:
                pngs.append(_plot(series, f"{label}, {key_set} keys — {dataset}", label,
                                  out_dir / f"{metric}_{key_set}.png", log=True))
    pngs.extend(_plot(_series(rows, "ncr", key_set), f"NCR of the {key_set} keys — {dataset}", "NCR",
                      out_dir / f"ncr_{key_set}.png", log=False)
                for key_set in sorted({r["key_set"] for r in rows if r["metric"] == "ncr"}))
    for metric, label in (("coverage_frequency", "frequency"), ("coverage_mean", "mean")):
        series = _series(rows, metric, "f>=1/d")
        if series:
            pngs.append(_plot(series, f"Coverage of the 95 % intervals, {label}, keys with f >= 1/d — {dataset}",
                              "coverage", out_dir / f"{metric}.png", log=False, reference=0.95))
    return pngs


# -- repeated collections (kvldp evaluate --collections T) ----------------------

MODE_LINES = {"fresh": "-", "memoised": "--", "two-layer": ":", "fresh-eps1": "-."}


def plot_over_time(results_csv, out_dir, top: int, churn: float) -> Path:
    """``over_time.png``: per collection, the MSE of frequency and of mean
    over the top-``top`` keys of the clipped estimates (log scale; the
    derived variance of the raw frequency estimate as thin lines: the clipped
    MSE sits below it where the noise is large against ``f``) and each mode's cumulative privacy loss (mean
    over users, the largest dashed-grey). One colour and marker per
    mechanism, one line style per mode."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series, dataset = _over_time_series(results_csv, top)
    fig, axes = plt.subplots(1, 3, figsize=(17, 5), dpi=DPI)
    panels = (("mse_frequency", f"MSE of frequency, top-{top} keys", True),
              ("mse_mean", f"MSE of mean, top-{top} keys", True),
              ("loss_mean", "cumulative privacy loss per user (eps)", False))
    for ax, (metric, title, log) in zip(axes, panels, strict=True):
        _over_time_panel(ax, series, metric, title, log)
    axes[2].set_ylim(bottom=0)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 3), fontsize=8)
    eps = sorted({k[1] for k in series})
    fig.suptitle(f"{dataset}: repeated collections, churn {churn:g}, eps_inf {', '.join(f'{e:g}' for e in eps)} "
                 "(fresh -, memoised --, two-layer :, fresh at eps_1 -.)\nMSE of the clipped estimates; thin lines: "
                 "the derived variance of the raw ones (clipping at 0 takes up to half of it where the noise "
                 "exceeds f)",
                 fontsize=10)
    fig.tight_layout(rect=(0, 0.12, 1, 0.95))
    path = Path(out_dir) / "over_time.png"
    with atomic.replaced(path) as temp:
        fig.savefig(temp, dpi=DPI)
    plt.close(fig)
    return path


def _over_time_series(results_csv, top: int):
    """``((mech, eps, mode) -> metric -> [(t, value, theory)], dataset)`` of
    the top-``top`` keys' and the users' rows of ``results_csv``."""
    series = defaultdict(lambda: defaultdict(list))     # (mech, eps, mode) -> metric -> [(t, value, theory)]
    dataset = ""
    with open(results_csv, newline="") as fh:
        for r in csv.DictReader(fh):
            dataset = r["dataset"]
            if r["key_set"] not in (f"top{top}", "users"):
                continue
            theory = float(r["theory"]) if r["theory"] not in ("", None) else None
            series[(r["mechanism"], float(r["epsilon"]), r["mode"])][r["metric"]].append(
                (int(r["collection"]), float(r["value"]), theory))
    return series, dataset


def _over_time_panel(ax, series, metric: str, title: str, log: bool):
    """One panel of ``over_time.png``: ``metric`` per collection, a line per (mechanism, eps, mode)."""
    measured = []
    if metric == "loss_mean":
        measured = _plot_losses(ax, series)
    for (mech, _, mode), metrics in sorted(series.items()):
        pts = _by_collection(metrics.get(metric, []))
        if not pts or metric == "loss_mean":
            continue
        look = {**style(mech), "linestyle": MODE_LINES.get(mode, "-")}
        xs, ys = [p[0] for p in pts], [p[1] for p in pts]
        measured += ys
        ax.plot(xs, ys, ms=3, label=f"{mech} {mode}", **look)
        if metric == "mse_frequency" and all(p[2] for p in pts):
            ax.plot(xs, [p[2] for p in pts], color=look["color"], linestyle=look["linestyle"], lw=0.6,
                    alpha=0.6)
    if log:
        ax.set_yscale("log")
    _fit_to_measurements(ax, measured, log)
    ax.set_xlabel("collection")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.set_title(title, fontsize=10)
    ax.grid(True, which="both", alpha=0.3)


def _plot_losses(ax, series) -> list[float]:
    """The cumulative loss does not depend on the mechanism, only on the mode
    and the users' states: one black line per (eps_inf, mode) -- the mean
    over users, and the most-charged user thin -- with the two memoised modes
    (charged alike) drawn once."""
    drawn, measured = set(), []
    for (_, eps, mode), metrics in sorted(series.items(), key=lambda kv: MODES_ORDER.index(kv[0][2])
                                          if kv[0][2] in MODES_ORDER else 9):
        label = {"memoised": f"memoised = two-layer (eps_inf {eps:g})",
                 "two-layer": f"memoised = two-layer (eps_inf {eps:g})",
                 "fresh-eps1": "fresh at eps_1"}.get(mode, f"fresh at eps {eps:g}")
        if (eps, label) in drawn or not metrics.get("loss_mean"):
            continue
        drawn.add((eps, label))
        line = MODE_LINES.get(mode, "-")
        for name, lw, alpha, suffix in (("loss_mean", 1.6, 1.0, " (mean user)"), ("loss_max", 0.8, 0.6,
                                                                                  " (most charged)")):
            pts = _by_collection(metrics.get(name, []))
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], color="black", linestyle=line, lw=lw, alpha=alpha,
                        label=f"{label}{suffix}")
                measured += [p[1] for p in pts]
    ax.legend(fontsize=7, loc="upper left")
    return measured


MODES_ORDER = ("fresh", "memoised", "two-layer", "fresh-eps1")


def _by_collection(points):
    """Mean over repeats per collection: ``[(t, value, theory or None)]``."""
    cells = defaultdict(list)
    for t, value, theory in points:
        cells[t].append((value, theory))
    out = []
    for t in sorted(cells):
        vals = [v for v, _ in cells[t] if v == v]
        ths = [th for _, th in cells[t] if th is not None]
        if vals:
            out.append((t, sum(vals) / len(vals), sum(ths) / len(ths) if ths else None))
    return out
