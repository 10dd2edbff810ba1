"""``kvldp advise``: which mechanism for n users, d keys, epsilon, and which l.

The rule of Gu et al. (PCKV §5.3): for frequencies PCKV-UE beats PCKV-GRR
when ``2(d - 1) > l(4l - 1)(e^eps + 1)``; PCKV-UE's error does not grow with
``d``, PCKV-GRR's does. Next to the rule, the closed-form variances
(Theorem 4; KS-UE Theorem 4.2) of every mechanism that has one, and the
standard errors to expect for a key of frequency ``f`` and mean ``m``.

Post-processing (``kvldp.mechanisms.estimation.postprocess``) changes the errors a
collector gets, and by how much depends on the data (how the frequencies
and means spread over the keys), so no closed form predicts it. With a
built-in dataset (``--dataset``), advise therefore runs every candidate
once on it (the local runner, a fixed seed) and measures the mean squared
errors of frequency over the top 20 keys and over all keys, before and
after ``--postprocess`` (default the collector's default); the
recommendation is then the candidate whose own estimates (before
post-processing, which on sparse data pulls every candidate to nearly the
same pool) err least on the top 20 keys (the closed-form rule is still
printed). Without data the closed forms are about the paper's estimators:
what post-processing adds is an upper bound's worth of improvement only.

The padding length ``l``: given the users' set sizes (``--set-sizes``, or
measured from a dataset or ratings file with simulate's flags), advise
chooses ``l`` by KSKV §4.3's coverage rule (``mechanisms/frequency/padding.py``: the
smallest ``l`` with at least 90 % of the users holding ``<= l`` pairs) and
shows what each ``l`` costs: the share of users it truncates (their
frequencies come out times ``l/|S|``) against the standard error, which
grows with ``l``. An explicit ``--padding`` is checked the same way.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from kvldp.mechanisms import registry
from kvldp.mechanisms.estimation import metrics
from kvldp.mechanisms.estimation.postprocess import DEFAULT as DEFAULT_POSTPROCESS
from kvldp.mechanisms.estimation.postprocess import RAW, postprocess_all
from kvldp.mechanisms.frequency.padding import (
    DEFAULT_COVERAGE,
    MAX_PADDING,
    check_padding,
    choose_padding,
)
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.privacy.randomness import SimulationSeed
from kvldp.pipelines import mechanism_config, sources
from kvldp.pipelines.padding import (
    data_set_sizes,
    describe_sizes,
    parse_set_sizes,
    warn_truncation,
)
from kvldp.pipelines.sources import DataConfig

CANDIDATES = ("pckv-ue", "pckv-grr", "ks-ue")


def pckv_prefers_ue(d: int, epsilon: float, l: int) -> bool:
    """PCKV's rule: UE is better for frequency when ``2(d-1) > l(4l-1)(e^eps+1)``."""
    return 2 * (d - 1) > l * (4 * l - 1) * (math.exp(epsilon) + 1)


def compare(n: int, d: int, epsilon: float, l: int, f: float, m: float) -> list[dict]:
    out = []
    for name in CANDIDATES:
        mech = registry.make(name, d, epsilon, padding=l)
        var_f, var_m = mech.theoretical_variance(n, np.array([f]), np.array([m]))
        out.append({"mechanism": name, "frequency_se": float(np.sqrt(var_f[0])),
                    "mean_se": float(np.sqrt(var_m[0]))})
    return out


def choose_l(l, set_sizes, coverage: float = DEFAULT_COVERAGE) -> tuple[int, bool]:
    """``(l, chosen)``: an explicit ``l`` as given; ``None`` or ``auto``: the
    coverage rule on ``set_sizes`` (1 without them; ``auto`` needs them)."""
    if l is None or l == mechanism_config.AUTO_PADDING:
        if set_sizes is not None:
            return choose_padding(set_sizes, coverage), True
        if l == mechanism_config.AUTO_PADDING:
            raise ValueError("--padding auto needs the set sizes: --set-sizes or --dataset")
        return 1, False
    return int(l), False


def advise(n: int, d: int, epsilon: float, l=None, f: float | None = None, m: float = 0.0,
           set_sizes=None, coverage: float = DEFAULT_COVERAGE) -> dict:
    """The recommendation for ``n`` users, ``d`` keys and ``epsilon``.

    ``l``: the padding (``None`` or ``auto``: chosen from ``set_sizes``, the
    users' set-size histogram, else 1). With ``set_sizes`` the result has a
    ``padding`` entry: the truncation at ``l`` (``PaddingCheck``) and a
    ``padding_table`` of (l, truncated share, lost pair mass, frequency s.e.
    of the recommended mechanism) for the ``l`` around the choice."""
    l, chosen = choose_l(l, set_sizes, coverage)
    if n < 1 or d < 1 or l < 1:
        raise ValueError("need n >= 1, d >= 1 and l >= 1")
    f = 1.0 / d if f is None else f
    rows = compare(n, d, epsilon, l, f, m)
    ue = pckv_prefers_ue(d, epsilon, l)
    choice = "pckv-ue" if ue else "pckv-grr"
    reason = (f"PCKV rule: 2(d-1) = {2 * (d - 1)} {'>' if ue else '<='} l(4l-1)(e^eps+1) = "
              f"{l * (4 * l - 1) * (math.exp(epsilon) + 1):.1f}, so {choice} estimates frequencies better")
    by_name = {r["mechanism"]: r for r in rows}
    if by_name["ks-ue"]["frequency_se"] < by_name[choice]["frequency_se"]:
        gain = 1 - by_name["ks-ue"]["frequency_se"] / by_name[choice]["frequency_se"]
        reason += (f"; KS-UE (Zhao et al. 2024) tilts the budget to the key and lowers the frequency "
                   f"s.e. by a further {gain:.0%}, at some cost to the mean")
    out = {"recommendation": choice, "reason": reason, "candidates": rows, "f": f, "m": m,
           "l": l, "l_chosen": chosen, "padding": None, "padding_table": []}
    if set_sizes is not None:
        out["padding"] = dataclasses.asdict(check_padding(set_sizes, l, coverage))
        out["padding_table"] = padding_table(choice, n, d, epsilon, l, f, m, set_sizes, coverage)
    return out


def padding_table(name: str, n: int, d: int, epsilon: float, l: int, f: float, m: float, set_sizes,
                  coverage: float) -> list[dict]:
    """For each ``l`` around the choice: the share of users it truncates, the
    pair mass lost, and mechanism ``name``'s frequency s.e. at that ``l``."""
    rows = []
    for k in range(1, min(max(l, check_padding(set_sizes, l, coverage).suggested, 2) + 1, MAX_PADDING) + 1):
        var_f, _ = registry.make(name, d, epsilon, padding=k).theoretical_variance(n, np.array([f]), np.array([m]))
        at = check_padding(set_sizes, k, coverage)
        rows.append({"l": k, "truncated": at.truncated_fraction, "lost_pairs": at.lost_pair_fraction,
                     "frequency_se": float(np.sqrt(var_f[0])), "mechanism": name})
    return rows


MEASURE_SEED = 20260101


TOP = 20       # the keys a reader looks at first: the recommendation is measured on them


def measure_candidates(dataset, epsilon: float, l: int, method: str = DEFAULT_POSTPROCESS.name,
                       seed: int = MEASURE_SEED) -> list[dict]:
    """Each candidate run once on ``dataset`` (local runner, fast noise):
    the MSE of frequency over the top ``TOP`` keys and over all keys, the
    MSE of the mean and the NCR of the top ``TOP``, for the paper's
    estimator (``raw``) and after ``method``. The MSE of the mean is over
    the keys the paper's estimator gives a mean for (both). Each batch as
    large as the perturbation's memory budget allows (1 GiB, as every job:
    a UE report over Clothing's 5,850 items is 11.7 KB)."""
    out = []
    for name in CANDIDATES:
        mech = registry.make(name, dataset.d, epsilon, padding=l)
        batch = DataConfig().sized_for(mech, dataset.d).sized_batch
        result = run_local(mech, dataset, SimulationSeed(seed), batch)
        tf, tm = result.true_values(dataset.d)
        raw, done = postprocess_all(result.estimates, [RAW, method])
        held = np.flatnonzero(np.isfinite(raw.mean) & np.isfinite(tm))
        top = metrics.top_keys(tf, TOP)
        row = {"mechanism": name, "postprocess": method}
        for label, est in (("raw", raw), ("post", done)):
            row[f"mse_frequency_top_{label}"] = metrics.mse(est.frequency, tf, top)
            row[f"mse_frequency_{label}"] = metrics.mse(est.frequency, tf)
            row[f"mse_mean_{label}"] = metrics.mse(est.mean, tm, held)
            row[f"ncr20_{label}"] = metrics.ncr(tf, est.frequency, TOP)
        out.append(row)
    return out


def recommend_measured(out: dict, measured: list[dict]) -> dict:
    """``out`` with the recommendation measured on the data: the smallest
    MSE of the mechanism's own frequency estimates over the top ``TOP``
    keys, then over all keys (the paper's rule kept as
    ``rule_recommendation``). Not the post-processed error: on sparse data
    the default shrinkage pulls every mechanism's estimates to nearly the
    same pool (Clothing, 3,000 users: 1.16e-4, 1.17e-4, 1.17e-4 over the top
    20 for MSEs of 1.4e-4, 2.2e-3, 9.4e-5 before it), and over all keys a
    shrinkage that pulls every small key to 0 wins however wrong the keys a
    reader looks at are. The post-processed errors are shown beside."""
    best = min(measured, key=lambda r: (r["mse_frequency_top_raw"], r["mse_frequency_raw"]))
    reason = (f"measured on the data: {best['mechanism']} has the smallest MSE of frequency over the top {TOP} "
              f"keys ({best['mse_frequency_top_raw']:.3g} for the paper's estimator, "
              f"{best['mse_frequency_top_post']:.3g} after {best['postprocess']}); the paper's rule says "
              f"{out['recommendation']}")
    return {**out, "rule_recommendation": out["recommendation"], "rule_reason": out["reason"],
            "recommendation": best["mechanism"], "reason": reason, "measured": measured}


@dataclasses.dataclass(frozen=True)
class AdviseConfig:
    """What to advise on: ``epsilon``; ``n`` and ``d`` as ``users``/``keys``,
    or measured from ``data`` (a dataset or ratings file); the set sizes as
    given (``set_sizes``) or measured; the padding to check (``None``/``auto``:
    chosen); the key's ``frequency`` (None: 1/d) and ``mean``."""

    epsilon: float
    users: int | None = None
    keys: int | None = None
    data: DataConfig | None = None
    set_sizes: np.ndarray | None = None
    padding: int | str | None = None
    coverage: float = DEFAULT_COVERAGE
    frequency: float | None = None
    mean: float = 0.0
    postprocess: str = DEFAULT_POSTPROCESS.name

    def __post_init__(self):
        if self.set_sizes is not None and self.data is not None:
            raise ValueError("give --set-sizes or --dataset, not both")

    @classmethod
    def from_args(cls, args) -> AdviseConfig:
        data = DataConfig.from_args(args, users=args.users or 1_000_000, keys=args.keys or 100) \
            if args.dataset else None
        sizes = parse_set_sizes(args.set_sizes) if args.set_sizes else None
        return cls(args.epsilon, args.users, args.keys, data, sizes, args.padding, args.coverage,
                   args.frequency, args.mean, args.postprocess)


def measure(data: DataConfig, beam_args) -> tuple[int, int, np.ndarray]:
    """``(n, d, set-size histogram)`` of the dataset (ingest side: raw data)."""
    dataset = sources.built_in_dataset(data, sources.Seeds.from_arg(data.seed).data)
    if dataset is not None:
        return dataset.n_users, dataset.d, data_set_sizes(data, beam_args, dataset, None)
    dictionary, hist = sources.key_dictionary_and_sizes(data, beam_args)
    if hist is None:
        hist = data_set_sizes(data, beam_args, None, dictionary)
    return int(hist.sum()), len(dictionary), hist


def run(config: AdviseConfig, beam_args) -> dict:
    hist = config.set_sizes
    n, d = config.users, config.keys
    if hist is not None:
        n = n or int(hist.sum())
    elif config.data is not None:
        n, d, hist = measure(config.data, beam_args)
    if n is None or d is None:
        raise ValueError("advise needs --users and --keys (or --dataset to measure them)")
    out = advise(n, d, config.epsilon, config.padding, config.frequency, config.mean, hist, config.coverage)
    l = out["l"]
    dataset = (sources.built_in_dataset(config.data, sources.Seeds.from_arg(config.data.seed).data)
               if config.data is not None else None)
    if dataset is not None:
        out = recommend_measured(out, measure_candidates(dataset, config.epsilon, l, config.postprocess))
        if hist is not None:      # the padding table is the recommended mechanism's
            out["padding_table"] = padding_table(out["recommendation"], n, d, config.epsilon, l, out["f"], out["m"],
                                                 hist, config.coverage)
    print(f"recommended: {out['recommendation']}")
    print(f"  {out['reason']}")
    if out.get("measured"):
        method = config.postprocess
        print(f"measured on {dataset.name} (one run each; MSE f over the top {TOP} keys and all keys, MSE m over "
              "the keys the paper estimates):")
        print(f"  {'':>9} {'top raw':>9} {'top ' + method:>16} {'all raw':>9} {'all ' + method:>16} "
              f"{'MSE m raw':>10} {'MSE m ' + method:>18} {'NCR20 raw':>9} {'NCR20 ' + method:>16}")
        for r in out["measured"]:
            print(f"  {r['mechanism']:>9} {r['mse_frequency_top_raw']:>9.3g} {r['mse_frequency_top_post']:>16.3g} "
                  f"{r['mse_frequency_raw']:>9.3g} {r['mse_frequency_post']:>16.3g} "
                  f"{r['mse_mean_raw']:>10.3g} {r['mse_mean_post']:>18.3g} {r['ncr20_raw']:>9.2f} "
                  f"{r['ncr20_post']:>16.2f}")
    elif config.data is None:
        print(f"  (the errors below are the paper's estimators'; the collector's default post-processing "
              f"{config.postprocess} lowers them by an amount that depends on the data: give --dataset to measure)")
    if hist is not None:
        check = out["padding"]
        how = ("chosen: the smallest l with at least "
               f"{config.coverage:.0%} of the users holding <= l pairs" if out["l_chosen"] else "given")
        print(f"padding: l = {l} ({how}); set sizes: {describe_sizes(hist)}")
        print(f"  at l = {l}: {check['truncated_users']:,} users truncated ({check['truncated_fraction']:.2%}), "
              f"{check['lost_pair_fraction']:.2%} of the pairs' frequency mass lost; "
              f"the rule chooses l = {check['suggested']} (covers {check['suggested_covers']:.2%})")
        table_of = out["padding_table"][0]["mechanism"] if out["padding_table"] else out["recommendation"]
        print(f"  {'l':>4} {'truncated':>10} {'mass lost':>10} {table_of + ' f s.e.':>18}")
        for row in out["padding_table"]:
            print(f"  {row['l']:>4} {row['truncated']:>10.2%} {row['lost_pairs']:>10.2%} "
                  f"{row['frequency_se']:>18.3g}")
        if not out["l_chosen"] and check_padding(hist, l, config.coverage).too_small:
            warn_truncation(check_padding(hist, l, config.coverage))
    print(f"expected standard errors for a key with f = {out['f']:.4g}, m = {out['m']:+.3g} "
          f"(n = {n:,}, d = {d}, l = {l}, eps = {config.epsilon:g}):")
    for row in out["candidates"]:
        print(f"  {row['mechanism']:>9}: frequency ± {row['frequency_se']:.3g}   mean ± {row['mean_se']:.3g}")
    return out
