"""The split deployment: ``kvldp perturb`` (clients or an ingest job) writes
reports; ``kvldp collect`` (the untrusted collector) reads only reports.

Multi-round protocols run one ``perturb``/``collect`` pair per round: round
``r``'s collect writes the estimates and a broadcast file
(``schemas/broadcast.avsc``) that round ``r+1``'s perturb reads with
``--broadcast``. With the same seed the rounds reproduce the single-pipeline
run exactly (batch ``b`` of round ``r`` always draws from ``(seed, b, r)``).
"""
from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence

import apache_beam as beam
import fastavro
from apache_beam.io.filesystems import FileSystems

from kvldp import schemas
from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms.estimation.postprocess import DEFAULT as DEFAULT_POSTPROCESS
from kvldp.mechanisms.params import AUTO
from kvldp.mechanisms.protocol import Collection
from kvldp.pipelines import devices, manifest, mechanism_config, outputs, run_seed, sources
from kvldp.pipelines.devices import LedgerConfig
from kvldp.pipelines.graphs import collect_graph, ioh_counts_file
from kvldp.pipelines.mechanism_config import MechanismConfig
from kvldp.pipelines.padding import kept_share_from_reports, padding_from_reports, resolve_padding
from kvldp.pipelines.sources import DataConfig
from kvldp.plots import tables as report
from kvldp.runtime import jobs as runner
from kvldp.schemas.invalid import reading
from kvldp.schemas.records import broadcast_records, state_from_broadcast
from kvldp.transforms.io import (
    ReadReports,
    WriteEstimates,
    WriteReports,
    check_report_files,
    report_config,
)
from kvldp.transforms.key_names import CreateKeyNames, key_names_pcollection
from kvldp.transforms.perturb import Perturb
from kvldp.transforms.ratings import write_dead_letters

DERIVED_DICTIONARY_WARNING = (
    "WARNING: no --key-dictionary: the key dictionary is derived from the ratings and written to "
    "PREFIX.keys.txt for the collector, so it publishes every item id anyone rated (an item only one user "
    "rated tells the collector that someone did). For a real collection pass --key-dictionary with the "
    "public catalogue; items outside it go to the dead letter.")


@dataclasses.dataclass(frozen=True)
class PerturbConfig:
    """One ``perturb`` round: whose users, which mechanism, which round
    (``round`` 1-based; ``broadcast``: the previous round's file), the
    collection to start or continue, and the reports' ``output``."""

    data: DataConfig
    mechanism: MechanismConfig
    output: str | None
    round: int = 1
    broadcast: str | None = None
    collection_id: str | None = None
    ledger: LedgerConfig = dataclasses.field(default_factory=LedgerConfig)
    overwrite: bool = False              # replace an earlier run's reports under the prefix

    @property
    def prefix(self) -> str:
        """Reports go to ``PREFIX-NNNNN.avro`` and the key names to ``PREFIX.keys.txt``."""
        return self.output[:-len(".avro")] if self.output.endswith(".avro") else self.output

    def __post_init__(self):
        if self.output:
            self.ledger.check_place(self.prefix)
        if self.ledger.path and not self.collection_id:
            raise ValueError("--ledger records spends per collection: name this one with --collection-id "
                             "(one per scheduled run; a rerun with the same id is a retry and charges nothing)")
        if self.ledger.path and self.data.seed_origin is None:
            raise ValueError("--ledger needs a persistent run seed (--seed-file or $KVLDP_SEED): a retried "
                             "collection must redraw the same reports, and a fresh state fingerprint per run "
                             "would charge unchanged states again")
        if self.output and not self.data.is_built_in:
            dead, prefix = self.data.dead_letter_path(self.output, "RUNID"), self.prefix
            if dead.startswith(prefix) or FileSystems.split(dead)[0] == FileSystems.split(prefix)[0]:
                raise ValueError(f"--dead-letter {dead} is beside the reports {prefix}-*: rejected rows are raw "
                                 "ratings and must not travel with what the collector receives; put them "
                                 "elsewhere (default: beside the input)")

    @classmethod
    def from_args(cls, args) -> PerturbConfig:
        data = DataConfig.from_args(args)
        if data.seed_origin == "flag" and not data.is_built_in:
            print(run_seed.exposed_seed_warning(getattr(args, "command", "perturb")), file=sys.stderr)
        return cls(data, MechanismConfig.from_args(args), args.output, args.round, args.broadcast,
                   args.collection_id, LedgerConfig.from_args(args), getattr(args, "overwrite", False))


def read_broadcast(path: str, key_names, protocol):
    """The collector's state after the previous round, checked against ``protocol``."""
    with FileSystems.open(path) as fh, reading(path, "broadcast file (broadcast.avsc)"):
        records = list(fastavro.reader(fh))
        state, config = state_from_broadcast(records, key_names, protocol)
    if config != json.loads(json.dumps(dict(protocol.config()))):
        raise ValueError(f"{path} was written by {config}, not by {dict(protocol.config())}")
    if state.collection is None:
        raise ValueError(f"{path} names no collection (written by an older kvldp?): "
                         "a later round cannot know round 1's user groups; rerun from round 1")
    return state


def protocol_state_for_round(protocol, round_number: int, broadcast: str | None, key_names,
                             collection: Collection | None = None):
    """The state round ``round_number`` (1-based) starts from; round 1 starts
    a new ``collection``, later rounds read theirs from ``broadcast``."""
    if not 1 <= round_number <= protocol.max_rounds:
        raise ValueError(f"--round must be in 1 … {protocol.max_rounds} for {protocol!r}")
    if round_number == 1:
        if broadcast:
            raise ValueError("round 1 takes no --broadcast")
        return protocol.initial_state(collection)
    if not broadcast:
        raise ValueError(f"round {round_number} needs --broadcast from round {round_number - 1}'s collect")
    state = read_broadcast(broadcast, key_names, protocol)
    if state.rounds_done != round_number - 1:
        raise ValueError(f"{broadcast} is the state after round {state.rounds_done}, not {round_number - 1}")
    if state.stopped:
        raise ValueError(f"{broadcast}: the protocol stopped after round {state.rounds_done} "
                         f"(eps spent {state.epsilon_spent:g}); there is no round {round_number}")
    return state


def round_config(protocol, round_index: int, collection: Collection) -> dict:
    """What a round's reports are pinned to: the protocol's public parameters
    and, for protocols of several rounds, the collection (so reports of
    another collection are refused). A single-round mechanism's reports
    name none: independent ingest jobs over disjoint users may feed one
    collect."""
    if protocol.max_rounds == 1:
        return dict(protocol.config(round_index))
    return {**protocol.config(round_index), "collection": collection.id, "layout": collection.layout}


def ingest_layout(data: DataConfig, dataset) -> str:
    """How the perturbing side turns users into (batch, position): a user's
    group depends on it, so every round must batch alike."""
    if dataset is None:
        return f"ratings shards={data.shards} batch_size={data.sized_batch}"
    return f"{dataset.name} users={dataset.n_users} batch_size={data.sized_batch}"


def perturb_state(config: PerturbConfig, protocol, seed: int, dataset, key_names):
    """The state this perturb round starts from. Round 1 starts a collection
    (``--collection-id``, else derived from the run seed); later rounds take
    the broadcast's, after checking that this invocation agrees with round 1
    on everything that decides the user groups."""
    cid, seed_given = config.collection_id, config.data.seed
    if protocol.max_rounds == 1 and (config.round != 1 or config.broadcast):
        raise ValueError(f"{protocol.name} has a single round: no --round/--broadcast")
    layout = ingest_layout(config.data, dataset)
    if config.round == 1:
        collection = Collection(cid, layout) if cid else Collection.from_seed(seed, layout)
        return protocol_state_for_round(protocol, 1, config.broadcast, key_names, collection)
    state = protocol_state_for_round(protocol, config.round, config.broadcast, key_names)
    found = state.collection
    if cid and cid != found.id:
        raise ValueError(f"--collection-id {cid} is not round 1's ({found.id}, in the broadcast): "
                         "refusing to regroup users (each would risk reporting in two groups)")
    if seed_given is not None and cid is None and Collection.from_seed(seed_given).id != found.id:
        raise ValueError("--seed differs from the seed round 1 ran with (the broadcast's collection id does not "
                         "derive from it): pass round 1's --seed, or drop --seed")
    if found.layout != layout:
        raise ValueError(f"round 1 batched users as '{found.layout}', this round as '{layout}': users would "
                         "fall into other groups; rerun with round 1's --shards/--batch-size/--users")
    if isinstance(dataset, SyntheticDataset) and seed_given is None:
        raise ValueError("a synthetic dataset is regenerated from the seed: later rounds need round 1's --seed")
    return state


def run_perturb(config: PerturbConfig, beam_args) -> dict:
    data, chosen, prefix = config.data, config.mechanism, config.prefix
    data.check_inputs()
    dry_run = runner.is_dry_run(beam_args)
    earlier = [] if dry_run and "://" in prefix else claim_prefix(prefix, config.overwrite)
    dead_letter = data.claim_dead_letter(prefix, outputs.run_id(), config.overwrite, dry_run)
    seeds = sources.Seeds.of(data)
    dataset = sources.built_in_dataset(data, seeds.data)
    dictionary, set_sizes = (None, None) if dataset is not None else sources.key_dictionary_and_sizes(data, beam_args)
    key_names = dataset.key_names if dataset is not None else dictionary
    ioh_keys = mechanism_config.resolve_ioh_keys(chosen, data, beam_args, key_names, dataset, dictionary)
    padding = resolve_padding(chosen, data, beam_args, dataset, dictionary, set_sizes)  # 'auto' -> l; warns
    mechanism = chosen.make(len(key_names), dataset, ioh_keys, padding=padding.l, kept_share=padding.kept_share)
    data = data.sized_for(mechanism, len(key_names))
    config = dataclasses.replace(config, data=data)
    r = config.round - 1
    state = perturb_state(config, mechanism, seeds.perturb, dataset, key_names)
    round_cfg = round_config(mechanism, r, state.collection)
    # the perturbing side's secrets (longitudinal device keys) and ledger: never in round_cfg or the manifest
    mechanism = devices.perturbing_side(mechanism, seeds.perturb, state.collection.id)
    devices.warn_unless_persistent(mechanism, data.seed_origin)
    devices.warn_unless_stable(mechanism, dictionary is not None and not data.key_dictionary,
                               chosen.get("padding") == AUTO)
    gate = config.ledger.gate(mechanism, seeds.perturb, state.collection.id, beam_args)
    if earlier and not dry_run:       # a dry run touches no file
        removed = manifest.clear(prefix)          # the key dictionary is rewritten by this run
        print(f"--overwrite: removed {len(removed)} file(s) of an earlier run under {prefix}", file=sys.stderr)
    p = runner.make_pipeline(beam_args)
    source = sources.user_source(p, data, dataset, dictionary, devices.needs_stable_ids(mechanism, gate))
    padding.attach(source.users, beam_args)       # set sizes measured in this job when not known yet
    reports = source.users | "Perturb" >> Perturb(mechanism, seeds.perturb, r, state, gate=gate)
    reports | "WriteReports" >> WriteReports(prefix, round_cfg)
    (key_names_pcollection(p, source.key_names) | "JoinKeys" >> beam.Map("\n".join)
     | "WriteKeys" >> beam.io.WriteToText(prefix + ".keys.txt", num_shards=1, shard_name_template=""))
    if source.dead_letter is not None:
        write_dead_letters(source.dead_letter, dead_letter)
    if dictionary is not None and not data.key_dictionary:
        print(DERIVED_DICTIONARY_WARNING, file=sys.stderr)
    # failed (a full disk, a bad input) or interrupted, in the pipeline or while writing the manifest: no
    # delivery half-made (before: a full disk at the manifest left the report files without one)
    try:
        result = runner.run_pipeline(p)
        padding.after_run()                            # warns when l truncated too many users
        stats = runner.counters(result)
        if not outputs.drop_if_empty(dead_letter):     # a run that rejected nothing leaves no dead letter
            dead_letter = None
        failure = data.account_rows(stats, dead_letter)
        # a failed ingest is delivered as failed: its manifest says so, and collect refuses it
        written = manifest.write_manifest(prefix, round_cfg, key_names, data.rating_scale(dataset), failure=failure)
    except BaseException:
        if not dry_run:
            manifest.clear(prefix, key_dictionary=True)
        raise
    if failure:
        raise sources.TooManyRejected(f"{failure}; the reports under {prefix} are marked failed in "
                                      f"{manifest.manifest_path(prefix)} and collect refuses them")
    print_perturbed(config, mechanism, key_names, written, dead_letter, state.collection.id)
    ledger = devices.print_ledger_summary(gate)
    return {"prefix": prefix, "stats": stats, "mechanism": mechanism, "collection": state.collection,
            "ledger": ledger}


def print_perturbed(config: PerturbConfig, mechanism, key_names, written: dict, dead_letter: str | None, cid: str):
    """What a perturb round wrote (``written``: ``manifest.write_manifest``'s
    summary), and round 1's collection id for a protocol that groups users."""
    prefix = config.prefix
    if dead_letter:
        print(f"rejected rows (with their reasons) written to {dead_letter}")
    print(f"{written['reports']} reports of {report.named(mechanism, key_names)}"
          f"{f' round {config.round}' if mechanism.max_rounds > 1 else ''} written to {prefix}-*.avro "
          f"({len(written['files'])} files, listed in {manifest.manifest_path(prefix)}); "
          f"key dictionary {prefix}.keys.txt")
    if mechanism.group_shares is not None and config.round == 1:
        print(f"collection id {cid} (later rounds read it from the broadcast; pass "
              f"--collection-id {cid} to make them refuse a broadcast that changes it)")


def claim_prefix(prefix: str, overwrite: bool) -> list[str]:
    """Before any compute: the report prefix is writable, and an earlier
    run's report files and manifest under it are refused unless
    ``overwrite``; returns them (what ``--overwrite`` will remove)."""
    outputs.check_writable(prefix + "-00000.avro", "--output")
    earlier = manifest.batch_files(prefix) + [p for p in (manifest.manifest_path(prefix), prefix + ".keys.txt")
                                              if FileSystems.exists(p)] + manifest.unfinished_files(prefix)
    if earlier and not overwrite:
        names = ", ".join(FileSystems.split(p)[1] for p in earlier[:3]) + (", ..." if len(earlier) > 3 else "")
        raise ValueError(f"--output {prefix}: {len(earlier)} file(s) of an earlier run are there ({names}); "
                         "pass --overwrite to replace them, or choose another --output")
    return earlier


@dataclasses.dataclass(frozen=True)
class CollectConfig:
    """One ``collect`` round: the mechanism the reports were made with, the
    report files (``input``), the key names (``key_dictionary``, else ``keys``
    unnamed keys), the round, and where the estimates, the next round's
    broadcast and IOH's counts go."""

    mechanism: MechanismConfig
    input: str
    output: str
    round: int = 1
    broadcast: str | None = None
    key_dictionary: str | None = None
    keys: int | None = None
    broadcast_out: str | None = None
    counts_out: str | None = None
    rows: int = 10
    fanout: int | None = None
    allow_partial: bool = False
    require_manifest: bool = True
    postprocess: str = DEFAULT_POSTPROCESS.name     # kvldp.mechanisms.estimation.postprocess
    rating_range: tuple[float, float] | None = None     # None: the manifest's
    overwrite: bool = False              # replace outputs an earlier run left at the paths given

    def __post_init__(self):
        if not self.key_dictionary and not self.keys:
            raise ValueError("collect needs --key-dictionary (written by perturb) or --keys d")

    @classmethod
    def from_args(cls, args) -> CollectConfig:
        return cls(MechanismConfig.from_args(args), args.input, args.output, args.round, args.broadcast,
                   args.key_dictionary, args.keys, args.broadcast_out, args.counts_out, args.rows, args.fanout,
                   args.allow_partial, args.require_manifest, args.postprocess,
                   args.rating_range, args.overwrite)


def reports_collection(pattern: str, found: dict) -> Collection:
    """Round 1's collection, as its reports (config ``found``) state it."""
    if not found.get("collection"):
        raise ValueError(f"{pattern}: the reports name no collection (made by an older kvldp?); "
                         "a multi-round protocol needs one to keep its rounds' user groups apart")
    return Collection(found["collection"], found.get("layout", ""))


def check_collection(pattern: str, found: dict, expected: dict) -> None:
    """Refuse reports of another collection with the reason spelled out."""
    if (found.get("collection"), found.get("layout")) != (expected["collection"], expected["layout"]):
        raise ValueError(
            f"{pattern}: these reports were perturbed under collection {found.get('collection')} "
            f"({found.get('layout')!r}) but this collection is {expected['collection']} "
            f"({expected['layout']!r}): users would be grouped differently from round 1 and some would "
            "report twice; refusing")


def collect_key_names(config: CollectConfig) -> list[str]:
    if config.key_dictionary:
        return sources.read_dictionary(config.key_dictionary)
    return [str(k) for k in range(config.keys)]


def collect_start(config: CollectConfig, protocol, names, found: dict):
    """``(round index, the state the round starts from, the config its
    reports must carry)``, with every report file checked against it. Round
    1 of a multi-round protocol starts the collection its reports name."""
    if protocol.max_rounds == 1 and (config.round != 1 or config.broadcast):
        raise ValueError(f"{protocol.name} has a single round: no --round/--broadcast")
    r = config.round - 1
    starts_collection = r == 0 and protocol.max_rounds > 1
    previous = protocol_state_for_round(protocol, config.round, config.broadcast, names,
                                        reports_collection(config.input, found) if starts_collection else None)
    expected = round_config(protocol, r, previous.collection)
    if protocol.max_rounds > 1:
        check_collection(config.input, found, expected)
    check_report_files(config.input, expected, found)
    return r, previous, expected


def write_broadcast(state, protocol, names, path: str):
    """The state after the round as ``broadcast.avsc``, for the next round."""
    return (state
            | "Broadcast" >> beam.FlatMap(broadcast_records, protocol, names)
            | "WriteBroadcast" >> beam.io.WriteToAvro(path, schema=schemas.load(schemas.BROADCAST),
                                                      num_shards=1, shard_name_template=""))


def run_collect(config: CollectConfig, beam_args) -> dict:
    found = report_config(config.input)    # every file's header, read once, before any compute
    names = collect_key_names(config)
    for note in manifest.check_delivery(config.input, names, config.allow_partial, config.require_manifest):
        print(note, file=sys.stderr)
    # the estimates and the files beside them (a multi-round broadcast, IOH's counts; by default named after
    # the estimates), none an earlier run's unless --overwrite
    replaced = [path for flag, path in (("--output", config.output),
                                        ("--broadcast-out", config.broadcast_out or config.output + ".broadcast.avro"),
                                        ("--counts-out", config.counts_out or config.output + ".counts.avro"))
                if outputs.claim(path, flag, config.overwrite, runner.is_dry_run(beam_args))]
    chosen, ioh_keys = config.mechanism, None
    if chosen.takes_ioh_keys():
        # the chosen keys travel with the reports; --ioh-keys may restate them
        ioh_keys = mechanism_config.named_keys(chosen.ioh_keys, names) if chosen.ioh_keys else found.get("ioh_keys")
    # --padding auto: the l the perturbing side chose, read from the reports' config
    padding = padding_from_reports(chosen, config.input, found)
    mechanism = chosen.make(len(names), ioh_keys=ioh_keys, padding=padding,
                             kept_share=kept_share_from_reports(chosen, found))
    r, previous, expected = collect_start(config, mechanism, names, found)
    p = runner.make_pipeline(beam_args)
    key_names = p | "KeyNames" >> CreateKeyNames(names)
    reports = p | "ReadReports" >> ReadReports(config.input, mechanism, r, expected)
    # reports -> counts of round r -> the state after round r -> records
    scale = config.rating_range or (manifest.rating_scale(config.input) if config.require_manifest else None)
    out = collect_graph(reports, mechanism, r, previous, key_names, config.fanout, rating_range=scale,
                        method=config.postprocess)
    out["records"] | "WriteEstimates" >> WriteEstimates(config.output)
    broadcast_out, counts_out = None, None
    if mechanism.max_rounds > 1:
        broadcast_out = config.broadcast_out or config.output + ".broadcast.avro"
        write_broadcast(out["state"], mechanism, names, broadcast_out)
    if ioh_keys is not None:
        counts_out = config.counts_out or config.output + ".counts.avro"
        ioh_counts_file(out["counts"], None, mechanism, key_names, counts_out)
    result = runner.run_pipeline(p)
    stats = runner.counters(result)
    print_collected(config, mechanism, stats, broadcast_out, counts_out, scale, replaced, names)
    return {"output": config.output, "stats": stats, "broadcast": broadcast_out, "counts": counts_out}


def print_collected(config: CollectConfig, mechanism, stats: dict, broadcast_out: str | None,
                    counts_out: str | None, rating_range=None, replaced: Sequence[str] = (), names=None):
    print(f"{stats.get('reports_read', 0)} reports collected by {report.named(mechanism, names)}")
    report.print_table(report.read_estimates(config.output), config.rows, rating_range=rating_range)
    print(f"estimates written to {config.output}"
          + (f" (replacing {', '.join(replaced)})" if replaced else ""))
    if broadcast_out:
        with FileSystems.open(broadcast_out) as fh:
            first = next(iter(fastavro.reader(fh)))
        status = "the protocol has ended" if first["stopped"] else f"next: --round {config.round + 1}"
        print(f"broadcast for the next round written to {broadcast_out} "
              f"(eps spent {first['epsilon_spent']:g}; {status})")
    if counts_out:
        print(f"IOH cell counts written to {counts_out} (query them with kvldp query --counts)")
