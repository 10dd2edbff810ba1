"""``kvldp advise``: which mechanism for n users, d keys, epsilon, and which l.

The rule of Gu et al. (PCKV §5.3): for frequencies PCKV-UE beats PCKV-GRR
when ``2(d - 1) > l(4l - 1)(e^eps + 1)``; PCKV-UE's error does not grow with
``d``, PCKV-GRR's does. Next to the rule, the closed-form variances
(Theorem 4; KS-UE Theorem 4.2) of every mechanism that has one, and the
standard errors to expect for a key of frequency ``f`` and mean ``m``.

The closed forms know neither the data's shape, nor the OLH-based KS
mechanisms, nor what a run costs; so advise measures (``advise_measure``):
every candidate runs once on the users -- a built-in dataset as it is, else
a pilot of ``--pilot-users`` with the operator's ``d`` and set sizes and a
Zipf popularity (``datasets/pilot.py``) -- and the recommendation is the
one with the smallest MSE of frequency over the top 20 keys, projected to
``n``; a candidate within 2 of the pilot's standard errors of it wins
instead only if it takes under half the time and the best would take
more than ``MATERIAL_SECONDS`` at ``n`` (``advise_measure.recommend``;
``--max-seconds``: a time budget at ``n``). The paper's rule and the closed
forms are printed beside (``--closed-form``: only them, no runs).

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

from kvldp.datasets.pilot import pilot_population
from kvldp.mechanisms import registry
from kvldp.mechanisms.estimation.postprocess import DEFAULT as DEFAULT_POSTPROCESS
from kvldp.mechanisms.frequency.padding import (
    DEFAULT_COVERAGE,
    MAX_PADDING,
    check_padding,
    choose_padding,
)
from kvldp.pipelines import advise_measure, mechanism_config, sources
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
    closed_form: bool = False             # no runs: the rule and the closed forms only
    pilot_users: int = 20_000             # without a built-in dataset: the pilot's size (at most n)
    zipf: float = 1.0                     # the pilot's key popularity, w_k ∝ 1/k^s
    max_seconds: float | None = None      # a candidate's time budget at n (numpy runner, one core)

    def __post_init__(self):
        if self.set_sizes is not None and self.data is not None:
            raise ValueError("give --set-sizes or --dataset, not both")
        if self.pilot_users < 1 or self.zipf < 0 or (self.max_seconds is not None and self.max_seconds <= 0):
            raise ValueError("need --pilot-users >= 1, --zipf >= 0 and --max-seconds > 0")

    @classmethod
    def from_args(cls, args) -> AdviseConfig:
        data = DataConfig.from_args(args, users=args.users or 1_000_000, keys=args.keys or 100) \
            if args.dataset else None
        sizes = parse_set_sizes(args.set_sizes) if args.set_sizes else None
        return cls(args.epsilon, args.users, args.keys, data, sizes, args.padding, args.coverage,
                   args.frequency, args.mean, args.postprocess, args.closed_form, args.pilot_users, args.zipf,
                   args.max_seconds)


def measure(data: DataConfig, beam_args) -> tuple[int, int, np.ndarray]:
    """``(n, d, set-size histogram)`` of the dataset (ingest side: raw data)."""
    dataset = sources.built_in_dataset(data, sources.Seeds.from_arg(data.seed).data)
    if dataset is not None:
        return dataset.n_users, dataset.d, data_set_sizes(data, beam_args, dataset, None)
    dictionary, hist = sources.key_dictionary_and_sizes(data, beam_args)
    if hist is None:
        hist = data_set_sizes(data, beam_args, None, dictionary)
    return int(hist.sum()), len(dictionary), hist


def measured_on(config: AdviseConfig, n: int, d: int, hist) -> tuple[object, int]:
    """``(population, n)``: a built-in dataset as it is, else a pilot of at
    most ``--pilot-users`` users with ``d`` keys and the set sizes."""
    if config.data is not None:
        dataset = sources.built_in_dataset(config.data, sources.Seeds.from_arg(config.data.seed).data)
        if dataset is not None:
            return dataset, dataset.n_users
    return pilot_population(min(n, config.pilot_users), d, hist, config.zipf, seed=advise_measure.MEASURE_SEED), n


def recommend_measured(out: dict, config: AdviseConfig, n: int, d: int, hist) -> dict:
    """``out`` with the measured recommendation (``advise_measure``); the
    paper's rule kept as ``rule_recommendation``."""
    population, n = measured_on(config, n, d, hist)
    measured = advise_measure.measure(population, config.epsilon, out["l"], config.postprocess, n, hist)
    pick, reason = advise_measure.recommend(measured, config.max_seconds)
    reason += f"; the paper's rule says {out['recommendation']}"
    return {**out, "rule_recommendation": out["recommendation"], "rule_reason": out["reason"],
            "recommendation": pick["mechanism"], "reason": reason, "measured": measured,
            "measured_on": population.name}


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
    if not config.closed_form:
        out = recommend_measured(out, config, n, d, hist)
        if hist is not None and out["recommendation"] in CANDIDATES:   # the padding table is the recommended one's
            out["padding_table"] = padding_table(out["recommendation"], n, d, config.epsilon, l, out["f"], out["m"],
                                                 hist, config.coverage)
    print(f"recommended: {out['recommendation']}")
    print(f"  {out['reason']}")
    if out.get("measured"):
        advise_measure.print_table(out["measured"], config.postprocess, out["measured_on"])
    else:
        print(f"  (the errors below are the paper's estimators'; the collector's default post-processing "
              f"{config.postprocess} lowers them by an amount that depends on the data: drop --closed-form to "
              "measure)")
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
