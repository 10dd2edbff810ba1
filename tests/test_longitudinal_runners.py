"""The same state gives the same permanent report on every runner: the Beam
pipeline's Perturb (FnApiRunner, batches in another order and another
layout) and the pure NumPy local runner draw identical memoised reports."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import BeamAssertException, assert_that

from kvldp.datasets import InMemoryDataset, SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.kv.longitudinal import longitudinal
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.privacy.memo import DeviceKeys
from kvldp.mechanisms.privacy.randomness import batch_rng
from kvldp.transforms.collector import COUNTS, CollectStep
from kvldp.transforms.perturb import Perturb

D = 15


def users():
    generated = SyntheticDataset("multi", n_users=6_000, d=D, seed=4)
    return InMemoryDataset("multi", generated.batch(0, 0, 6_000), generated.key_names)


def mechanism(name, eps_1):
    options = {"padding": 2} if name != "kvue" else {}
    return longitudinal(registry.make(name, D, 3.0, **options), eps_1, DeviceKeys.from_seed(5), "c7")


def per_user(batches) -> dict:
    """user id -> (positions, symbols) of its report."""
    out = {}
    for users, reports in batches:
        sizes = np.diff(reports.offsets)
        parts = np.cumsum(sizes)[:-1]
        for uid, p, s in zip(users.user_ids.tolist(), np.split(reports.positions, parts),
                             np.split(reports.symbols, parts), strict=True):
            out[uid] = (p.tolist(), s.tolist())
    return out


@pytest.mark.parametrize("name", ["pckv-ue", "pckv-grr", "ks-ue", "kvue"])
def test_beam_and_local_runners_draw_the_same_permanent_reports(name):
    mech = mechanism(name, None)
    data = users()
    local = per_user((u, mech.perturb(u, batch_rng(1, u.batch_id))) for u in data.batches(2_500))
    specs = list(reversed(data.specs(1_000)))       # another layout, another order
    with beam.Pipeline(runner=FnApiRunner()) as p:
        batches = p | beam.Create(specs) | beam.Reshuffle() | beam.MapTuple(data.batch)
        reports = batches | Perturb(mech, seed=2)
        paired = ({"users": batches | "KeyU" >> beam.Map(lambda u: (u.batch_id, u)),
                   "reports": reports | "KeyR" >> beam.Map(lambda r: (r.batch_id, r))}
                  | beam.CoGroupByKey()
                  | beam.Map(lambda kv: (kv[1]["users"][0], kv[1]["reports"][0]))
                  | beam.combiners.ToList())

        def same(actual):
            if per_user(actual[0]) != local:
                raise BeamAssertException("the pipeline's permanent reports differ from the local runner's")
        assert_that(paired, same)


@pytest.mark.parametrize("name", ["pckv-ue", "kvue"])
def test_two_layer_pipeline_counts_equal_the_local_runner(name):
    mech = mechanism(name, 1.0)
    data = users()
    local = run_local(mech, data, seed=9, batch_size=1_500)
    with beam.Pipeline(runner=FnApiRunner()) as p:
        counts = (p | beam.Create(data.specs(1_500)) | beam.Reshuffle() | beam.MapTuple(data.batch)
                  | Perturb(mech, seed=9) | CollectStep(mech, fanout=2))[COUNTS]

        def same(actual):
            if len(actual) != 1 or not np.array_equal(actual[0], local.counts):
                raise BeamAssertException("two-layer counts differ")
        assert_that(counts, same)
