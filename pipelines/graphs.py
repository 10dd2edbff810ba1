"""The jobs' graphs, kept apart from argument parsing so tests can build them."""
from __future__ import annotations

import json
from typing import Sequence

import apache_beam as beam
from apache_beam.pvalue import AsSingleton

from mechanisms.base import Estimates, Mechanism
from mechanisms.datasets import truth_counts, truth_from_counts
from mechanisms.protocol import Protocol
from schemas.records import estimate_records
from transforms.accumulate import Accumulate, ArraySumCombineFn, Calibrate
from transforms.rounds import RunProtocol


def to_records(est: Estimates, key_names: Sequence[str], truth=None):
    if truth is None:
        return estimate_records(est, key_names)
    f, m = truth_from_counts(truth, est.d)
    return estimate_records(est, key_names, f, m)


def collect_estimates(reports, mechanism: Mechanism, key_names, fanout: int | None = None):
    """``reports -> estimate records`` (the collector's whole graph).

    ``key_names``: a PCollection holding one list of item ids.
    """
    estimates = (reports
                 | "Accumulate" >> Accumulate(mechanism, fanout=fanout)
                 | "Calibrate" >> Calibrate(mechanism))
    # estimates: one Estimates -> records: one dict per key
    return estimates | "ToRecords" >> beam.FlatMap(to_records, AsSingleton(key_names))


def simulate_estimates(users, reports, mechanism: Mechanism, key_names, fanout: int | None = None):
    """As :func:`collect_estimates`, with the truth of the simulated users
    attached to every record (the simulation knows it; a collector never does)."""
    d = mechanism.d
    truth = (users
             | "TruthCounts" >> beam.Map(truth_counts, d)
             | "SumTruth" >> beam.CombineGlobally(ArraySumCombineFn(1 + 2 * d)))
    estimates = (reports
                 | "Accumulate" >> Accumulate(mechanism, fanout=fanout)
                 | "Calibrate" >> Calibrate(mechanism))
    return estimates | "ToRecords" >> beam.FlatMap(to_records, AsSingleton(key_names), AsSingleton(truth))


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
