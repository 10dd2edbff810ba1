"""The jobs' graphs, kept apart from argument parsing so tests can build them."""
from __future__ import annotations

import json
from collections.abc import Sequence

import apache_beam as beam
from apache_beam.pvalue import AsSingleton

from kvldp import schemas
from kvldp.mechanisms.base import Estimates
from kvldp.mechanisms.estimation.postprocess import RAW, postprocess
from kvldp.mechanisms.estimation.truth import truth_counts, truth_from_counts
from kvldp.mechanisms.kv.query import pattern_truth
from kvldp.mechanisms.protocol import Protocol
from kvldp.schemas.estimate_table import EstimateTable
from kvldp.schemas.records import ioh_counts_record
from kvldp.transforms.coders import NDArray
from kvldp.transforms.collector import CollectStep
from kvldp.transforms.global_combine import ArraySumCombineFn, CombineAll
from kvldp.transforms.key_names import key_names_arg
from kvldp.transforms.rounds import RunProtocol


def to_table(est: Estimates, key_names: Sequence[str], truth=None, keys: Sequence[int] | None = None,
             rating_range: tuple[float, float] | None = None) -> EstimateTable:
    """The run's estimates as one ``EstimateTable``; ``keys`` selects the
    dictionary entries the estimates are about (all by default; IOH estimates
    its chosen keys only); ``rating_range``: the ratings' own scale, for the
    means on it."""
    every = keys is None or keys == range(len(key_names))
    names = key_names if every else [key_names[k] for k in keys]
    if truth is None:
        return EstimateTable(est, names, rating_range=rating_range)
    f, m = truth_from_counts(truth, len(key_names))
    if not every:
        f, m = f[list(keys)], m[list(keys)]
    return EstimateTable(est, names, f, m, rating_range=rating_range)


def to_records(est: Estimates, key_names: Sequence[str], truth=None, keys: Sequence[int] | None = None,
               rating_range: tuple[float, float] | None = None) -> list[dict]:
    """``to_table``'s records as a list."""
    return list(to_table(est, key_names, truth, keys, rating_range).records())


def truth_sum(users, d: int):
    """``users -> [n, holders[d], value sums[d]]`` summed (simulations only)."""
    return (users
            | "TruthCounts" >> beam.Map(truth_counts, d).with_output_types(NDArray)
            | "SumTruth" >> CombineAll(ArraySumCombineFn(1 + 2 * d)))


def final_estimates(state, protocol: Protocol, method: str = RAW) -> Estimates:
    """The state's estimates post-processed by ``method`` (``kvldp.mechanisms.estimation.postprocess``)."""
    return postprocess(protocol.estimates(state), method)


def records_of(state, protocol: Protocol, key_names, truth=None, method: str = RAW, rating_range=None):
    """``state -> EstimateTable`` post-processed by ``method`` (one element;
    with the true values when ``truth``, a one-element PCollection of
    ``truth_sum``; means also on ``rating_range``, the ratings' own scale,
    when given): the records are built as ``WriteEstimates`` writes them,
    never d elements in the runner."""
    extra = [] if truth is None else [AsSingleton(truth)]
    return (state
            | "Estimates" >> beam.Map(final_estimates, protocol, method).with_output_types(Estimates)
            | "ToTable" >> beam.Map(to_table, key_names_arg(key_names), *extra, keys=protocol.estimate_keys,
                                      rating_range=rating_range).with_output_types(EstimateTable))


def simulate_graph(source, protocol: Protocol, seed: int, fanout: int | None = None, truth: bool = True,
                   method: str = RAW, rating_range=None, draw_counts: bool = False):
    """A whole protocol as one pipeline: a ``sources.UserSource`` -> ``{"records", "state"}``
    (every round; records post-processed by ``method``), and a single-round
    protocol's ``"counts"`` (``RunProtocol``; ``draw_counts``: drawn per
    batch without reports)."""
    users = source.users
    run = users | "Protocol" >> RunProtocol(protocol, seed, fanout, later_rounds=source.recipes,
                                            draw_counts=draw_counts)
    records = records_of(run["state"], protocol, source.key_names, truth_sum(users, protocol.d) if truth else None,
                         method, rating_range)
    return {"records": records, **run}


def collect_graph(reports, protocol: Protocol, round_index: int, previous, key_names, fanout: int | None = None,
                  method: str = RAW, rating_range=None):
    """The collector's graph of one round: ``reports -> {"records", "state", "counts"}``."""
    out = reports | f"CollectRound{round_index + 1}" >> CollectStep(protocol, round_index, previous, fanout)
    return {"records": records_of(out["state"], protocol, key_names, method=method, rating_range=rating_range),
            "state": out["state"], "counts": out["counts"]}


def ioh_counts_file(counts, users, mechanism, key_names, path: str):
    """Write an IOH run's bit sums (and, with ``users``, the simulated truth)
    as ``ioh_counts.avsc`` for ``kvldp query``."""
    extra = []
    if users is not None:
        size = 2 ** mechanism.k * (1 + mechanism.k)
        extra = [AsSingleton(users
                             | "PatternTruth" >> beam.Map(pattern_truth, mechanism.ioh_keys, mechanism.d)
                             | "SumPatterns" >> CombineAll(ArraySumCombineFn(size)))]
    return (counts
            | "CountsRecord" >> beam.Map(ioh_counts_record, mechanism, key_names_arg(key_names), *extra)
            | "WriteCounts" >> beam.io.WriteToAvro(path, schema=schemas.load(schemas.IOH_COUNTS),
                                                   num_shards=1, shard_name_template=""))


def protocol_summary(state, protocol) -> str:
    """What a run did: rounds run, budget spent, the ledger."""
    return json.dumps({"mechanism": protocol.name, "epsilon": protocol.epsilon,
                       "rounds_run": state.rounds_done, "max_rounds": protocol.max_rounds,
                       "stopped_early": bool(state.stopped and state.rounds_done < protocol.max_rounds),
                       "epsilon_spent": state.epsilon_spent, "ledger": protocol.ledger.rows()})
