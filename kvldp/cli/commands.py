"""The ``kvldp`` command line. Flags kvldp does not define pass through to
Beam (``--runner``, ``--direct_num_workers``, ``--project``, …) if Beam
knows them; anything else is an error with a suggestion."""
from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable

from kvldp.bench import command as bench
from kvldp.cli import advise as advise_flags
from kvldp.cli import bench as bench_flags
from kvldp.cli import collect as collect_flags
from kvldp.cli import evaluate as evaluate_flags
from kvldp.cli import perturb as perturb_flags
from kvldp.cli import publish as publish_flags
from kvldp.cli import query as query_flags
from kvldp.cli import seed as seed_flags
from kvldp.cli import simulate as simulate_flags
from kvldp.cli import stream as stream_flags
from kvldp.cli.flags import check_beam_args
from kvldp.pipelines import advise, evaluate, publish, query, run_seed, simulate, split, stream, stream_job, sweep
from kvldp.runtime import console, failures, local_runner, portable, tweaks
from kvldp.runtime import jobs as runner


@dataclasses.dataclass(frozen=True)
class Command:
    """A subcommand: its flags, the typed config built from them once
    (``config.from_args``), and the job, ``run(config, beam_args)``."""

    add_arguments: Callable
    config: type
    run: Callable
    help: str


COMMANDS = {
    "simulate": Command(simulate_flags.add_arguments, simulate.SimulateConfig, simulate.run,
                        "generate or read ratings, perturb, aggregate and calibrate in one pipeline"),
    "perturb": Command(perturb_flags.add_arguments, split.PerturbConfig, split.run_perturb,
                       "client/ingest side: ratings -> randomised reports (Avro)"),
    "collect": Command(collect_flags.add_arguments, split.CollectConfig, split.run_collect,
                       "collector side: reports -> calibrated estimates"),
    "publish": Command(publish_flags.add_arguments, publish.PublishConfig, publish.run,
                       "device side in a box: perturb as perturb does, publish report batches to Pub/Sub"),
    "stream": Command(stream_flags.add_arguments, stream.StreamConfig, stream_job.run,
                      "continuous collector: Pub/Sub reports -> estimates per event-time window and pane"),
    "query": Command(query_flags.add_arguments, query.QueryConfig, query.run,
                     "IOH: conditional frequency and mean from a counts file"),
    "evaluate": Command(evaluate_flags.add_arguments, evaluate.EvaluateConfig, evaluate.run,
                        "sweep mechanisms x epsilons x repeats; results.csv + PNGs"),
    "advise": Command(advise_flags.add_arguments, advise.AdviseConfig, advise.run,
                      "which mechanism for n, d, epsilon (and l), with expected errors"),
    "bench": Command(bench_flags.add_arguments, bench.BenchConfig, bench.run,
                     "users/second of the Beam pipeline vs the NumPy runner"),
    "seed": Command(seed_flags.add_arguments, run_seed.SeedConfig, run_seed.run_seed_command,
                    "write a fresh secret run seed to a file for --seed-file (mode 600)"),
}


def version() -> str:
    """kvldp's release and the Beam it runs on (and whether tuned, ``kvldp.runtime``)."""
    import kvldp
    tuned = "local runner tuned" if tweaks.stock_reason() is None else f"stock: {tweaks.stock_reason()}"
    return f"kvldp {kvldp.__version__} on apache-beam {tweaks.beam_version()} ({tuned})"


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="kvldp", description="Key-value data under local differential privacy.",
                                  epilog="Any other --flag is a Beam pipeline option, e.g. --runner FlinkRunner.")
    top.add_argument("--version", action="version", version=version())
    sub = top.add_subparsers(dest="command", required=True)
    for name, command in COMMANDS.items():
        command.add_arguments(sub.add_parser(name, help=command.help, description=command.help))
    return top


def configure(argv) -> tuple[str, object, list[str]]:
    """``(command, its typed config, the Beam arguments)`` of a command line;
    a bad flag or value raises (``SystemExit`` from argparse, ``ValueError``
    from the config's checks) before any job starts."""
    top = parser()
    args, beam_args = top.parse_known_args(argv)
    return args.command, config_from_args(top, args, beam_args), beam_args


def config_from_args(top: argparse.ArgumentParser, args, beam_args):
    check_beam_args(beam_args, subcommand_parser(top, args.command))
    portable.check_runner(beam_args)
    return COMMANDS[args.command].config.from_args(args)


def subcommand_parser(top: argparse.ArgumentParser, command: str) -> argparse.ArgumentParser:
    subparsers = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    return subparsers.choices[command]


def interrupted(stop: BaseException) -> str:
    """The one line an interrupted command prints."""
    if isinstance(stop, sweep.SweepInterrupted):
        return str(stop)            # what the sweep kept
    name = stop.args[0] if isinstance(stop, sweep.Interrupted) else "SIGINT"
    return f"interrupted by {name}: stopped, its temporary files removed"


def main(argv=None) -> int:
    """The command (the console script enters through ``runtime.start``,
    which sets the process up first)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    console.set_up_logging()
    top = parser()
    args, beam_args = top.parse_known_args(argv)
    try:
        # one way to stop for every command: SIGINT (Ctrl-C) or SIGTERM -> one line, exit 130, the
        # command's temporary files removed (its scratch scope here, its temp directory at the start)
        with sweep.stop_on_signals(), runner.scratch_scope(), local_runner.tuned(tweaks.runs_locally(argv)):
            COMMANDS[args.command].run(config_from_args(top, args, beam_args), beam_args)
    except runner.DryRunFinished as done:
        print(done)
        return 0
    except (KeyboardInterrupt, sweep.Interrupted) as stop:
        print(f"kvldp {args.command}: {interrupted(stop)}", file=sys.stderr)
        return 130
    except (ValueError, FileNotFoundError) as err:
        print(f"kvldp {args.command}: error: {err}", file=sys.stderr)
        return 2
    except Exception as err:
        if failures.debugging():
            raise
        print(f"kvldp {args.command}: failed: {failures.one_line(err)} (the full traceback: rerun with "
              f"{failures.DEBUG_ENV}=1)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
