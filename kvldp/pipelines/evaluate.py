"""``kvldp evaluate``: sweep (mechanism, epsilon, repeat) cells as pipelines,
write a tidy ``results.csv`` and the papers' figures as PNGs.

Every cell is one ``simulate`` pipeline (any Beam runner through the usual
options) whose estimates are scored against the simulated truth: MSE of
frequency and mean over all keys and over the top-``t`` keys (with the
closed-form theory where the mechanism has one), NCR of the top-``t`` set
and the MSEs over the keys it found, and whether the standard errors mean
what they say: the coverage of ``raw estimate ± 1.96 s.e.`` over all keys, the
keys with s.e. 0, and the keys left null (not estimable) or without an s.e.
(null estimates are left out of the MSEs and counted apart). Cells run in
worker processes (``--parallel``); each finished cell is stored whole under
a fingerprint of its parameters (``sweep``), so a rerun with the same
``--out`` skips exactly the cells done with the same parameters, and
``results.csv`` holds the current sweep's cells only. SIGINT/SIGTERM stop
it within seconds, leaving no worker behind. ``--engine numpy`` runs each
cell on the pure-NumPy local runner instead of a Beam pipeline (the same
estimates for the same seed, several times faster; built-in datasets only).
``coverage.md`` tabulates the coverage per mechanism and epsilon.
"""
from __future__ import annotations

import argparse
import copy
import csv
import dataclasses
import functools
import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from kvldp.mechanisms import metrics, registry
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.longitudinal import LongitudinalOptions
from kvldp.pipelines import figures, mechanism_args, over_time, runner, simulate, sources, sweep, units
from kvldp.pipelines.graphs import to_records
from kvldp.pipelines.mechanism_args import MechanismConfig
from kvldp.pipelines.presets import PRESETS
from kvldp.pipelines.simulate import SimulateConfig
from kvldp.pipelines.sources import DataConfig

Z95 = 1.96
COVERAGE_METRICS = ("coverage", "scored", "se_zero", "null", "null_se")

FIELDS = ["mechanism", "epsilon", "repeat", "metric", "key_set", "value", "theory", "dataset", "n_users"]


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a paper's setup (overridable)")
    parser.add_argument("--mechanisms", default=None, help="comma-separated, e.g. pckv-ue,pckv-grr,privkvm-vi")
    parser.add_argument("--epsilons", default=None, help="comma-separated, e.g. 0.5,1,2,4,6")
    parser.add_argument("--repeats", type=sources.positive_int, default=None,
                        help="repeats per (mechanism, epsilon) (5)")
    parser.add_argument("--out", required=True, help="folder for results.csv, runs/ and the figures")
    parser.add_argument("--parallel", type=sources.positive_int, default=min(2, os.cpu_count() or 1),
                        help="cells run at once, each in its own process")
    parser.add_argument("--engine", choices=("beam", "numpy"), default="beam",
                        help="run each cell as a Beam pipeline (default) or on the pure-NumPy local runner "
                             "(same estimates, faster; built-in datasets only)")
    parser.add_argument("--top", "--top-sets", dest="top_sets", default=None,
                        help="top-t key sets to score, e.g. 20,50 (default 50); KS-GRR/KS-Adap use the largest as t")
    mechanism_args.add_mechanism_args(parser, single=False)
    mechanism_args.add_longitudinal_args(parser)
    over_time.add_arguments(parser)
    sources.add_dataset_args(parser)
    sources.add_fast_rng_arg(parser)
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


def _listed(text, kind=str) -> tuple:
    return tuple(kind(x.strip()) for x in str(text).split(",") if x.strip())


@dataclasses.dataclass(frozen=True)
class EvaluateConfig:
    """A sweep: every (mechanism, epsilon, repeat) cell over ``data``, scored
    on the top-``t`` sets of ``top_sets``. ``template`` holds the option
    flags; each cell's mechanism is ``template.for_cell(name, epsilon)``."""

    data: DataConfig
    template: MechanismConfig
    mechanisms: tuple[str, ...]
    epsilons: tuple[float, ...]
    repeats: int
    out: str
    top_sets: tuple[int, ...] = (50,)
    parallel: int = 1
    engine: str = "beam"
    # repeated collections (over_time.py): None runs the (mechanism, epsilon, repeat) sweep
    collections: int | None = None
    churn: float = 0.1
    modes: tuple[str, ...] = over_time.MODES
    longitudinal: LongitudinalOptions | None = None       # --eps-1, --second-layer of the modes
    period_budget: float | None = None
    period_collections: int | None = None

    def __post_init__(self):
        for name in self.mechanisms:
            registry.factory(name)                   # unknown names fail before anything runs
        if not self.mechanisms or not self.epsilons or not self.top_sets:
            raise ValueError("evaluate needs at least one mechanism, epsilon and top-t set")
        if self.engine not in ("beam", "numpy"):
            raise ValueError(f"--engine is beam or numpy, not {self.engine!r}")
        unknown = set(self.modes) - set(over_time.MODES)
        if unknown or not self.modes:
            raise ValueError(f"--modes are of {', '.join(over_time.MODES)}, got {', '.join(sorted(unknown))}")
        needs = set(self.modes) & set(over_time.NEEDS_EPS_1)
        if self.collections and needs and (self.longitudinal is None or self.longitudinal.eps_1 is None):
            raise ValueError(f"the {', '.join(sorted(needs))} mode(s) need --eps-1 (or leave them out of --modes)")

    @classmethod
    def from_args(cls, args) -> EvaluateConfig:
        """The command line, filled in by ``--preset`` and then the defaults."""
        args = apply_preset(args)
        try:
            mechanisms, epsilons = _listed(args.mechanisms), _listed(args.epsilons, float)
            top_sets = _listed(args.top_sets, int)
        except ValueError as err:
            raise ValueError(f"--epsilons and --top take comma-separated numbers: {err}") from None
        name, epsilon = mechanisms[0] if mechanisms else "pckv-ue", epsilons[0] if epsilons else 1.0
        if not getattr(args, "collections", None):
            template = MechanismConfig.from_args(args, name=name, epsilon=epsilon)
            return cls(DataConfig.from_args(args), template, mechanisms, epsilons, int(args.repeats), args.out,
                       top_sets, args.parallel, args.engine)
        # --collections T: the modes carry the longitudinal mode, so --eps-1/--second-layer come
        # without --longitudinal; every cell runs on the NumPy runner
        given = {f: getattr(args, f, None) for f in ("eps_1", "second_layer")}
        lon = LongitudinalOptions(longitudinal=True, **{k: v for k, v in given.items() if v is not None})
        plain = copy.copy(args)
        for f in LongitudinalOptions.field_names():
            setattr(plain, f, None)
        period = units.parse_duration(args.period or "30d") / over_time.DAY
        return cls(DataConfig.from_args(args), MechanismConfig.from_args(plain, name=name, epsilon=epsilon),
                   mechanisms, epsilons, int(args.repeats), args.out, top_sets, args.parallel, "numpy",
                   int(args.collections), 0.1 if args.churn is None else float(args.churn),
                   _listed(args.modes) if args.modes else over_time.MODES, lon, args.period_budget,
                   max(1, round(period)))

    def cells(self) -> list[tuple[str, float, int]]:
        return [(m, e, r) for m in self.mechanisms for e in self.epsilons for r in range(self.repeats)]

    def cell(self, cell, out_dir: str) -> SimulateConfig:
        """The simulation of one cell: its mechanism (the options it declares,
        KS's ``t`` from the largest top set), seed ``seed + repeat``, its own
        output file."""
        name, eps, repeat = cell
        return SimulateConfig(
            dataclasses.replace(self.data, seed=(self.data.seed or 0) + repeat),
            self.template.for_cell(name, eps, top=max(self.top_sets)),
            output=os.path.join(out_dir, "runs", f"{cell_name(cell)}.jsonl"))


def _column(records, field):
    return np.array([np.nan if r.get(field) is None else r[field] for r in records], dtype=float)


def score(records: list[dict], mechanism, n_users: int, tops, run_info) -> list[dict]:
    """Tidy metric rows of one run, with theory where the mechanism has one."""
    f, m = _column(records, "frequency"), _column(records, "mean")
    tf, tm = _column(records, "true_frequency"), _column(records, "true_mean")
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
    for what, est, truth in (("frequency", f, tf), ("mean", m, tm)):
        # the s.e. is the raw estimator's: its interval raw ± 1.96 s.e. holds
        # the truth iff its clip into the valid range does; the clipped point
        # estimate ± 1.96 s.e. covers more where clipping moved it to the truth
        se, raw = _column(records, f"{what}_se"), _column(records, f"{what}_raw")
        share, scored, zero = metrics.coverage(raw, se, truth, z=Z95)
        add(f"coverage_{what}", "all", share)
        add(f"coverage_clipped_{what}", "all", metrics.coverage(est, se, truth, z=Z95)[0])
        add(f"scored_{what}", "all", scored)
        add(f"se_zero_{what}", "all", zero)
        add(f"null_{what}", "all", metrics.null_count(est, truth))
        add(f"null_se_{what}", "all", int(np.sum(np.isfinite(truth) & np.isfinite(est) & ~np.isfinite(se))))
    return rows


def run_cell(cell, config: EvaluateConfig, beam_args, out_dir: str):
    """One (mechanism, epsilon, repeat) pipeline -> its metric rows."""
    name, eps, repeat = cell
    sim = config.cell(cell, out_dir)
    out = (run_numpy if config.engine == "numpy" else simulate.execute)(sim, beam_args)
    n_users = out["n_users"] or out["stats"].get("users_assembled") or config.data.users
    info = {"mechanism": name, "epsilon": eps, "repeat": repeat, "dataset": out["dataset"], "n_users": n_users}
    return score(out["records"], out["mechanism"], n_users, config.top_sets, info)


def run_numpy(config: SimulateConfig, beam_args) -> dict:
    """``simulate.execute`` on the pure-NumPy local runner: the same seeds,
    dataset, mechanism and records (not written to a file)."""
    data = config.data
    seeds = sources.Seeds.of(data)
    dataset = sources.built_in_dataset(data, seeds.data)
    if dataset is None:
        raise ValueError("--engine numpy runs built-in datasets only (synthetic-*, clothing, movielens-100k)")
    ioh_keys = mechanism_args.resolve_ioh_keys(config.mechanism, data, beam_args, dataset.key_names, dataset, None)
    mechanism = config.mechanism.make(dataset.d, dataset, ioh_keys)
    result = run_local(mechanism, dataset, seeds.perturb, data.sized_for(mechanism, dataset.d).sized_batch)
    records = to_records(result.estimates, dataset.key_names, result.truth, keys=mechanism.estimate_keys,
                         rating_range=data.rating_scale(dataset))
    return {"mechanism": mechanism, "dataset": dataset.name, "records": records, "n_users": dataset.n_users,
            "stats": {}}


def coverage_table(results_csv) -> str:
    """Markdown: per mechanism and epsilon, over the repeats, the coverage of
    ``raw ± 1.96 s.e.`` (in brackets: ``clipped ± 1.96 s.e.``), pooled over
    keys and repeats, for frequency and mean; the keys with s.e. 0 (summed
    over repeats); the null estimates and the estimates without s.e.
    (averaged per repeat)."""
    with open(results_csv, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["key_set"] == "all"]
    cells: dict = {}
    for r in rows:
        key = (r["dataset"], r["mechanism"], float(r["epsilon"]))
        cells.setdefault(key, {}).setdefault(r["metric"], []).append(float(r["value"]))
    out = ["| dataset | mechanism | eps | repeats | freq coverage (clipped) | mean coverage (clipped) "
           "| #s.e.=0 f/m (all repeats) | #null f/m (per run) | #no s.e. f/m (per run) |",
           "|---|---|---|---|---|---|---|---|---|"]

    def pooled(c, what, prefix="coverage_"):
        share, scored = c.get(f"{prefix}{what}", []), c.get(f"scored_{what}", [])
        hits = sum(s * k for s, k in zip(share, scored, strict=False) if k > 0)
        total = sum(k for k in scored if k > 0)
        return f"{hits / total:.3f}" if total else "–"

    def both(c, what):
        main, clipped = pooled(c, what), pooled(c, what, "coverage_clipped_")
        return main if main == "–" else f"{main} ({clipped})"

    def per_run(c, metric):
        vals = c.get(metric, [])
        return f"{np.mean(vals):.4g}" if vals else "–"

    for (dataset, mech, eps), c in sorted(cells.items()):
        if "coverage_frequency" not in c:
            continue
        reps = len(c["coverage_frequency"])
        zeros = f"{int(sum(c['se_zero_frequency']))}/{int(sum(c['se_zero_mean']))}"
        out.append(f"| {dataset} | {mech} | {eps:g} | {reps} | {both(c, 'frequency')} | {both(c, 'mean')} | "
                   f"{zeros} | {per_run(c, 'null_frequency')}/{per_run(c, 'null_mean')} | "
                   f"{per_run(c, 'null_se_frequency')}/{per_run(c, 'null_se_mean')} |")
    return "\n".join(out) + "\n"


def cell_parameters(config: EvaluateConfig, cell) -> dict:
    """Everything that shapes one cell's rows: its simulation (data,
    mechanism and options, seed) and how it is scored -- not where it is
    written or how many cells run at once."""
    sweep_wide = {"mechanisms", "epsilons", "repeats", "out", "parallel", "data", "template"}
    scoring = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in sweep_wide}
    return {"simulation": dataclasses.replace(config.cell(cell, ""), output=None), **scoring}


def cell_name(cell) -> str:
    name, eps, repeat = cell
    return f"{name}_eps{eps:g}_r{repeat}"


def run_cell_task(config: EvaluateConfig, beam_args, out_dir: str, cell) -> list[dict]:
    """A worker's cell: its rows, its scratch files removed when it ends
    (no progress lines: the sweep's own bar counts cells)."""
    os.environ.setdefault(runner.PROGRESS_ENV, "0")
    with runner.scratch_scope():
        return run_cell(cell, config, beam_args, out_dir)


def run(config: EvaluateConfig, beam_args) -> dict:
    if config.collections:
        return over_time.run(config)
    out_dir = Path(config.out)
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    store = sweep.CellStore(out_dir, FIELDS)
    results = out_dir / "results.csv"
    cells = {cell: sweep.fingerprint(cell_parameters(config, cell)) for cell in config.cells()}
    wanted = [(cell_name(c), fp) for c, fp in cells.items()]
    todo = [c for c, fp in cells.items() if not store.done(cell_name(c), fp)]
    others = store.others({store.path(*w) for w in wanted})
    print(f"{len(cells) - len(todo)} cells done, {len(todo)} to run ({','.join(config.mechanisms)} x eps "
          f"{','.join(f'{e:g}' for e in config.epsilons)} x {config.repeats} repeats on {config.data.dataset})"
          + (f"; {others} cells of other parameters in {store.directory} are left out" if others else ""))
    progress = tqdm(total=len(todo), desc="cells", unit="run")

    def finished(cell, rows):
        store.write(cell_name(cell), cells[cell], rows)
        sweep.write_csv_atomically(results, FIELDS, store.rows(wanted))
        progress.update()

    try:
        sweep.run_cells(functools.partial(run_cell_task, config, beam_args, str(out_dir)), todo,
                        config.parallel, finished)
    except sweep.Interrupted as stop:
        progress.close()
        done = sum(store.done(*w) for w in wanted)
        raise SweepInterrupted(f"stopped by {stop}: {done} of {len(cells)} cells are in {results}; "
                               "rerun the same command to run the rest") from None
    progress.close()
    sweep.write_csv_atomically(results, FIELDS, store.rows(wanted))
    pngs = figures.plot_results(results, out_dir)
    table = coverage_table(results)
    (out_dir / "coverage.md").write_text(table)
    print(table)
    print(f"results: {results}")
    for png in pngs:
        print(f"figure: {png}")
    return {"results": str(results), "figures": [str(p) for p in pngs], "ran": len(todo)}


class SweepInterrupted(KeyboardInterrupt):
    """An evaluate sweep stopped by a signal (the CLI exits 130 with its message)."""
