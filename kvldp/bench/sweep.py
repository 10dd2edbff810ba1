"""``kvldp bench --sweep OUT``: every mechanism at several sizes, both paths.

Each (mechanism, n, path) runs in its own process (``bench_path``), so its
peak RSS is its own and the parent times the whole command, imports
included; the two paths' estimates are compared bit for bit. Each runs
``repeats`` times and the fastest run is reported (with the largest peak
RSS of them all): on two shared cores the same run varies by up to 1.5x,
and a ratio of two single runs by more. Writes
``OUT/bench.csv`` (one row per run) and ``OUT/bench.png`` (users/s and peak
RSS against n, Beam solid, NumPy dashed, one colour per mechanism; a Beam
row also splits its seconds into the graph, built and translated before
the first stage runs, and the stages), and,
with ``--kernels``, the oracle kernels against the plain NumPy floor and the
peer libraries (``bench_kernels``). With ``stock``, each point also runs
the Beam job on stock Beam (``KVLDP_STOCK_BEAM=1``: Beam's own FnApiRunner,
no tweak of ``kvldp.runtime``; path ``beam-stock``, dotted), right after
the tuned one.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from kvldp.pipelines import sweep
from kvldp.plots import figures
from kvldp.runtime import atomic

FIELDS = ["mechanism", "users", "path", "seconds", "graph_seconds", "stages_seconds", "command_seconds",
          "users_per_s", "peak_rss_mb", "batch", "ratio_beam_numpy", "identical", "runs", "error"]
# A Beam run's split (``bench_path``): before its first stage (the graph built, translated and fused; what
# the job costs however few users) and its stages; blank for NumPy runs
PHASES = ("graph_seconds", "stages_seconds")
# the paths of a point: NumPy, the Beam job on the tuned local runner, and (``stock``) on Beam as it ships
STOCK = "beam-stock"


def run_one(path: str, name: str, users: int, keys: int, seed: int, epsilon: float,
            work: Path) -> tuple[dict, np.ndarray | None]:
    out = work / f"{name}-{users}-{path}.npy"
    env = {**os.environ, "KVLDP_STOCK_BEAM": "1" if path == STOCK else os.environ.get("KVLDP_STOCK_BEAM", "")}
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "kvldp.bench.path", "beam" if path == STOCK else path,
                           name, str(users), str(keys), str(seed), str(out), f"epsilon={epsilon:g}"],
                          capture_output=True, text=True, check=False, env=env)
    command = time.perf_counter() - start
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        return {"mechanism": name, "users": users, "path": path, "error": tail[:300]}, None
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    row = {"mechanism": name, "users": users, "path": path, "seconds": round(info["seconds"], 3),
           "command_seconds": round(command, 3), "users_per_s": round(users / info["seconds"]),
           "peak_rss_mb": round(info["peak_rss_mb"]), "batch": info["batch"], "error": "",
           **{phase: round(info[phase], 3) for phase in PHASES if phase in info}}
    return row, np.load(out)


def best_of(path: str, name: str, users: int, keys: int, seed: int, epsilon: float, work: Path,
            repeats: int) -> tuple[dict, np.ndarray | None]:
    """``run_one`` ``repeats`` times: the fastest run's row (times), the
    largest peak RSS of them all, and that run's estimates (every run's
    are the same: one seed); the first failure is the row."""
    best, frequency, peak = None, None, 0
    for _ in range(repeats):
        row, estimates = run_one(path, name, users, keys, seed, epsilon, work)
        if row.get("error"):
            return row, None
        peak = max(peak, row["peak_rss_mb"])
        if best is None or row["seconds"] < best["seconds"]:
            best, frequency = row, estimates
    best.update(peak_rss_mb=peak, runs=repeats)
    return best, frequency


def run_sweep(mechanisms: Sequence[str], sizes: Sequence[int], keys: int, seed: int, epsilon: float,
              out_dir: Path, progress=print, repeats: int = 1, stock: bool = False) -> list[dict]:
    out_dir.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="kvldp-bench-") as tmp:
        for name in mechanisms:
            for n in sizes:
                found = {}
                for path in ("numpy", "beam", *([STOCK] if stock else [])):
                    row, frequency = best_of(path, name, n, keys, seed, epsilon, Path(tmp), repeats)
                    rows.append(row)
                    found[path] = (row, frequency)
                numpy_row, a = found["numpy"]
                for path in ("beam", STOCK):
                    if path not in found:
                        continue
                    beam_row, b = found[path]
                    if a is not None and b is not None:
                        same = bool(np.array_equal(a, b, equal_nan=True))
                        ratio = beam_row["users_per_s"] / numpy_row["users_per_s"]
                        beam_row.update(identical=same, ratio_beam_numpy=round(ratio, 3))
                        if path == "beam":
                            numpy_row.update(identical=same, ratio_beam_numpy=round(ratio, 3))
                    progress(_line(beam_row, numpy_row))
                sweep.write_csv_atomically(out_dir / "bench.csv", FIELDS, rows)
    plot(rows, out_dir / "bench.png")
    return rows


def _line(beam: dict, numpy_row: dict) -> str:
    if beam.get("error") or numpy_row.get("error"):
        return f"{beam['mechanism']:13s} n={beam['users']:>10,}  FAILED: {beam.get('error') or numpy_row.get('error')}"
    which = "stock beam" if beam["path"] == STOCK else "beam"
    return (f"{beam['mechanism']:13s} n={beam['users']:>10,}  numpy {numpy_row['users_per_s'] / 1e6:7.3f} M/s "
            f"{numpy_row['peak_rss_mb']:6.0f} MB | {which} {beam['users_per_s'] / 1e6:7.3f} M/s "
            f"{beam['peak_rss_mb']:6.0f} MB (command {beam['command_seconds']:.1f} s) | ratio "
            f"{beam['ratio_beam_numpy']:.2f} identical {beam['identical']}")


def plot(rows: list[dict], path: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (rate, memory) = plt.subplots(1, 2, figsize=(13, 5.5), dpi=figures.DPI)
    ok = [r for r in rows if not r.get("error")]
    for name in sorted({r["mechanism"] for r in ok}):
        look = figures.style(name)
        for which, line in (("beam", "-"), ("numpy", "--"), (STOCK, ":")):
            pts = sorted((r["users"], r["users_per_s"], r["peak_rss_mb"]) for r in ok
                         if r["mechanism"] == name and r["path"] == which)
            if not pts:
                continue
            n, speed, rss = zip(*pts, strict=True)
            label = name if which == "beam" else None
            rate.plot(n, np.asarray(speed) / 1e6, linestyle=line, marker=look["marker"], color=look["color"],
                      label=label, ms=4)
            memory.plot(n, rss, linestyle=line, marker=look["marker"], color=look["color"], ms=4)
    stock = any(r["path"] == STOCK for r in ok)
    for ax, title, unit in ((rate, f"throughput (solid: Beam, dashed: NumPy{', dotted: stock Beam' if stock else ''})",
                             "M users/s"),
                            (memory, "peak RSS of the process", "MB")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("users")
        ax.set_ylabel(unit)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
    rate.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    with atomic.replaced(path) as temp:
        fig.savefig(temp, dpi=figures.DPI)
    plt.close(fig)
    return path
