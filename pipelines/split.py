"""The split deployment: ``kvldp perturb`` (clients or an ingest job) writes
reports; ``kvldp collect`` (the untrusted collector) reads only reports."""
from __future__ import annotations

import argparse
import sys

import apache_beam as beam

from pipelines import common, report
from pipelines.graphs import collect_estimates
from transforms.io import ReadReports, check_report_files, WriteEstimates, WriteReports, write_dead_letters
from transforms.perturb import Perturb


def report_prefix(output: str) -> str:
    return output[:-len(".avro")] if output.endswith(".avro") else output


def add_perturb_arguments(parser: argparse.ArgumentParser):
    common.add_mechanism_args(parser)
    common.add_dataset_args(parser)
    parser.add_argument("--input", dest="dataset_input", default=None, help="ratings file/pattern (= --dataset PATH)")
    parser.add_argument("--output", required=True,
                        help="REPORTS.avro: writes REPORTS-NNNNN.avro (one per batch) and REPORTS.keys.txt")


def run_perturb(args, beam_args) -> dict:
    if args.dataset_input:
        args.dataset = args.dataset_input
    seeds = common.Seeds.from_arg(args.seed)
    dataset = common.built_in_dataset(args, seeds.data)
    dictionary = None if dataset is not None else common.key_dictionary(args, beam_args)
    prefix = report_prefix(args.output)
    p = common.make_pipeline(beam_args)
    source = common.user_source(p, args, dataset, dictionary)
    mechanism = common.make_mechanism(args, source.d, dataset)
    (source.users
     | "Perturb" >> Perturb(mechanism, seeds.perturb)
     | "WriteReports" >> WriteReports(prefix, mechanism))
    (source.key_names | "JoinKeys" >> beam.Map("\n".join)
     | "WriteKeys" >> beam.io.WriteToText(prefix + ".keys.txt", num_shards=1, shard_name_template=""))
    if source.dead_letter is not None:
        write_dead_letters(source.dead_letter, prefix + ".rejected.jsonl")
    result = p.run()
    result.wait_until_finish()
    stats = common.counters(result)
    common.print_row_summary(stats)
    print(f"{stats.get('reports_written', 0)} reports of {mechanism!r} written to {prefix}-*.avro; "
          f"key dictionary {prefix}.keys.txt")
    return {"prefix": prefix, "stats": stats, "mechanism": mechanism}


def add_collect_arguments(parser: argparse.ArgumentParser):
    common.add_mechanism_args(parser)
    parser.add_argument("--input", required=True, help="report files, e.g. 'REPORTS*.avro'")
    parser.add_argument("--key-dictionary", default=None, help="REPORTS.keys.txt written by perturb")
    parser.add_argument("--keys", type=int, default=None, help="d, when keys are unnamed 0 … d-1")
    parser.add_argument("--output", required=True, help="estimates file (.avro, .jsonl or .csv)")
    parser.add_argument("--rows", type=int, default=10)
    parser.add_argument("--fanout", type=int, default=None)


def run_collect(args, beam_args) -> dict:
    if args.key_dictionary:
        names = common.read_dictionary(args.key_dictionary)
    elif args.keys:
        names = [str(k) for k in range(args.keys)]
    else:
        sys.exit("collect needs --key-dictionary (from perturb) or --keys d")
    mechanism = common.make_mechanism(args, len(names))
    check_report_files(args.input, mechanism)
    p = common.make_pipeline(beam_args)
    reports = p | "ReadReports" >> ReadReports(args.input, mechanism)
    key_names = p | "KeyNames" >> beam.Create([names])
    collect_estimates(reports, mechanism, key_names, args.fanout) | "WriteEstimates" >> WriteEstimates(args.output)
    result = p.run()
    result.wait_until_finish()
    stats = common.counters(result)
    records = report.read_estimates(args.output)
    print(f"{stats.get('reports_read', 0)} reports collected by {mechanism!r}")
    report.print_table(records, args.rows)
    print(f"estimates written to {args.output}")
    return {"output": args.output, "stats": stats}
