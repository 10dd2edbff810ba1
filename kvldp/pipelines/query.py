"""``kvldp query``: conditional frequency and mean from an IOH counts file.

A collector-side command: it reads only the bit sums an IOH run produced
(``ioh_counts.avsc``), calibrates them and answers L-way queries, e.g.
"of the users who hold A and not B, how many hold C, and how high do they
rate it?". Simulation counts files also carry the non-private truth, which
is printed next to the estimate.
"""
from __future__ import annotations

import dataclasses
import math

import fastavro
import numpy as np
from apache_beam.io.filesystems import FileSystems

from kvldp.mechanisms.kv.ioh import MAX_IOH_KEYS, calibrate_cells
from kvldp.mechanisms.kv.query import (
    CellTable,
    axis_of,
    parse_alpha_beta,
    parse_given,
    parse_query,
    true_conditional,
)
from kvldp.schemas.invalid import InvalidFile, one_line, reading


@dataclasses.dataclass
class CountsFile:
    record: dict

    @property
    def keys(self) -> list[str]:
        return list(self.record["keys"])

    def table(self) -> CellTable:
        r = self.record
        return CellTable.from_vector(*calibrate_cells(r["support"], r["n_reports"], r["p"], r["q"]))

    def truth(self, target: int, given) -> tuple | None:
        if self.record.get("truth") is None:
            return None
        return true_conditional(np.asarray(self.record["truth"]), len(self.keys), target, given)


def load_counts(path: str) -> CountsFile:
    """The one record of an IOH counts file, checked so that every query on it is defined."""
    with FileSystems.open(path) as fh, reading(path, "IOH counts file (ioh_counts.avsc)"):
        records = list(fastavro.reader(fh))
        if len(records) != 1:
            raise ValueError(f"{path} should hold one IOH counts record, found {len(records)}")
        problem = _counts_problem(records[0])
    if problem:
        raise InvalidFile(f"{path}: not a valid IOH counts file: {one_line(problem)}")
    return CountsFile(records[0])


def _counts_problem(r: dict) -> str | None:
    """Why a counts record cannot be calibrated (``None``: it can): ``k``
    distinct keys, ``3^k`` cell sums in ``[0, n]``, ``0 <= q < p <= 1``."""
    keys, support, n = r["keys"], r["support"], r["n_reports"]
    if not 1 <= len(keys) <= MAX_IOH_KEYS or len(set(keys)) != len(keys):
        return f"{len(keys)} keys ({len(set(keys))} distinct), 1 … {MAX_IOH_KEYS} distinct expected"
    if len(support) != 3 ** len(keys):
        return f"{len(support)} cell sums for {len(keys)} keys, {3 ** len(keys)} expected"
    if n < 0 or any(not 0 <= c <= n for c in support):
        return f"cell sums outside [0, n_reports = {n}]"
    if not (math.isfinite(r["p"]) and math.isfinite(r["q"]) and 0 <= r["q"] < r["p"] <= 1):
        return f"p = {r['p']!r}, q = {r['q']!r}: 0 <= q < p <= 1 expected"
    truth = r.get("truth")
    if truth is not None and (len(truth) != 2 ** len(keys) * (1 + len(keys)) or not all(map(math.isfinite, truth))):
        return f"truth holds {len(truth)} values, {2 ** len(keys) * (1 + len(keys))} finite ones expected"
    return None


def describe(given, keys) -> str:
    if not given:
        return ""
    return " | " + ", ".join(f"{keys[j]}={'1' if held else '0'}" for j, held in sorted(given.items()))


def answer(counts: CountsFile, target: int, given) -> dict:
    """Estimate (± s.e.), the unconditional value and, in simulations, the truth."""
    table = counts.table()
    est, base = table.conditional(target, given), table.conditional(target)
    out = {"target": counts.keys[target], "given": {counts.keys[j]: held for j, held in given.items()},
           "frequency": est.frequency, "frequency_se": est.frequency_se, "mean": est.mean, "mean_se": est.mean_se,
           "frequency_raw": est.frequency_raw, "mean_raw": est.mean_raw,
           "users_in_condition": est.users_in_condition,
           "unconditional_frequency": base.frequency, "unconditional_mean": base.mean}
    truth = counts.truth(target, given)
    if truth is not None:
        out.update(true_frequency=truth[0], true_mean=truth[1], true_users_in_condition=truth[2])
    return out


def print_answer(a: dict, keys):
    given = {axis_of(k, keys): v for k, v in a["given"].items()}
    label = f"{a['target']}{describe(given, keys)}"
    print(f"f({label}) = {a['frequency']:.4f} ± {a['frequency_se']:.4f}"
          f"   (unconditional {a['unconditional_frequency']:.4f})"
          + (f"   truth {a['true_frequency']:.4f}" if "true_frequency" in a else ""))
    truth_m = a.get("true_mean")
    print(f"m({label}) = {a['mean']:+.4f} ± {a['mean_se']:.4f}"
          f"   (unconditional {a['unconditional_mean']:+.4f})"
          + (f"   truth {truth_m:+.4f}" if truth_m is not None and not math.isnan(truth_m) else ""))
    print(f"   users in the condition: ~{a['users_in_condition']:.0f}"
          + (f" (truth {a['true_users_in_condition']})" if "true_users_in_condition" in a else ""))


def print_queries(counts_path: str, queries) -> list[dict]:
    if not queries:
        return []
    counts = load_counts(counts_path)
    out = []
    for text in queries:
        target, given = parse_query(text, counts.keys)
        out.append(answer(counts, target, given))
        print_answer(out[-1], counts.keys)
    return out


@dataclasses.dataclass(frozen=True)
class QueryConfig:
    """One L-way query on a counts file: the ``target`` key, conditioned by
    ``given`` (``KEY=1,KEY=0``) or by the ``alpha``/``beta`` bit strings."""

    counts: str
    target: str
    given: str = ""
    alpha: str | None = None
    beta: str | None = None

    def __post_init__(self):
        if self.given and (self.alpha is not None or self.beta is not None):
            raise ValueError("use --given or --alpha/--beta, not both")

    @classmethod
    def from_args(cls, args) -> QueryConfig:
        return cls(args.counts, args.target, args.given, args.alpha, args.beta)

    def condition(self, keys) -> dict:
        """The condition as ``{axis: held}`` over the counts file's ``keys``."""
        if self.alpha is not None or self.beta is not None:
            return parse_alpha_beta(self.alpha or "", self.beta or "")
        return parse_given(self.given, keys)


def run(config: QueryConfig, beam_args) -> dict:
    counts = load_counts(config.counts)
    target = axis_of(config.target, counts.keys)
    given = config.condition(counts.keys)
    print(f"{counts.record['mechanism']} eps={counts.record['epsilon']:g}, n={counts.record['n_reports']}, "
          f"keys {', '.join(counts.keys)}")
    result = answer(counts, target, given)
    print_answer(result, counts.keys)
    return result
