"""``kvldp simulate``: generate or read ratings, perturb them in the pipeline
(client side), aggregate and calibrate (collector side), print and write."""
from __future__ import annotations

import argparse
import time

from pipelines import common, report
from pipelines.graphs import simulate_estimates
from transforms.io import WriteEstimates, write_dead_letters
from transforms.perturb import Perturb


def add_arguments(parser: argparse.ArgumentParser):
    common.add_mechanism_args(parser)
    common.add_dataset_args(parser)
    parser.add_argument("--output", default=None, help="estimates file (.avro, .jsonl or .csv)")
    parser.add_argument("--rows", type=int, default=10, help="keys shown in the table")
    parser.add_argument("--top", type=int, default=50, help="the top-k set of the MSE summary")
    parser.add_argument("--fanout", type=int, default=None, help="CombineGlobally fanout")


def run(args, beam_args) -> dict:
    seeds = common.Seeds.from_arg(args.seed)
    dataset = common.built_in_dataset(args, seeds.data)
    dictionary = None if dataset is not None else common.key_dictionary(args, beam_args)
    output = args.output or common.scratch_path(beam_args, "estimates.jsonl")
    p = common.make_pipeline(beam_args)
    source = common.user_source(p, args, dataset, dictionary)
    mechanism = common.make_mechanism(args, source.d, dataset)
    # users: UserBatch -> reports: ReportBatch -> records: one dict per key
    reports = source.users | "Perturb" >> Perturb(mechanism, seeds.perturb)
    records = simulate_estimates(source.users, reports, mechanism, source.key_names, args.fanout)
    records | "WriteEstimates" >> WriteEstimates(output)
    if source.dead_letter is not None:
        write_dead_letters(source.dead_letter, output + ".rejected.jsonl")
    start = time.perf_counter()
    result = p.run()
    result.wait_until_finish()
    seconds = time.perf_counter() - start
    stats = common.counters(result)
    records = report.read_estimates(output)
    summary = report.mse_summary(records, args.top)
    print(f"{mechanism!r} on {getattr(dataset, 'name', args.dataset)}: "
          f"{stats.get('users_perturbed', 0)} users in {seconds:.1f} s")
    common.print_row_summary(stats)
    report.print_table(records, args.rows)
    print(" ".join(f"{k}={v:.4g}" for k, v in summary.items()))
    print(f"estimates written to {output}")
    return {"output": output, "seconds": seconds, "stats": stats, **summary}
