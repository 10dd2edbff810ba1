"""``kvldp simulate``: generate or read ratings, perturb them in the pipeline
(client side), aggregate and calibrate (collector side), print and write."""
from __future__ import annotations

import dataclasses
import json
import os
import time

import apache_beam as beam

from kvldp.mechanisms import registry
from kvldp.mechanisms.estimation.postprocess import DEFAULT as DEFAULT_POSTPROCESS
from kvldp.mechanisms.privacy.randomness import noise_generator_name
from kvldp.mechanisms.protocol import Collection, no_count_draw
from kvldp.pipelines import devices, mechanism_config, outputs, sources
from kvldp.pipelines.graphs import ioh_counts_file, protocol_summary, simulate_graph
from kvldp.pipelines.mechanism_config import MechanismConfig
from kvldp.pipelines.padding import resolve_padding
from kvldp.pipelines.query import print_queries
from kvldp.pipelines.sources import DataConfig
from kvldp.plots import tables as report
from kvldp.plots.tables import read_text
from kvldp.runtime import jobs as runner
from kvldp.transforms.io import WriteEstimates
from kvldp.transforms.ratings import write_dead_letters

DRAWING = [name for name in registry.names() if registry.can_draw_counts(name)]


@dataclasses.dataclass(frozen=True)
class SimulateConfig:
    """One simulation: the users (``data``), the mechanism, where the
    estimates go (``None``: a scratch file), and what is printed."""

    data: DataConfig
    mechanism: MechanismConfig
    output: str | None = None
    rows: int = 10                       # keys shown in the table
    fanout: int | None = None            # CombineGlobally fanout
    queries: tuple[str, ...] = ()        # IOH queries answered after the run
    postprocess: str = DEFAULT_POSTPROCESS.name     # kvldp.mechanisms.estimation.postprocess
    draw_counts: bool = False            # counts drawn per batch, no reports (Protocol.draw_round_counts)
    overwrite: bool = False              # replace outputs an earlier run left at the paths given

    def __post_init__(self):
        if self.draw_counts and not registry.can_draw_counts(self.mechanism.name):
            raise ValueError(f"--draw-counts: {no_count_draw(self.mechanism.name)} (those that can: "
                             f"{', '.join(DRAWING)})")

    @classmethod
    def from_args(cls, args) -> SimulateConfig:
        return cls(DataConfig.from_args(args), MechanismConfig.from_args(args), args.output, args.rows,
                   args.fanout, tuple(args.query), args.postprocess, args.draw_counts, args.overwrite)


def execute(config: SimulateConfig, beam_args) -> dict:
    """Build and run the simulation pipeline; return what it produced
    (records read back, counters, run time, protocol and padding summaries).

    It prints only what concerns the padding (``pipelines/padding.py``): the
    ``l`` that ``--padding auto`` chose, before the run, and a ``WARNING:``
    on stderr, before or after the run, when ``l`` truncates many users."""
    data, chosen = config.data, config.mechanism
    data.check_inputs()
    dry_run = runner.is_dry_run(beam_args)
    output, replaced = claim_outputs(config, dry_run)
    dead_letter = data.claim_dead_letter(output, outputs.run_id(), config.overwrite, dry_run)
    seeds = sources.Seeds.of(data)
    dataset = sources.built_in_dataset(data, seeds.data)
    dictionary, set_sizes = (None, None) if dataset is not None else sources.key_dictionary_and_sizes(data, beam_args)
    key_names = dataset.key_names if dataset is not None else dictionary
    ioh_keys = mechanism_config.resolve_ioh_keys(chosen, data, beam_args, key_names, dataset, dictionary)
    padding = resolve_padding(chosen, data, beam_args, dataset, dictionary, set_sizes)
    if config.queries and ioh_keys is None:
        raise ValueError("--query needs an IOH mechanism (ioh-oue, ioh-sue)")
    summary_path, counts_path = output + ".protocol.json", output + ".counts.avro"
    d = len(key_names)
    mechanism = chosen.make(d, dataset, ioh_keys, padding=padding.l, kept_share=padding.kept_share)
    data = data.sized_for(mechanism, d, config.draw_counts)
    # longitudinal: device secrets from the run seed, the collection id as every run without --collection-id
    mechanism = devices.perturbing_side(mechanism, seeds.perturb, Collection.from_seed(seeds.perturb).id)
    p = runner.make_pipeline(beam_args)
    source = sources.user_source(p, data, dataset, dictionary, devices.needs_stable_ids(mechanism))
    padding.attach(source.users, beam_args)       # set sizes measured in this job when not known yet
    # users -> state after round 1 -> … -> final state -> records (+ summary)
    run = simulate_graph(source, mechanism, seeds.perturb, config.fanout, method=config.postprocess,
                         rating_range=data.rating_scale(dataset), draw_counts=config.draw_counts)
    if mechanism.max_rounds > 1:     # what the rounds did: rounds run, budget spent, the ledger
        (run["state"] | "Summary" >> beam.Map(protocol_summary, mechanism)
         | "WriteSummary" >> beam.io.WriteToText(summary_path, num_shards=1, shard_name_template=""))
    if ioh_keys is not None:
        ioh_counts_file(run["counts"], source.users, mechanism, source.key_names, counts_path)
    run["records"] | "WriteEstimates" >> WriteEstimates(output)
    if source.dead_letter is None:
        dead_letter = None
    else:
        write_dead_letters(source.dead_letter, dead_letter)
    start = time.perf_counter()
    result = runner.run_pipeline(p)
    padding.after_run()                            # warns when l truncated too many users
    if not outputs.drop_if_empty(dead_letter):     # a run that rejected nothing leaves no dead letter
        dead_letter = None
    return {"replaced": replaced, "key_names": key_names, "mechanism": mechanism,
            "dataset": getattr(dataset, "name", data.dataset), "output": output,
            "seconds": time.perf_counter() - start, "stats": runner.counters(result),
            "records": report.read_estimates(output), "n_users": getattr(dataset, "n_users", None),
            "protocol": json.loads(read_text(summary_path)) if mechanism.max_rounds > 1 else None,
            "counts_path": counts_path if ioh_keys is not None else None, "padding": padding.summary(),
            "noise": noise_generator_name(seeds.perturb), "dead_letter": dead_letter,
            "rating_range": data.rating_scale(dataset)}


def default_output(config: SimulateConfig) -> str:
    """Where estimates go without ``--output``: the working directory (a file
    the user will want is never left in a temporary directory), one name per
    mechanism and epsilon; a rerun takes the next free name
    (``outputs.fresh``), never the earlier run's."""
    return outputs.fresh(os.path.abspath(f"estimates-{config.mechanism.name}-eps{config.mechanism.epsilon:g}.jsonl"))


def claim_outputs(config: SimulateConfig, dry_run: bool = False) -> tuple[str, list[str]]:
    """Before any compute: the estimates file and the files beside it
    (``.protocol.json``, ``.counts.avro``), none an earlier run's unless
    ``--overwrite``; returns the estimates' path and what will be replaced."""
    output = config.output or default_output(config)
    replaced = [path for path in (output, output + ".protocol.json", output + ".counts.avro")
                if outputs.claim(path, "--output", config.overwrite, dry_run)]
    return output, replaced


def run(config: SimulateConfig, beam_args) -> dict:
    out = execute(config, beam_args)
    mechanism, records, stats = out["mechanism"], out["records"], out["stats"]
    summary = report.mse_summary(records, config.mechanism.get("top") or 50)
    made = "users, their counts drawn without reports" if config.draw_counts else "user reports"
    print(f"{report.named(mechanism, out['key_names'])} on {out['dataset']}: {stats.get('users_perturbed', 0)} {made} "
          f"in {out['seconds']:.1f} s; noise from {out['noise']}")
    if mechanism.max_rounds > 1:
        info = out["protocol"]
        print(f"rounds run: {info['rounds_run']} of at most {info['max_rounds']}; "
              f"epsilon spent per user: {info['epsilon_spent']:.6g} of {mechanism.epsilon:g}")
    failure = config.data.account_rows(stats, out["dead_letter"])
    if failure:
        raise sources.TooManyRejected(failure)
    report.print_table(records, config.rows, rating_range=out["rating_range"])
    print(" ".join(f"{k}={v:.4g}" for k, v in summary.items()))
    if out["rating_range"] is not None and any(r.get("true_mean") is not None for r in records):
        print(report.rating_summary(summary, out["rating_range"]))
    replaced = f" (replacing {', '.join(out['replaced'])})" if out["replaced"] else ""
    print(f"estimates written to {out['output']}{replaced}")
    if out["dead_letter"]:
        print(f"rejected rows (with their reasons) written to {out['dead_letter']}")
    answers = []
    if out["counts_path"]:
        print(f"IOH cell counts written to {out['counts_path']} (query them with kvldp query --counts)")
        answers = print_queries(out["counts_path"], config.queries)
    return {**out, "queries": answers, **summary}
