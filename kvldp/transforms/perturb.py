"""Client-side perturbation as a batched DoFn.

One element is a ``UserBatch`` (thousands to hundreds of thousands of users);
the DoFn calls ``mechanism.perturb`` once per batch with a generator derived
from the run seed and the batch's id, so a retried bundle emits exactly the
same reports and element order never matters.
"""
from __future__ import annotations

import apache_beam as beam
from apache_beam.metrics import Metrics

from kvldp.mechanisms.base import Mechanism, UserBatch
from kvldp.mechanisms.randomness import batch_rng


class PerturbBatchFn(beam.DoFn):
    """``UserBatch -> ReportBatch`` with ``batch_rng(seed, batch.batch_id)``."""

    def __init__(self, mechanism: Mechanism, seed: int):
        self._mechanism = mechanism
        self._seed = seed
        self._users = Metrics.counter("kvldp", "users_perturbed")
        self._reports = Metrics.counter("kvldp", "reports_emitted")

    def process(self, users: UserBatch):
        reports = self._mechanism.perturb(users, batch_rng(self._seed, users.batch_id))
        self._users.inc(users.n_users)
        self._reports.inc(reports.n_reports)
        yield reports


class Perturb(beam.PTransform):
    """``PCollection[UserBatch] -> PCollection[ReportBatch]``."""

    def __init__(self, mechanism: Mechanism, seed: int, label: str | None = None):
        super().__init__(label)
        self._mechanism = mechanism
        self._seed = seed

    def expand(self, users):
        return users | "PerturbBatches" >> beam.ParDo(PerturbBatchFn(self._mechanism, self._seed))
