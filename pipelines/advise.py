"""``kvldp advise``: which mechanism for n users, d keys, epsilon (and l).

The rule of Gu et al. (PCKV §5.3): for frequencies PCKV-UE beats PCKV-GRR
when ``2(d - 1) > l(4l - 1)(e^eps + 1)``; PCKV-UE's error does not grow with
``d``, PCKV-GRR's does. Next to the rule, the closed-form variances
(Theorem 4; KS-UE Theorem 4.2) of every mechanism that has one, and the
standard errors to expect for a key of frequency ``f`` and mean ``m``.
"""
from __future__ import annotations

import argparse
import math

import numpy as np

from mechanisms import registry

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


def advise(n: int, d: int, epsilon: float, l: int = 1, f: float | None = None, m: float = 0.0) -> dict:
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
    return {"recommendation": choice, "reason": reason, "candidates": rows, "f": f, "m": m}


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--users", type=int, required=True, help="n")
    parser.add_argument("--keys", type=int, required=True, help="d")
    parser.add_argument("--epsilon", type=float, required=True)
    parser.add_argument("--padding", "-l", type=int, default=1, help="l (about the typical number of pairs)")
    parser.add_argument("--frequency", type=float, default=None, help="a key's frequency (default 1/d)")
    parser.add_argument("--mean", type=float, default=0.0, help="a key's mean value (default 0)")


def run(args, beam_args) -> dict:
    out = advise(args.users, args.keys, args.epsilon, args.padding, args.frequency, args.mean)
    print(f"recommended: {out['recommendation']}")
    print(f"  {out['reason']}")
    print(f"expected standard errors for a key with f = {out['f']:.4g}, m = {out['m']:+.3g} "
          f"(n = {args.users:,}, d = {args.keys}, l = {args.padding}, eps = {args.epsilon:g}):")
    for row in out["candidates"]:
        print(f"  {row['mechanism']:>9}: frequency ± {row['frequency_se']:.3g}   mean ± {row['mean_se']:.3g}")
    return out
