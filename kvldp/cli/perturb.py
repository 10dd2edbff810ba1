"""``kvldp perturb``'s flags (also the perturbing half of ``kvldp publish``'s);
the job is ``kvldp.pipelines.split.run_perturb``."""
from __future__ import annotations

import argparse

from kvldp.cli import data_args, mechanism_args
from kvldp.cli.job_args import add_overwrite_arg, add_round_arguments, collection_id
from kvldp.cli.units import non_negative, parse_duration, parse_instant_ms, path_arg
from kvldp.pipelines import devices


def add_arguments(parser: argparse.ArgumentParser, output_required: bool = True):
    mechanism_args.add_mechanism_args(parser)
    mechanism_args.add_longitudinal_args(parser)
    data_args.add_dataset_args(parser)
    add_round_arguments(parser).add_argument(
        "--collection-id", type=collection_id, default=None,
        help="32 hex digits naming this collection: it keys the users' group assignment (multi-round: round 1 "
             "uses it, later rounds refuse a broadcast that carries another and by default take the "
             "broadcast's), the longitudinal instantaneous layer's noise and the ledger's records; default: "
             "derived from the run seed")
    add_ledger_args(parser)
    parser.add_argument("--output", required=output_required, type=path_arg,
                        help="REPORTS.avro: writes REPORTS-NNNNN.avro (one per batch) and REPORTS.keys.txt"
                             + ("" if output_required else " (default: ./kvldp-published/REPORTS.avro)"))
    add_overwrite_arg(parser)


def add_ledger_args(parser: argparse.ArgumentParser):
    group = parser.add_argument_group(
        "privacy ledger (perturbing side only; storage/ledger.py)",
        "Records what every user spent per collection; a user whose period budget a collection would exceed "
        "sends nothing for it (counted in the run summary). Needs --collection-id (one per scheduled run) and "
        "a persistent seed (--seed-file or $KVLDP_SEED).")
    group.add_argument("--ledger", default=None, type=path_arg,
                       help="the ledger's SQLite file (created with mode 600; never beside the reports)")
    group.add_argument("--period-budget", type=non_negative, default=None,
                       help="E: the most a user may spend over any --period (default: record, never refuse)")
    group.add_argument("--period", type=parse_duration, default=parse_duration(devices.DEFAULT_PERIOD),
                       help=f"the window of --period-budget, e.g. 30d, 12h (default {devices.DEFAULT_PERIOD})")
    group.add_argument("--collection-time", type=parse_instant_ms, default=None,
                       help="when this collection happens: 'now' (default), ms since the epoch or ISO-8601 "
                            "(a schedule's nominal time)")
