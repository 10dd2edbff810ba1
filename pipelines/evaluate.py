"""``kvldp evaluate``: sweep (mechanism, epsilon, repeat) cells as pipelines,
write a tidy ``results.csv`` and the papers' figures as PNGs.

Every cell is one ``simulate`` pipeline (any Beam runner through the usual
options) whose estimates are scored against the simulated truth: MSE of
frequency and mean over all keys and over the top-``t`` keys (with the
closed-form theory where the mechanism has one), NCR of the top-``t`` set
and the MSEs over the keys it found. Cells run in parallel worker
processes (``--parallel``); a rerun with the same ``--out`` skips the cells
``results.csv`` already holds.
"""
from __future__ import annotations

import argparse
import concurrent.futures as futures
import copy
import csv
import multiprocessing
import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from mechanisms import metrics, registry
from pipelines import common, figures, simulate
from pipelines.presets import PRESETS

FIELDS = ["mechanism", "epsilon", "repeat", "metric", "key_set", "value", "theory", "dataset", "n_users"]


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a paper's setup (overridable)")
    parser.add_argument("--mechanisms", default=None, help="comma-separated, e.g. pckv-ue,pckv-grr,privkvm-vi")
    parser.add_argument("--epsilons", default=None, help="comma-separated, e.g. 0.5,1,2,4,6")
    parser.add_argument("--repeats", type=int, default=None, help="repeats per (mechanism, epsilon) (5)")
    parser.add_argument("--out", required=True, help="folder for results.csv, runs/ and the figures")
    parser.add_argument("--parallel", type=int, default=min(2, os.cpu_count() or 1),
                        help="cells run at once, each in its own process")
    parser.add_argument("--top", "--top-sets", dest="top_sets", default=None,
                        help="top-t key sets to score, e.g. 20,50 (default 50); KS-GRR/KS-Adap use the largest as t")
    common.add_mechanism_args(parser, single=False)
    common.add_dataset_args(parser)
    parser.set_defaults(users=None, keys=None, dataset=None)     # so a preset can fill them


DEFAULTS = {"users": 1_000_000, "keys": 100, "dataset": "synthetic-uu", "mechanisms": "pckv-ue,pckv-grr",
            "epsilons": "1,2,4", "repeats": 5, "top_sets": "50"}


def apply_preset(args) -> argparse.Namespace:
    """The preset's values wherever the command line gave none, then defaults."""
    args = copy.copy(args)
    preset = PRESETS[args.preset] if args.preset else {}
    for name, value in {**preset}.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    for name, value in DEFAULTS.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    return args


def cells(args):
    mechs = [m.strip() for m in str(args.mechanisms).split(",") if m.strip()]
    for m in mechs:
        registry.factory(m)                    # unknown names fail before anything runs
    epsilons = [float(e) for e in str(args.epsilons).split(",")]
    return [(m, e, r) for m in mechs for e in epsilons for r in range(args.repeats)]


def done_cells(path: Path) -> set:
    if not path.exists():
        return set()
    with open(path, newline="") as fh:
        return {(r["mechanism"], float(r["epsilon"]), int(r["repeat"])) for r in csv.DictReader(fh)}


def score(records: list[dict], mechanism, n_users: int, tops, run_info) -> list[dict]:
    """Tidy metric rows of one run, with theory where the mechanism has one."""
    f = np.array([r["frequency"] for r in records], dtype=float)
    m = np.array([r["mean"] for r in records], dtype=float)
    tf = np.array([np.nan if r["true_frequency"] is None else r["true_frequency"] for r in records])
    tm = np.array([np.nan if r["true_mean"] is None else r["true_mean"] for r in records])
    theory = mechanism.theoretical_variance(n_users, tf, tm) if n_users else None
    rows = []

    def add(metric, key_set, value, th=None):
        rows.append({"metric": metric, "key_set": key_set, "value": value,
                     "theory": "" if th is None or not np.isfinite(th) else th, **run_info})

    sets = [("all", np.arange(len(records)))] + [(f"top{t}", metrics.top_keys(tf, t)) for t in tops]
    for label, keys in sets:
        held = keys[np.isfinite(tm[keys])]
        add("mse_frequency", label, metrics.mse(f, tf, keys),
            None if theory is None else float(np.mean(theory[0][keys])))
        add("mse_mean", label, metrics.mse(m, tm, keys),
            None if theory is None or not len(held) else float(np.mean(theory[1][held])))
    for t in tops:
        found = metrics.top_t_intersection(tf, f, t)
        add("ncr", f"top{t}", metrics.ncr(tf, f, t))
        add("mse_frequency_found", f"top{t}", metrics.mse(f, tf, found))
        add("mse_mean_found", f"top{t}", metrics.mse(m, tm, found))
    return rows


def run_cell(cell, args, beam_args, out_dir: str):
    """One (mechanism, epsilon, repeat) pipeline -> its metric rows."""
    name, eps, repeat = cell
    cell_args = copy.copy(args)
    cell_args.mechanism, cell_args.epsilon = name, eps
    cell_args.seed = (args.seed or 0) + repeat
    cell_args.output = os.path.join(out_dir, "runs", f"{name}_eps{eps:g}_r{repeat}.jsonl")
    cell_args.query, cell_args.fanout = [], None
    cell_args.top = max(top_sets(args))        # KS-GRR/KS-Adap: candidates cover the largest set
    cell_args.lenient = True                 # a sweep mixes mechanisms: drop options one does not take
    out = simulate.execute(cell_args, beam_args)
    n_users = out["n_users"] or out["stats"].get("users_assembled") or args.users
    info = {"mechanism": name, "epsilon": eps, "repeat": repeat, "dataset": out["dataset"], "n_users": n_users}
    return score(out["records"], out["mechanism"], n_users, top_sets(args), info)


def top_sets(args) -> list[int]:
    return [int(t) for t in str(args.top_sets).split(",")]


def run(args, beam_args) -> dict:
    args = apply_preset(args)
    out_dir = Path(args.out)
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.csv"
    finished = done_cells(results)
    todo = [c for c in cells(args) if c not in finished]
    print(f"{len(finished)} cells done, {len(todo)} to run "
          f"({args.mechanisms} x eps {args.epsilons} x {args.repeats} repeats on {args.dataset})")
    new_file = not results.exists()
    with open(results, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=FIELDS)
        if new_file:
            writer.writeheader()
        if args.parallel > 1 and len(todo) > 1:
            ctx = multiprocessing.get_context("spawn")
            with futures.ProcessPoolExecutor(args.parallel, mp_context=ctx) as pool:
                jobs = [pool.submit(run_cell, c, args, beam_args, str(out_dir)) for c in todo]
                for job in tqdm(futures.as_completed(jobs), total=len(jobs), desc="cells", unit="run"):
                    writer.writerows(job.result())
                    fh.flush()
        else:
            for c in tqdm(todo, desc="cells", unit="run"):
                writer.writerows(run_cell(c, args, beam_args, str(out_dir)))
                fh.flush()
    pngs = figures.plot_results(results, out_dir)
    print(f"results: {results}")
    for png in pngs:
        print(f"figure: {png}")
    return {"results": str(results), "figures": [str(p) for p in pngs], "ran": len(todo)}

