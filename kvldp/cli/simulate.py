"""``kvldp simulate``'s flags; the job is ``kvldp.pipelines.simulate``."""
from __future__ import annotations

import argparse

from kvldp.cli import data_args, mechanism_args
from kvldp.cli.job_args import add_overwrite_arg, add_postprocess_arg
from kvldp.cli.units import path_arg
from kvldp.pipelines.simulate import DRAWING


def add_arguments(parser: argparse.ArgumentParser):
    mechanism_args.add_mechanism_args(parser)
    mechanism_args.add_longitudinal_args(parser)
    data_args.add_dataset_args(parser)
    data_args.add_fast_rng_arg(parser)
    parser.add_argument("--output", default=None, type=path_arg,
                        help="estimates file (.avro, .jsonl or .csv); default "
                             "./estimates-MECHANISM-epsEPS.jsonl in the working directory (-2, -3, ... when "
                             "an earlier run's is there)")
    add_overwrite_arg(parser)
    parser.add_argument("--rows", type=int, default=10, help="keys shown in the table")
    parser.add_argument("--fanout", type=int, default=None,
                        help="an intermediate combine level of this many partial sums (Beam's hot-key fanout), "
                             "for very many report batches on a distributed runner")
    parser.add_argument("--query", action="append", default=[],
                        help='IOH: "target=KEY given KEY=1,KEY=0" (repeatable); prints estimate and truth')
    parser.add_argument("--draw-counts", action="store_true",
                        help="simulations only: draw each batch's collector counts from their exact distribution "
                             "instead of making every user's report (the same distribution of estimates; no "
                             f"report exists). Mechanisms: {', '.join(DRAWING)}")
    add_postprocess_arg(parser)
