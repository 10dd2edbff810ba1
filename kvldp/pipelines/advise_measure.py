"""``kvldp advise``'s measurement: each candidate run on the users, timed.

The closed forms (PCKV Theorem 4, KS-UE Theorem 4.2) say nothing of the
data's shape, of the OLH-based KS mechanisms, or of cost; so advise runs
every candidate on a population (a built-in dataset as it is, else a
pilot with the operator's ``d`` and set sizes: ``datasets/pilot.py``) in
this process with the numpy runner (client perturbation and collector
aggregation, one core) and measures:

* the MSE of frequency over the true top ``TOP`` keys and over all keys,
  a key without an estimate (KS-Adap's non-candidates) counting as 0, for
  the paper's estimator (``raw``) and after the post-processing;
* the wall time, and the users per second.

It projects both to ``n`` users (a pilot has ``n_p < n``): the paper's
unclipped estimator's error is a bias (truncation, a non-candidate) plus
noise whose variance, the estimates' own ``se²``, scales as ``1/n``, so
``MSE(n) = b² + mean(se²) n_p / n``, ``b²`` what the squared errors exceed
``se²`` by where that is significant; the time scales as ``n`` (all the
work is per user but the O(d) estimate). The clipped and post-processed
errors are the run's: their gain depends on ``n`` in no closed form.

The recommendation (``recommend``): among the candidates within a time
budget (``--max-seconds``), the smallest projected top-``TOP`` MSE; but
when that takes over a minute at ``n`` and a candidate within 2 s.e. of
its MSE (the pilot cannot tell them apart) takes half as long, that one.
"""
from __future__ import annotations

import math
import time

import numpy as np

from kvldp.mechanisms import registry
from kvldp.mechanisms.estimation import metrics
from kvldp.mechanisms.estimation.postprocess import RAW, postprocess_all
from kvldp.mechanisms.frequency.padding import kept_share
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.privacy.randomness import SimulationSeed
from kvldp.pipelines.sources import DataConfig

MEASURED = ("pckv-ue", "pckv-grr", "ks-ue", "ks-grr", "ks-adap")
TOP = 20       # the keys a reader looks at first: the recommendation is measured on them
MEASURE_SEED = 20260101
TIE_SE = 2.0   # projected MSEs this many s.e. apart or closer: the pilot cannot rank them
# Time decides between tied candidates only where it is worth having: the best
# takes over a minute at n (numpy runner, one core) and the tied one half as long.
MATERIAL_SECONDS = 60.0


def candidate(name: str, d: int, epsilon: float, l: int, set_sizes: np.ndarray | None):
    """Mechanism ``name`` as a collector would run it on these users: padding
    ``l`` where it pads, and the truncation correction's kept share where
    it takes one (KS-GRR samples one pair: ``l = 1``)."""
    takes = registry.options_of(name)
    options = {}
    if "padding" in takes:
        options["padding"] = l
    if "kept_share" in takes and set_sizes is not None:
        options["kept_share"] = kept_share(set_sizes, l if "padding" in takes else 1)
    return registry.make(name, d, epsilon, **options)


def projected_mse(estimate: np.ndarray, se: np.ndarray, truth: np.ndarray, keys, scale: float) -> tuple[float, float]:
    """``(MSE at n, its s.e.)`` of the unclipped estimates ``estimate`` over
    ``keys`` from one run at ``n_p`` users, ``scale = n_p / n``: the mean
    variance ``se²`` (the estimator's own, which the squared errors of 20
    keys only echo, at a relative s.e. of ~30 %) times ``scale``, plus the
    bias ``b²``: the mean of ``err² - se²`` less 2 of its s.e., at least 0.
    A key without an estimate (NaN) is read as 0: its error is exactly its
    frequency, all bias, at any n."""
    est, truth = np.asarray(estimate, float)[keys], np.asarray(truth, float)[keys]
    missing = ~np.isfinite(est)
    var = np.where(missing, 0.0, np.nan_to_num(np.asarray(se, float)[keys], nan=0.0, posinf=0.0) ** 2)
    excess = (np.where(missing, 0.0, est) - truth) ** 2 - var
    k, lost = len(excess), float(np.sum(truth[missing] ** 2))
    seen = excess[~missing]
    excess_se = float(seen.std(ddof=1)) * len(seen) ** 0.5 / k if len(seen) > 1 else 0.0
    bias2 = max(float(seen.sum()) / k - TIE_SE * excess_se, 0.0) + lost / k
    noise_se = float(var.std(ddof=1)) * scale / math.sqrt(k) if k > 1 else 0.0
    return bias2 + float(var.mean()) * scale, math.hypot(noise_se, excess_se if bias2 > lost / k else 0.0)


def measure(dataset, epsilon: float, l: int, method: str, n: int | None = None, set_sizes=None,
            seed: int = MEASURE_SEED, candidates=MEASURED) -> list[dict]:
    """One row per candidate: MSEs (raw and after ``method``) measured on
    ``dataset`` and projected to ``n`` users (default: the dataset's), and
    the wall time of the run, projected too. Each batch as large as the
    perturbation's memory budget allows (1 GiB, as every job)."""
    n = n or dataset.n_users
    scale = dataset.n_users / n
    out = []
    for name in candidates:
        mech = candidate(name, dataset.d, epsilon, l, set_sizes)
        batch = DataConfig().sized_for(mech, dataset.d).sized_batch
        start = time.perf_counter()
        result = run_local(mech, dataset, SimulationSeed(seed), batch)
        seconds = time.perf_counter() - start
        tf, tm = result.true_values(dataset.d)
        raw, done = postprocess_all(result.estimates, [RAW, method])
        top = metrics.top_keys(tf, TOP)
        held = np.flatnonzero(np.isfinite(raw.mean) & np.isfinite(tm))
        row = {"mechanism": name, "postprocess": method, "users": dataset.n_users, "n": n,
               "seconds": seconds, "users_per_s": dataset.n_users / seconds, "seconds_at_n": seconds / scale}
        row["mse_frequency_top_at_n"], row["mse_frequency_top_at_n_se"] = projected_mse(
            raw.frequency_raw, raw.frequency_se, tf, top, scale)
        row["mse_frequency_at_n"], _ = projected_mse(raw.frequency_raw, raw.frequency_se, tf, np.arange(dataset.d),
                                                     scale)
        for label, est in (("raw", raw), ("post", done)):
            f = np.nan_to_num(est.frequency, nan=0.0)
            row[f"mse_frequency_top_{label}"] = metrics.mse(f, tf, top)
            row[f"mse_frequency_{label}"] = metrics.mse(f, tf)
            row[f"mse_mean_{label}"] = metrics.mse(est.mean, tm, held)
            row[f"ncr20_{label}"] = metrics.ncr(tf, f, TOP)
        out.append(row)
    return out


def recommend(measured: list[dict], max_seconds: float | None = None) -> tuple[dict, str]:
    """``(row, reason)``: among the rows within ``max_seconds`` at ``n`` (all
    of them if none is), the one with the smallest projected top-``TOP``
    MSE -- or the fastest of those within ``TIE_SE`` s.e. of it, if that
    takes under half its time and it would take over ``MATERIAL_SECONDS``
    at ``n`` (a tie in error decides on time only where time matters)."""
    within = [r for r in measured if max_seconds is None or r["seconds_at_n"] <= max_seconds]
    budget = ""
    if max_seconds is not None:
        budget = (f"{len(within)} of {len(measured)} run within {max_seconds:g} s at n; " if within else
                  f"none runs within {max_seconds:g} s at n, so all are compared; ")
    pool = within or measured
    best = min(pool, key=lambda r: (r["mse_frequency_top_at_n"], r["mse_frequency_at_n"]))
    tied = [r for r in pool if r["mse_frequency_top_at_n"] - best["mse_frequency_top_at_n"]
            <= TIE_SE * math.hypot(r["mse_frequency_top_at_n_se"], best["mse_frequency_top_at_n_se"])]
    fastest = min(tied, key=lambda r: r["seconds_at_n"])
    saves = best["seconds_at_n"] > MATERIAL_SECONDS and fastest["seconds_at_n"] < best["seconds_at_n"] / 2
    pick = fastest if saves else best
    at = f"at n = {best['n']:,}" + ("" if best["n"] == best["users"] else f" (projected from {best['users']:,} users)")
    reason = (f"{budget}measured {at}: {best['mechanism']} has the smallest MSE of frequency over the top {TOP} "
              f"keys ({best['mse_frequency_top_at_n']:.3g} ± {best['mse_frequency_top_at_n_se']:.2g}, the "
              f"paper's estimator)")
    if pick is not best:
        others = ", ".join(r["mechanism"] for r in tied if r is not pick)
        reason += (f"; {pick['mechanism']} is within {TIE_SE:g} s.e. of it "
                   f"({pick['mse_frequency_top_at_n']:.3g} ± {pick['mse_frequency_top_at_n_se']:.2g}) and runs "
                   f"{best['seconds_at_n'] / pick['seconds_at_n']:.1f}x faster ({pick['seconds_at_n']:.3g} s against "
                   f"{best['seconds_at_n']:.3g} s; tied too: {others})")
    return pick, reason


def print_table(measured: list[dict], method: str, where: str, out=None):
    n, users = measured[0]["n"], measured[0]["users"]
    at = f"n = {n:,}" if n == users else f"n = {n:,}, projected from a run of {users:,}"
    print(f"measured on {where} (one run each, numpy runner on one core; MSE f over the top {TOP} keys and all "
          f"keys, a key without an estimate counted as 0; MSE m over the keys the paper estimates):", file=out)
    print(f"  {'':>9} {'top raw at n':>16} {'all raw at n':>13} {'top raw':>9} {'top ' + method:>16} "
          f"{'all raw':>9} {'all ' + method:>16} {'MSE m raw':>10} {'MSE m ' + method:>18} "
          f"{'NCR20 raw':>9} {'s at n':>9} {'users/s':>9}", file=out)
    for r in measured:
        print(f"  {r['mechanism']:>9} {r['mse_frequency_top_at_n']:>9.3g} ±{r['mse_frequency_top_at_n_se']:<6.2g}"
              f"{r['mse_frequency_at_n']:>13.3g} {r['mse_frequency_top_raw']:>9.3g} "
              f"{r['mse_frequency_top_post']:>16.3g} "
              f"{r['mse_frequency_raw']:>9.3g} {r['mse_frequency_post']:>16.3g} "
              f"{r['mse_mean_raw']:>10.3g} {r['mse_mean_post']:>18.3g} {r['ncr20_raw']:>9.2f} "
              f"{r['seconds_at_n']:>9.3g} {r['users_per_s']:>9.3g}", file=out)
    print(f"  ({at}; 'at n': the paper's estimator, its noise scaled to n; the other MSE columns are the run's)",
          file=out)
