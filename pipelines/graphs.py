"""The jobs' graphs, kept apart from argument parsing so tests can build them."""
from __future__ import annotations

from typing import Sequence

import apache_beam as beam
from apache_beam.pvalue import AsSingleton

from mechanisms.base import Estimates, Mechanism
from mechanisms.datasets import truth_counts, truth_from_counts
from schemas.records import estimate_records
from transforms.accumulate import Accumulate, ArraySumCombineFn, Calibrate


def _records(est: Estimates, key_names: Sequence[str], truth=None):
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
    return estimates | "ToRecords" >> beam.FlatMap(_records, AsSingleton(key_names))


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
    return estimates | "ToRecords" >> beam.FlatMap(_records, AsSingleton(key_names), AsSingleton(truth))
