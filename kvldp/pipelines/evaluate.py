"""``kvldp evaluate``: sweep (mechanism, epsilon, repeat) cells as pipelines,
write a tidy ``results.csv`` and the papers' figures as PNGs.

Every cell is one ``simulate`` run (a Beam pipeline on any runner through
the usual options) whose estimates are post-processed by each of
``--postprocess`` (default ``raw`` and the default post-processing,
``kvldp.mechanisms.estimation.postprocess``) and scored against the simulated truth:
MSE of frequency and mean over all keys and over the top-``t`` keys (with
the closed-form theory of the paper's estimator where the mechanism has
one), NCR of the top-``t`` set and the MSEs over the keys it found, and
whether the error bars mean what they say: the coverage of the 95 %
intervals ``[*_lo, *_hi]`` over all keys and over the keys with true
frequency ``>= 1/d``, the keys without an interval, the keys with s.e. 0
and the keys left null. The MSE of the mean is taken over the keys whose
paper (raw) mean is not null, for every post-processing, so the numbers
compare; null estimates are left out and counted apart. Cells run in
worker processes (``--parallel``); each finished (cell, post-processing)
pair is stored whole under a fingerprint of its parameters (``sweep``), so
a rerun with the same ``--out`` runs exactly the pairs not done with the
same parameters, and ``results.csv`` holds the current sweep's pairs only.
SIGINT/SIGTERM stop it within seconds, leaving no worker behind.
``--engine numpy`` runs each cell on the pure-NumPy local runner instead of
a Beam pipeline (the same estimates for the same seed, several times
faster; built-in datasets only; one run serves every post-processing, where
the Beam engine runs one pipeline per post-processing over the same
reports). ``coverage.md`` tabulates the coverage and ``postprocess.md`` the
gain of each post-processing over ``raw`` per mechanism and epsilon.
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import io
import os
from pathlib import Path

import numpy as np
from tqdm import tqdm

from kvldp.cli import units
from kvldp.mechanisms import registry
from kvldp.mechanisms.estimation import metrics
from kvldp.mechanisms.estimation.postprocess import DEFAULT as DEFAULT_POSTPROCESS
from kvldp.mechanisms.estimation.postprocess import RAW, postprocess_all
from kvldp.mechanisms.kv.longitudinal import LongitudinalOptions
from kvldp.mechanisms.local import run_local
from kvldp.pipelines import evaluate_tables as tables
from kvldp.pipelines import mechanism_config, over_time, simulate, sources, sweep
from kvldp.pipelines.graphs import to_records
from kvldp.pipelines.mechanism_config import MechanismConfig
from kvldp.pipelines.padding import resolve_padding
from kvldp.pipelines.postprocessing import postprocess_list
from kvldp.pipelines.presets import PRESETS
from kvldp.pipelines.simulate import SimulateConfig
from kvldp.pipelines.sources import DataConfig
from kvldp.plots import figures
from kvldp.plots.tables import column
from kvldp.runtime import atomic
from kvldp.runtime import jobs as runner

COVERAGE_METRICS = ("coverage", "scored", "no_interval", "se_zero", "null")

FIELDS = ["mechanism", "epsilon", "repeat", "postprocess", "metric", "key_set", "value", "theory", "dataset",
          "n_users"]


DEFAULTS = {"users": 1_000_000, "keys": 100, "dataset": "synthetic-uu", "mechanisms": "pckv-ue,pckv-grr",
            "epsilons": "1,2,4", "repeats": 5, "top_sets": "50", "postprocess": (RAW, DEFAULT_POSTPROCESS.name)}


def apply_preset(args):
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
    postprocess: tuple[str, ...] = (RAW, DEFAULT_POSTPROCESS.name)
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
        if not self.mechanisms or not self.epsilons or not self.top_sets or not self.postprocess:
            raise ValueError("evaluate needs at least one mechanism, epsilon, top-t set and post-processing")
        if self.engine not in ("beam", "numpy"):
            raise ValueError(f"--engine is beam or numpy, not {self.engine!r}")
        object.__setattr__(self, "postprocess", postprocess_list(",".join(self.postprocess)))
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
                       top_sets, args.parallel, args.engine, postprocess=tuple(args.postprocess))
        # --collections T: the modes carry the longitudinal mode, so --eps-1/--second-layer come
        # without --longitudinal; every cell runs on the NumPy runner and scores the paper's
        # estimators (over_time.py has no post-processing)
        given = {f: getattr(args, f, None) for f in ("eps_1", "second_layer")}
        lon = LongitudinalOptions(longitudinal=True, **{k: v for k, v in given.items() if v is not None})
        plain = copy.copy(args)
        for f in LongitudinalOptions.field_names():
            setattr(plain, f, None)
        period = units.parse_duration(args.period or "30d") / over_time.DAY
        return cls(DataConfig.from_args(args), MechanismConfig.from_args(plain, name=name, epsilon=epsilon),
                   mechanisms, epsilons, int(args.repeats), args.out, top_sets, args.parallel, "numpy",
                   postprocess=(RAW,), collections=int(args.collections),
                   churn=0.1 if args.churn is None else float(args.churn),
                   modes=_listed(args.modes) if args.modes else over_time.MODES, longitudinal=lon,
                   period_budget=args.period_budget, period_collections=max(1, round(period)))

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
            output=os.path.join(out_dir, "runs", f"{cell_name(cell)}.jsonl"),
            overwrite=True)      # the sweep's own run files: a rerun of a cell replaces a killed run's


def score(records: list[dict], mechanism, n_users: int, tops, run_info, paper: list[dict] | None = None) -> list[dict]:
    """Tidy metric rows of one run post-processed one way (``records``), with
    the paper's closed-form theory for ``raw``. ``paper``: the same run's
    raw records, whose non-null means define the keys the MSE of the mean is
    taken over (default ``records``)."""
    f, m = column(records, "frequency"), column(records, "mean")
    tf, tm = column(records, "true_frequency"), column(records, "true_mean")
    paper_mean = column(paper if paper is not None else records, "mean")
    is_raw = run_info.get("postprocess", RAW) == RAW
    theory = mechanism.theoretical_variance(n_users, tf, tm) if n_users and is_raw else None
    rows = []

    def add(metric, key_set, value, th=None):
        rows.append({"metric": metric, "key_set": key_set, "value": value,
                     "theory": "" if th is None or not np.isfinite(th) else th, **run_info})

    sets = [("all", np.arange(len(records)))] + [(f"top{t}", metrics.top_keys(tf, t)) for t in tops]
    for label, keys in sets:
        held = keys[np.isfinite(tm[keys]) & np.isfinite(paper_mean[keys])]
        add("mse_frequency", label, metrics.mse(f, tf, keys),
            None if theory is None else float(np.mean(theory[0][keys])))
        add("mse_mean", label, metrics.mse(m, tm, held),
            None if theory is None or not len(held) else float(np.mean(theory[1][held])))
    for t in tops:
        found = metrics.top_t_intersection(tf, f, t)
        add("ncr", f"top{t}", metrics.ncr(tf, f, t))
        add("mse_frequency_found", f"top{t}", metrics.mse(f, tf, found))
        add("mse_mean_found", f"top{t}", metrics.mse(m, tm, found))
    frequent = np.flatnonzero(tf >= 1.0 / max(len(records), 1))
    for what, est, truth in (("frequency", f, tf), ("mean", m, tm)):
        lo, hi = column(records, f"{what}_lo"), column(records, f"{what}_hi")
        se = column(records, f"{what}_se")
        for label, keys in (("all", np.arange(len(records))), (tables.FREQUENT, frequent)):
            share, scored = metrics.interval_coverage(lo, hi, truth, keys)
            given = keys[np.isfinite(truth[keys]) & np.isfinite(est[keys])]
            add(f"coverage_{what}", label, share)
            add(f"scored_{what}", label, scored)
            add(f"no_interval_{what}", label, int(np.sum(~(np.isfinite(lo[given]) & np.isfinite(hi[given])))))
        add(f"se_zero_{what}", "all", int(np.sum(se == 0)))
        add(f"null_{what}", "all", metrics.null_count(est, truth))
        for status, count in metrics.null_statuses(est, statuses(records, f"{what}_status")).items():
            add(f"null_{what}_by_status", status, count)
    # the frequency mass: pairs per user, estimated (null keys count 0) against the truth
    add("total_frequency", "all", float(np.nansum(f)))
    # ... and as the reports measure it (estimate.avsc's frequency_total: the paper's raw sum, or PCKV's, KS-UE's
    # and KS-GRR's total from reports the keys' estimates do not use), the same in every record
    for metric, field in (("measured_total_frequency", "frequency_total"),
                          ("measured_total_frequency_se", "frequency_total_se")):
        add(metric, "all", float(column(records, field)[0]) if len(records) else float("nan"))
    add("true_total_frequency", "all", float(np.nansum(tf)))
    add("true_total_frequency", "estimated", float(np.nansum(np.where(np.isfinite(f), tf, 0.0))))
    return rows


def statuses(records, field: str) -> np.ndarray:
    """A status field of estimate records as an object array (``ok`` where absent)."""
    values = records.column(field) if hasattr(records, "column") else [r.get(field) for r in records]
    return np.array([v or "ok" for v in values], dtype=object)


def run_cell(cell, config: EvaluateConfig, beam_args, out_dir: str, methods=None):
    """One (mechanism, epsilon, repeat) run -> its metric rows, for each
    post-processing of ``methods`` (default ``config.postprocess``)."""
    name, eps, repeat = cell
    methods = tuple(methods or config.postprocess)
    sim = config.cell(cell, out_dir)
    if config.engine == "numpy":
        out = run_numpy(sim, beam_args, (RAW, *methods))
    else:
        out, stem = None, sim.output[:-len(".jsonl")]
        for method in dict.fromkeys((RAW, *methods)):
            run = simulate.execute(dataclasses.replace(sim, postprocess=method,
                                                       output=f"{stem}_{method.replace('+', '-')}.jsonl"), beam_args)
            out = out or {**run, "records_by_method": {}}
            out["records_by_method"][method] = run["records"]
    n_users = out["n_users"] or out["stats"].get("users_assembled") or config.data.users
    rows = []
    for method in methods:
        info = {"mechanism": name, "epsilon": eps, "repeat": repeat, "postprocess": method,
                "dataset": out["dataset"], "n_users": n_users}
        rows += score(out["records_by_method"][method], out["mechanism"], n_users, config.top_sets, info,
                      out["records_by_method"][RAW])
    return rows


def run_numpy(config: SimulateConfig, beam_args, methods=None) -> dict:
    """``simulate.execute`` on the pure-NumPy local runner: the same seeds,
    dataset, mechanism and records (not written to a file), post-processed
    by each of ``methods`` (default the config's) from the one run."""
    data = config.data
    seeds = sources.Seeds.of(data)
    dataset = sources.built_in_dataset(data, seeds.data)
    if dataset is None:
        raise ValueError("--engine numpy runs built-in datasets only (synthetic-*, clothing, movielens-100k)")
    ioh_keys = mechanism_config.resolve_ioh_keys(config.mechanism, data, beam_args, dataset.key_names, dataset, None)
    padding = resolve_padding(config.mechanism, data, beam_args, dataset, None, out=io.StringIO())  # 'auto' -> l
    mechanism = config.mechanism.make(dataset.d, dataset, ioh_keys, padding=padding.l, kept_share=padding.kept_share)
    result = run_local(mechanism, dataset, seeds.perturb, data.sized_for(mechanism, dataset.d).sized_batch)
    methods = tuple(dict.fromkeys(methods or (config.postprocess,)))
    by_method = {method: to_records(est, dataset.key_names, result.truth, keys=mechanism.estimate_keys,
                                    rating_range=data.rating_scale(dataset))
                 for method, est in zip(methods, postprocess_all(result.estimates, methods), strict=True)}
    return {"mechanism": mechanism, "dataset": dataset.name, "records": by_method[methods[0]],
            "records_by_method": by_method, "n_users": dataset.n_users, "stats": {}}


def cell_parameters(config: EvaluateConfig, cell, method: str) -> dict:
    """Everything that shapes the rows of one cell post-processed by
    ``method``: its simulation (data, mechanism and options, seed), the
    post-processing and how it is scored -- not where it is written, how
    many cells run at once or which other post-processings are scored."""
    sweep_wide = {"mechanisms", "epsilons", "repeats", "out", "parallel", "data", "template", "postprocess"}
    scoring = {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in sweep_wide}
    return {"simulation": dataclasses.replace(config.cell(cell, ""), output=None), "postprocess": method,
            **scoring}


def cell_name(cell) -> str:
    name, eps, repeat = cell
    return f"{name}_eps{eps:g}_r{repeat}"


def pair_name(cell, method: str) -> str:
    """The cell store's name of a (cell, post-processing) pair."""
    return f"{cell_name(cell)}_{method.replace('+', '-')}"


def run_cell_task(config: EvaluateConfig, beam_args, out_dir: str, task) -> list[dict]:
    """A worker's task, ``(cell, post-processings)``: its rows, its scratch
    files removed when it ends (no progress lines: the sweep's own bar
    counts cells)."""
    cell, methods = task
    os.environ.setdefault(runner.PROGRESS_ENV, "0")
    with runner.scratch_scope():
        return run_cell(cell, config, beam_args, out_dir, methods)


def run(config: EvaluateConfig, beam_args) -> dict:
    if config.collections:
        return over_time.run(config)
    out_dir = Path(config.out)
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    store = sweep.CellStore(out_dir, FIELDS)
    results = out_dir / "results.csv"
    # the rows so far, after each cell: under a name that says so, so an interrupted or killed sweep never
    # leaves a results.csv that looks complete (issue 42); results.csv is written once every pair is in
    progress_rows = out_dir / "results.partial.csv"
    pairs = {(cell, method): sweep.fingerprint(cell_parameters(config, cell, method))
             for cell in config.cells() for method in config.postprocess}
    wanted = [(pair_name(*pair), fp) for pair, fp in pairs.items()]
    todo = {}
    for (cell, method), fp in pairs.items():
        if not store.done(pair_name(cell, method), fp):
            todo.setdefault(cell, []).append(method)
    tasks = [(cell, tuple(methods)) for cell, methods in todo.items()]
    others = store.others({store.path(*w) for w in wanted})
    n_cells = len(config.cells())
    print(f"{n_cells - len(tasks)} cells done, {len(tasks)} to run ({','.join(config.mechanisms)} x eps "
          f"{','.join(f'{e:g}' for e in config.epsilons)} x {config.repeats} repeats on {config.data.dataset}; "
          f"post-processing {','.join(config.postprocess)}: {sum(map(len, todo.values()))} of {len(pairs)} "
          "(cell, post-processing) pairs to score)"
          + (f"; {others} (cell, post-processing) pairs of other parameters in {store.directory} are left out"
             if others else ""))
    progress = tqdm(total=len(tasks), desc="cells", unit="run")

    def finished(task, rows):
        cell, methods = task
        for method in methods:
            store.write(pair_name(cell, method), pairs[(cell, method)], [r for r in rows if r["postprocess"] == method])
        sweep.write_csv_atomically(progress_rows, FIELDS, store.rows(wanted))
        progress.update()

    try:
        sweep.run_cells(functools.partial(run_cell_task, config, beam_args, str(out_dir)), tasks,
                        config.parallel, finished)
    except sweep.Interrupted as stop:
        done = sum(store.done(*w) for w in wanted)
        raise sweep.SweepInterrupted(f"stopped by {stop}: {done} of {len(pairs)} (cell, post-processing) pairs are in "
                               f"{progress_rows}; rerun the same command to run the rest") from None
    finally:
        progress.close()             # ends the bar's line, also before a stop's or a failure's one line
    sweep.write_csv_atomically(results, FIELDS, store.rows(wanted))
    progress_rows.unlink(missing_ok=True)
    pngs = figures.plot_results(results, out_dir)          # (atomic writes: a full disk names the file)
    table = tables.coverage_table(results)
    atomic.write_text(out_dir / "coverage.md", table)
    gains = tables.gain_table(results)
    atomic.write_text(out_dir / "postprocess.md", gains)
    defaults = tables.defaults_table(results)
    atomic.write_text(out_dir / "defaults.md", defaults)
    print(gains)
    print(table)
    print(defaults)
    print(f"results: {results}")
    for png in pngs:
        print(f"figure: {png}")
    return {"results": str(results), "figures": [str(p) for p in pngs], "ran": len(todo)}
