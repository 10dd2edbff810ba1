"""``kvldp evaluate``'s flags; the job (and ``--preset``'s filling in of the
flags left unset) is ``kvldp.pipelines.evaluate``."""
from __future__ import annotations

import argparse
import os
import sys

from kvldp.cli import data_args, mechanism_args
from kvldp.cli.units import fraction, positive_int
from kvldp.mechanisms.estimation.postprocess import DEFAULT as DEFAULT_POSTPROCESS
from kvldp.pipelines import over_time
from kvldp.pipelines.postprocessing import postprocess_list
from kvldp.pipelines.presets import PRESETS


class DeprecatedAlias(argparse.Action):
    """An old flag name that still works, with a one-line note to use ``new``."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"kvldp: {option_string} is deprecated here, use {self.new} (it stays for one release)",
              file=sys.stderr)
        setattr(namespace, self.dest, values)


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--preset", choices=sorted(PRESETS), default=None, help="a paper's setup (overridable)")
    parser.add_argument("--mechanisms", default=None, help="comma-separated, e.g. pckv-ue,pckv-grr,privkvm-vi")
    parser.add_argument("--epsilons", default=None, help="comma-separated, e.g. 0.5,1,2,4,6")
    parser.add_argument("--repeats", type=positive_int, default=None,
                        help="repeats per (mechanism, epsilon) (5)")
    parser.add_argument("--out", required=True, help="folder for results.csv, runs/ and the figures")
    parser.add_argument("--parallel", type=positive_int, default=min(2, os.cpu_count() or 1),
                        help="cells run at once, each in its own process")
    parser.add_argument("--engine", choices=("beam", "numpy"), default="beam",
                        help="run each cell as a Beam pipeline (default) or on the pure-NumPy local runner "
                             "(same estimates, faster; built-in datasets only)")
    parser.add_argument("--top-sets", dest="top_sets", default=None,
                        help="top-t key sets to score, e.g. 20,50 (default 50); KS-GRR/KS-Adap use the largest as t")
    # --top is KS's t in simulate/perturb/collect: here it was the top sets; kept one release, with a note
    parser.add_argument("--top", dest="top_sets", action=DeprecatedAlias, new="--top-sets", help=argparse.SUPPRESS)
    parser.add_argument("--postprocess", type=postprocess_list, default=None,
                        help="post-processings to score, comma-separated, e.g. raw,norm-sub,base-cut,eb+shrink "
                             f"(default raw,{DEFAULT_POSTPROCESS.name}); see simulate --postprocess")
    mechanism_args.add_mechanism_args(parser, single=False)
    mechanism_args.add_longitudinal_args(parser)
    add_over_time_args(parser)
    data_args.add_dataset_args(parser)
    data_args.add_fast_rng_arg(parser)
    parser.set_defaults(users=None, keys=None, dataset=None)     # so a preset can fill them


def add_over_time_args(parser):
    group = parser.add_argument_group(
        "repeated collections (--collections T; over_time.py)",
        "T collections over the same users, a share --churn of them re-rating between collections; per "
        "collection MSE and each user's cumulative privacy loss for --modes. Runs on the NumPy runner.")
    group.add_argument("--collections", type=positive_int, default=None, help="T collections (e.g. 30)")
    group.add_argument("--churn", type=fraction, default=None,
                       help="share of users taking new ratings before each collection (default 0.1)")
    group.add_argument("--modes", default=None,
                       help=f"comma-separated, of {', '.join(over_time.MODES)} (default: all; two-layer and "
                            "fresh-eps1 need --eps-1)")
    group.add_argument("--period-budget", type=float, default=None,
                       help="each user's budget over --period (default: none; a user over it sits collections out)")
    group.add_argument("--period", default=None,
                       help="the window of --period-budget, as a duration (collections are a day apart; default 30d)")
