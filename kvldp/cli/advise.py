"""``kvldp advise``'s flags; the job is ``kvldp.pipelines.advise``."""
from __future__ import annotations

import argparse

from kvldp.cli import data_args, mechanism_args
from kvldp.mechanisms.estimation.postprocess import DEFAULT as DEFAULT_POSTPROCESS
from kvldp.mechanisms.frequency.padding import DEFAULT_COVERAGE
from kvldp.pipelines.postprocessing import postprocess_arg


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--epsilon", type=float, required=True, help="total privacy budget per user")
    parser.add_argument("--padding", "-l", type=mechanism_args.parse_padding, default=None,
                        help="l to check; 'auto' or omitted: chosen from the set sizes when given (else 1)")
    parser.add_argument("--set-sizes", default=None,
                        help="the users' set-size histogram as size:users, e.g. 1:500,2:300,3:200")
    parser.add_argument("--coverage", type=float, default=DEFAULT_COVERAGE,
                        help="the chosen l covers at least this share of the users (0.9, KSKV §4.3)")
    parser.add_argument("--frequency", type=float, default=None, help="a key's frequency (default 1/d)")
    parser.add_argument("--mean", type=float, default=0.0, help="a key's mean value (default 0)")
    parser.add_argument("--postprocess", type=postprocess_arg, default=DEFAULT_POSTPROCESS.name,
                        help="the post-processing whose errors are measured beside the paper's estimator's "
                             f"(default {DEFAULT_POSTPROCESS.name}; see simulate --postprocess)")
    parser.add_argument("--closed-form", action="store_true",
                        help="no runs: the paper's rule and the closed-form errors only (instant)")
    parser.add_argument("--pilot-users", type=int, default=20_000,
                        help="without a built-in dataset: the candidates run on a pilot of this many users (at "
                             "most n) with the given d and set sizes, and their errors and times are projected "
                             "to n (default 20,000)")
    parser.add_argument("--zipf", type=float, default=1.0,
                        help="the pilot's key popularity: key k held w.p. proportional to 1/k^s (default 1)")
    parser.add_argument("--max-seconds", type=float, default=None,
                        help="a time budget at n users (numpy runner, one core): slower candidates are not "
                             "recommended")
    # n and d, or a dataset / ratings file to measure them and the set sizes from
    data_args.add_dataset_args(parser, default=None)
    parser.set_defaults(users=None, keys=None)
