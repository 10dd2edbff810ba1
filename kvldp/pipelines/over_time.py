"""``kvldp evaluate --collections T``: repeated collections over the same users.

Each cell is one (mechanism, eps_inf, mode, repeat) run through ``T``
collections, one "day" apart, on the pure-NumPy local runner. Before every
collection but the first, each user independently, with probability
``--churn``, takes new ratings: those of a user of the base dataset drawn
uniformly (its donor; the state may happen to stay the same, and the
effective churn -- the share whose state changed -- is recorded). Device ids
stay, so a device whose ratings did not change holds the same state.

Modes (``--modes``):

* ``fresh``: the base mechanism at ``eps`` drawn anew every collection (today's
  behaviour): each collection costs ``eps``;
* ``memoised``: the memoised single layer at ``eps_inf = eps``: a state costs
  ``eps_inf`` the first time it is reported, nothing after;
* ``two-layer``: memoised plus the instantaneous layer at ``--eps-1``: the same
  longitudinal cost, ``eps_1`` per report;
* ``fresh-eps1``: fresh perturbation at ``eps_1`` (the two-layer report's
  per-report guarantee, without its bound over time): ``eps_1`` per collection.

The cumulative privacy loss per user is what the perturbing side's ledger
charges (``ledger.SimulatedLedger``, the SQLite ledger's rule, vectorised):
``t eps`` for fresh perturbation, ``eps_inf`` per distinct state for the
memoised modes. (A tighter ``min(k eps_1, eps_inf)`` for ``k`` two-layer
reports of one state does not hold: the permanent layer correlates them,
and the exact audit finds two PCKV-GRR reports at ``(2, 0.5)`` losing 1.16
> 2 x 0.5.) With ``--period-budget`` a user over budget sits a collection
out and the estimate is over the users who reported.

Rows (``results.csv``): per collection, the MSE of frequency and mean over
all keys and the top-``t`` keys, clipped and raw (``score``; theory: the
derived variance of the raw estimate), the
mean and largest cumulative loss, the reporting users and the effective
churn. ``over_time.png``: per-collection MSE and cumulative loss by mode.
"""
from __future__ import annotations

import dataclasses
import hashlib

import numpy as np

from kvldp.datasets import InMemoryDataset
from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.estimation import metrics
from kvldp.mechanisms.kv.longitudinal import SUPPORTED, longitudinal
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.privacy.ledger import SimulatedLedger
from kvldp.mechanisms.privacy.memo import DeviceKeys
from kvldp.pipelines import sources
from kvldp.runtime import atomic

MODES = ("fresh", "memoised", "two-layer", "fresh-eps1")
NEEDS_EPS_1 = ("two-layer", "fresh-eps1")
DAY = 86400.0


def derived_seed(*parts) -> int:
    """A 128-bit seed from the run seed and a cell's coordinates."""
    text = "/".join(map(str, parts)).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=16, person=b"kvldp-over-time").digest(), "big")


def materialise(dataset, batch_size: int) -> UserBatch:
    """Every user of ``dataset`` in one batch (ids: their index)."""
    users = UserBatch.concat(list(dataset.batches(batch_size)))
    return users.with_ids(np.arange(users.n_users))


def state_hashes(users: UserBatch) -> np.ndarray:
    """64 bits per user naming its (key, value) set (to count real changes)."""
    order = np.lexsort((users.keys, users.owners))
    words = users.keys[order].astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15) ^ \
        np.rint(users.values[order] * (1 << 24)).astype(np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed = words * np.uint64(0xBF58476D1CE4E5B9) + np.arange(len(words), dtype=np.uint64) - \
            np.repeat(users.offsets[:-1], users.sizes).astype(np.uint64)
        out = np.zeros(users.n_users, dtype=np.uint64)
        np.add.at(out, users.owners[order], mixed ^ (mixed >> np.uint64(31)))
    return out ^ users.sizes.astype(np.uint64)


class Churn:
    """The users at every collection: user ``u`` holds the ratings of base
    user ``source[u]``; before collection ``t >= 1`` each user, w.p.
    ``churn``, takes a uniformly drawn donor's."""

    def __init__(self, base: UserBatch, churn: float, seed: int):
        self.base, self.churn, self.seed = base, churn, seed
        self.source = np.arange(base.n_users)
        self.hashes = state_hashes(base)

    def step(self, t: int) -> float:
        """Move to collection ``t``; returns the share of users whose state changed."""
        if t == 0 or self.churn == 0:
            return 0.0
        rng = np.random.default_rng([self.seed & ((1 << 64) - 1), t, 0xC4])
        n = self.base.n_users
        moving = np.flatnonzero(rng.random(n) < self.churn)
        before = self.hashes[self.source[moving]]
        self.source[moving] = rng.integers(0, n, size=len(moving))
        return float(np.sum(self.hashes[self.source[moving]] != before)) / n

    def users(self) -> UserBatch:
        """The users now: device ``u`` (id ``u``) with its source's ratings."""
        return self.base.take(self.source).with_ids(np.arange(self.base.n_users))


def mechanism_for(config, name: str, eps: float, mode: str, dataset, keys: DeviceKeys, t: int):
    """The cell's mechanism at collection ``t`` (perturbing side)."""
    lon = config.longitudinal
    if mode in NEEDS_EPS_1 and (lon is None or lon.eps_1 is None):
        raise ValueError(f"the {mode} mode needs --eps-1")
    if mode == "fresh-eps1":
        return config.template.for_cell(name, lon.eps_1).make(dataset.d, dataset)
    base = config.template.for_cell(name, eps).make(dataset.d, dataset)
    if mode == "fresh":
        return base
    if name not in SUPPORTED:
        raise ValueError(f"the {mode} mode is implemented for {', '.join(SUPPORTED)}, not {name}")
    eps_1 = lon.eps_1 if mode == "two-layer" else None
    layer = lon.second_layer if lon is not None else "symmetric"
    return longitudinal(base, eps_1, keys, collection=f"collection-{t}",
                        second_layer=layer if name in ("pckv-ue", "ks-ue") else "symmetric")


def run_cell(cell, config) -> list[dict]:
    """One (mechanism, eps, mode, repeat) through ``config.collections`` collections."""
    name, eps, mode, repeat = cell
    data = config.data
    seed = (data.seed or 0) + repeat
    dataset = sources.built_in_dataset(dataclasses.replace(data, seed=seed), seed)
    if dataset is None:
        raise ValueError("--collections runs built-in datasets only (synthetic-*, clothing, movielens-100k)")
    base = materialise(dataset, 50_000)
    keys = DeviceKeys.from_seed(derived_seed(seed, "devices"))
    churn = Churn(base, config.churn, derived_seed(seed, "churn"))
    ledger = SimulatedLedger(base.n_users, config.period_collections, config.period_budget)
    rows = []
    for t in range(config.collections):
        changed = churn.step(t)
        users = churn.users()
        mech = mechanism_for(config, name, eps, mode, dataset, keys, t)
        fps = mech.state_fingerprints(users) if mode in ("memoised", "two-layer") else None
        admitted = ledger.admit(t, mech.epsilon, fps)
        reporting = users.subset(admitted)
        info = {"mechanism": name, "epsilon": eps, "mode": mode, "repeat": repeat, "collection": t + 1,
                "dataset": dataset.name, "n_users": base.n_users}
        if reporting.n_users:            # else everyone sat this collection out: no estimate
            frame = InMemoryDataset(dataset.name, reporting, dataset.key_names, dataset.default_padding)
            batch = dataclasses.replace(data, batch_size=None).sized_for(mech, dataset.d).sized_batch
            result = run_local(mech, frame, derived_seed(seed, name, eps, mode, t), batch)
            f, m = result.true_values(dataset.d)
            theory = mech.theoretical_variance(reporting.n_users, f, m)
            rows += score(result.estimates, f, m, theory, config.top_sets, info)
        loss = ledger.cumulative()
        rows += [{**info, "metric": metric, "key_set": "users", "value": value, "theory": ""}
                 for metric, value in (("loss_mean", float(loss.mean())), ("loss_max", float(loss.max())),
                                       ("reporting", int(admitted.sum())), ("churn_effective", changed))]
    return rows


def score(est, f, m, theory, tops, info) -> list[dict]:
    """MSE rows of one collection: of the clipped estimates (``mse_frequency``,
    ``mse_mean``: what a user of the estimates gets) and of the raw ones
    (``…_raw``: unbiased, so their MSE is the derived variance). ``theory``
    is the derived variance of the *raw* estimate on both: where the noise is
    large against ``f`` (rare keys, small eps) clipping at 0 takes up to half
    of it away, so a clipped MSE sits below its theory line."""
    rows = []
    sets = [("all", np.arange(len(f)))] + [(f"top{t}", metrics.top_keys(f, t)) for t in tops]
    for label, keys in sets:
        held = keys[np.isfinite(m[keys])]
        for metric, values, truth, th, where in (("mse_frequency", est.frequency, f, 0, keys),
                                                 ("mse_mean", est.mean, m, 1, held),
                                                 ("mse_frequency_raw", est.frequency_raw, f, 0, keys),
                                                 ("mse_mean_raw", est.mean_raw, m, 1, held)):
            expected = "" if theory is None or theory[th] is None or not len(where) else \
                float(np.mean(np.asarray(theory[th])[where]))
            rows.append({**info, "metric": metric, "key_set": label, "value": metrics.mse(values, truth, where),
                         "theory": expected})
    return rows


# -- the sweep ------------------------------------------------------------------

FIELDS = ["mechanism", "epsilon", "mode", "repeat", "collection", "metric", "key_set", "value", "theory",
          "dataset", "n_users"]


def cell_name(cell) -> str:
    name, eps, mode, repeat = cell
    return f"{name}_eps{eps:g}_{mode}_r{repeat}"


def cells(config) -> list[tuple]:
    return [(m, e, mode, r) for m in config.mechanisms for e in config.epsilons for mode in config.modes
            for r in range(config.repeats)]


def cell_parameters(config, cell) -> dict:
    name, eps = cell[:2]
    return {"cell": cell, "data": config.data, "mechanism": config.template.for_cell(name, eps),
            "longitudinal": config.longitudinal, "collections": config.collections, "churn": config.churn,
            "period": config.period_collections, "budget": config.period_budget, "tops": config.top_sets}


def run_cell_task(config, cell) -> list[dict]:
    return run_cell(cell, config)


def run(config) -> dict:
    """Run the cells (resumable, as every evaluate sweep), write results.csv,
    over_time.png and a summary."""
    import functools
    from pathlib import Path

    from tqdm import tqdm

    from kvldp.pipelines import sweep
    from kvldp.plots import figures

    out_dir = Path(config.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    store = sweep.CellStore(out_dir, FIELDS)
    results = out_dir / "results.csv"
    fps = {cell: sweep.fingerprint(cell_parameters(config, cell)) for cell in cells(config)}
    wanted = [(cell_name(c), fp) for c, fp in fps.items()]
    todo = [c for c, fp in fps.items() if not store.done(cell_name(c), fp)]
    print(f"{len(fps) - len(todo)} cells done, {len(todo)} to run: {','.join(config.mechanisms)} x eps "
          f"{','.join(f'{e:g}' for e in config.epsilons)} x {','.join(config.modes)} x {config.repeats} repeats, "
          f"{config.collections} collections each, churn {config.churn:g}, on {config.data.dataset}")
    progress = tqdm(total=len(todo), desc="cells", unit="cell")

    def finished(cell, rows):
        store.write(cell_name(cell), fps[cell], rows)
        sweep.write_csv_atomically(results, FIELDS, store.rows(wanted))
        progress.update()

    try:
        sweep.run_cells(functools.partial(run_cell_task, config), todo, config.parallel, finished)
    except sweep.Interrupted as stop:
        progress.close()
        done = len(fps) - len(todo) + progress.n
        raise sweep.SweepInterrupted(f"stopped by {stop}: {done} of {len(fps)} cells are in {results}; rerun the "
                                     "same command to run the rest") from None
    progress.close()
    rows = list(store.rows(wanted))
    sweep.write_csv_atomically(results, FIELDS, rows)
    png = figures.plot_over_time(results, out_dir, config.top_sets[0], config.churn)
    text = summary(rows, config.top_sets[0])
    atomic.write_text(out_dir / "summary.md", text)
    print(text)
    print(f"results: {results}\nfigure: {png}")
    return {"results": str(results), "figures": [str(png)], "ran": len(todo), "summary": text}


def summary(rows: list[dict], top: int) -> str:
    """Markdown: per mechanism, eps and mode, the MSEs averaged over the
    collections and repeats, the cumulative loss after the last one, and the
    raw estimate's MSE over its derived variance (summed over collections)."""
    table: dict = {}
    last = max((int(r["collection"]) for r in rows), default=0)
    for r in rows:
        key = (r["mechanism"], float(r["epsilon"]), r["mode"])
        cell = table.setdefault(key, {"f": [], "m": [], "loss": [], "max": [], "report": [], "raw": [], "var": []})
        value = float(r["value"])
        if r["metric"] == "mse_frequency" and r["key_set"] == f"top{top}":
            cell["f"].append(value)
        elif r["metric"] == "mse_frequency_raw" and r["key_set"] == f"top{top}" and r["theory"] not in ("", None):
            cell["raw"].append(value)
            cell["var"].append(float(r["theory"]))
        elif r["metric"] == "mse_mean" and r["key_set"] == f"top{top}":
            cell["m"].append(value)
        elif r["metric"] in ("loss_mean", "loss_max") and int(r["collection"]) == last:
            cell["loss" if r["metric"] == "loss_mean" else "max"].append(value)
        elif r["metric"] == "reporting":
            cell["report"].append(value)
    out = [f"| mechanism | eps_inf | mode | MSE f (top {top}) | MSE m (top {top}) | loss after {last} (mean / max) "
           f"| reporting users (mean) | raw MSE f / derived variance (top {top}) |",
           "|---|---|---|---|---|---|---|---|"]
    for (mech, eps, mode), c in sorted(table.items(), key=lambda kv: (kv[0][0], kv[0][1], MODES.index(kv[0][2]))):
        ratio = f"{np.sum(c['raw']) / np.sum(c['var']):.3g}" if c["var"] else "–"
        out.append(f"| {mech} | {eps:g} | {mode} | {np.nanmean(c['f']):.3g} | {np.nanmean(c['m']):.3g} | "
                   f"{np.mean(c['loss']):.3g} / {np.max(c['max']):.3g} | {np.mean(c['report']):.0f} | {ratio} |")
    return "\n".join(out) + "\n"
