"""The ``kvldp`` command line. Flags kvldp does not define pass through to
Beam (``--runner``, ``--direct_num_workers``, ``--project``, …) if Beam
knows them; anything else is an error with a suggestion."""
from __future__ import annotations

import argparse
import logging
import sys

from kvldp.pipelines import advise, bench, evaluate, query, simulate, split
from kvldp.pipelines.flags import check_beam_args

COMMANDS = {
    "simulate": (simulate.add_arguments, simulate.run,
                 "generate or read ratings, perturb, aggregate and calibrate in one pipeline"),
    "perturb": (split.add_perturb_arguments, split.run_perturb,
                "client/ingest side: ratings -> randomised reports (Avro)"),
    "collect": (split.add_collect_arguments, split.run_collect,
                "collector side: reports -> calibrated estimates"),
    "query": (query.add_arguments, query.run, "IOH: conditional frequency and mean from a counts file"),
    "evaluate": (evaluate.add_arguments, evaluate.run, "sweep mechanisms x epsilons x repeats; results.csv + PNGs"),
    "advise": (advise.add_arguments, advise.run, "which mechanism for n, d, epsilon (and l), with expected errors"),
    "bench": (bench.add_arguments, bench.run, "users/second of the Beam pipeline vs the NumPy runner"),
}


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kvldp", description="Key-value data under local differential privacy.",
                                  epilog="Any other --flag is a Beam pipeline option, e.g. --runner FlinkRunner.")
    sub = top.add_subparsers(dest="command", required=True)
    for name, (add, _, help_text) in COMMANDS.items():
        add(sub.add_parser(name, help=help_text, description=help_text))
    return top


def subcommand_parser(top: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    subparsers = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[command]


def main(argv=None) -> int:
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    top = parser()
    args, beam_args = top.parse_known_args(argv)
    try:
        check_beam_args(beam_args, subcommand_parser(top, args.command))
        COMMANDS[args.command][1](args, beam_args)
    except (ValueError, FileNotFoundError) as err:
        print(f"kvldp {args.command}: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
