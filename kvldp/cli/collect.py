"""``kvldp collect``'s flags; the job is ``kvldp.pipelines.split.run_collect``."""
from __future__ import annotations

import argparse

from kvldp.cli import mechanism_args
from kvldp.cli.data_args import parse_range
from kvldp.cli.job_args import add_overwrite_arg, add_postprocess_arg, add_round_arguments
from kvldp.cli.units import path_arg, positive_int


def add_arguments(parser: argparse.ArgumentParser):
    mechanism_args.add_mechanism_args(parser)
    mechanism_args.add_longitudinal_args(parser)
    add_round_arguments(parser)
    parser.add_argument("--input", required=True, type=path_arg, help="report files, e.g. 'REPORTS*.avro'")
    parser.add_argument("--key-dictionary", default=None, type=path_arg, help="REPORTS.keys.txt written by perturb")
    parser.add_argument("--keys", type=positive_int, default=None,
                        help="d, when keys are unnamed 0 … d-1")
    parser.add_argument("--output", required=True, type=path_arg, help="estimates file (.avro, .jsonl or .csv)")
    add_overwrite_arg(parser)
    parser.add_argument("--broadcast-out", default=None, type=path_arg,
                        help="multi-round: where to write this round's broadcast (default OUTPUT.broadcast.avro)")
    parser.add_argument("--counts-out", default=None, type=path_arg,
                        help="IOH: where to write the cell counts for kvldp query (default OUTPUT.counts.avro)")
    parser.add_argument("--rows", type=int, default=10, help="keys shown in the table")
    parser.add_argument("--fanout", type=int, default=None,
                        help="an intermediate combine level of this many partial sums (Beam's hot-key fanout), "
                             "for very many report batches on a distributed runner")
    add_postprocess_arg(parser)
    parser.add_argument("--rating-range", type=parse_range, default=None,
                        help="lo,hi: the ratings' own scale, for means given on it too (default: the "
                             "range perturb read, from the manifest)")
    delivery = parser.add_argument_group("the delivery (checked against PREFIX.manifest.json written by perturb)")
    delivery.add_argument("--allow-partial", action="store_true",
                          help="collect the report files present when some the manifest lists are missing "
                               "(and say which)")
    delivery.add_argument("--no-manifest", dest="require_manifest", action="store_false",
                          help="collect report files that come without a manifest (not written by kvldp "
                               "perturb), unchecked")
