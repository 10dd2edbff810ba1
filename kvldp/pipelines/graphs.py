"""The jobs' graphs, kept apart from argument parsing so tests can build them."""
from __future__ import annotations

import json
from typing import Sequence

import apache_beam as beam
from apache_beam.pvalue import AsSingleton

from kvldp.mechanisms.base import Estimates, Mechanism
from kvldp.mechanisms.truth import truth_counts, truth_from_counts
from kvldp.mechanisms.protocol import Protocol
from kvldp import schemas
from kvldp.mechanisms.query import pattern_truth
from kvldp.schemas.records import estimate_records, ioh_counts_record
from kvldp.transforms.accumulate import Accumulate, ArraySumCombineFn, Calibrate
from kvldp.transforms.rounds import RunProtocol


def to_records(est: Estimates, key_names: Sequence[str], truth=None, keys: Sequence[int] | None = None):
    """Estimate records; ``keys`` selects the dictionary entries the estimates
    are about (all by default; IOH estimates its chosen keys only)."""
    keys = list(range(len(key_names))) if keys is None else list(keys)
    names = [key_names[k] for k in keys]
    if truth is None:
        return estimate_records(est, names)
    f, m = truth_from_counts(truth, len(key_names))
    return estimate_records(est, names, f[keys], m[keys])


def estimate_graph(reports, mechanism: Mechanism, key_names, users=None, fanout: int | None = None):
    """``reports -> (estimate records, counts)``: the collector's whole graph.

    ``key_names``: a PCollection holding one list of item ids. With
    ``users`` (simulations only) the true values are attached to every record.
    """
    counts = reports | "Accumulate" >> Accumulate(mechanism, fanout=fanout)
    estimates = counts | "Calibrate" >> Calibrate(mechanism)
    truth = []
    if users is not None:
        truth = [AsSingleton(users
                             | "TruthCounts" >> beam.Map(truth_counts, mechanism.d)
                             | "SumTruth" >> beam.CombineGlobally(ArraySumCombineFn(1 + 2 * mechanism.d)))]
    # estimates: one Estimates -> records: one dict per key
    records = estimates | "ToRecords" >> beam.FlatMap(to_records, AsSingleton(key_names), *truth,
                                                      keys=mechanism.estimate_keys)
    return records, counts


def collect_estimates(reports, mechanism: Mechanism, key_names, fanout: int | None = None):
    """``reports -> estimate records``."""
    return estimate_graph(reports, mechanism, key_names, fanout=fanout)[0]


def ioh_counts_file(counts, users, mechanism, key_names, path: str):
    """Write an IOH run's bit sums (and, with ``users``, the simulated truth)
    as ``ioh_counts.avsc`` for ``kvldp query``."""
    extra = []
    if users is not None:
        size = 2 ** mechanism.k * (1 + mechanism.k)
        extra = [AsSingleton(users
                             | "PatternTruth" >> beam.Map(pattern_truth, mechanism.ioh_keys, mechanism.d)
                             | "SumPatterns" >> beam.CombineGlobally(ArraySumCombineFn(size)))]
    return (counts
            | "CountsRecord" >> beam.Map(ioh_counts_record, mechanism, AsSingleton(key_names), *extra)
            | "WriteCounts" >> beam.io.WriteToAvro(path, schema=schemas.load(schemas.IOH_COUNTS),
                                                   num_shards=1, shard_name_template=""))


def protocol_summary(state, protocol) -> str:
    """What a multi-round run did: rounds run, budget spent, the ledger."""
    return json.dumps({"mechanism": protocol.name, "epsilon": protocol.epsilon,
                       "rounds_run": state.rounds_done, "max_rounds": protocol.max_rounds,
                       "stopped_early": bool(state.stopped and state.rounds_done < protocol.max_rounds),
                       "epsilon_spent": state.epsilon_spent, "ledger": protocol.ledger.rows()})


def protocol_estimates(users, protocol: Protocol, seed: int, key_names, truth: bool = True):
    """A whole multi-round protocol as one pipeline: ``users -> (records, summary)``.

    The final ``ProtocolState`` becomes the estimate records (with the
    simulated truth when ``truth``) and a one-line JSON summary.
    """
    state = users | "Protocol" >> RunProtocol(protocol, seed)
    estimates = state | "FinalEstimates" >> beam.Map(protocol.estimates)
    summary = state | "Summary" >> beam.Map(protocol_summary, protocol)
    if not truth:
        return estimates | "ToRecords" >> beam.FlatMap(to_records, AsSingleton(key_names)), summary
    truth_sum = (users
                 | "TruthCounts" >> beam.Map(truth_counts, protocol.d)
                 | "SumTruth" >> beam.CombineGlobally(ArraySumCombineFn(1 + 2 * protocol.d)))
    records = estimates | "ToRecords" >> beam.FlatMap(to_records, AsSingleton(key_names), AsSingleton(truth_sum))
    return records, summary
