"""Beam wiring: the pipeline reproduces the local runner exactly, the
CombineFn merges in any order, perturbation is retry-safe, ReadRatings
accounts for every row."""
from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import BeamAssertException, assert_that

from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.privacy.randomness import batch_rng
from kvldp.pipelines.graphs import collect_graph
from kvldp.runtime.jobs import counters
from kvldp.transforms.collector import COUNTS, CollectStep, RoundCombineFn
from kvldp.transforms.io import WriteEstimates
from kvldp.transforms.perturb import Perturb, PerturbFn
from kvldp.transforms.rating_files import DEAD_LETTER
from kvldp.transforms.ratings import ReadRatings


def _matches(expected: np.ndarray):
    def check(actual):
        if len(actual) != 1 or not np.array_equal(actual[0], expected):
            raise BeamAssertException(f"counts differ: {actual} != {expected}")
    return check


@pytest.mark.parametrize("name", ["pckv-ue", "pckv-grr"])
def test_pipeline_counts_equal_local_runner(name):
    """Same seed -> the pipeline's counts equal the local runner's, element
    order and worker threads notwithstanding (counts are integer sums)."""
    mech = registry.make(name, 30, 2.0)
    data = SyntheticDataset("uu", n_users=40_000, d=30, seed=5)
    local = run_local(mech, data, seed=9, batch_size=7_000)
    specs = list(reversed(data.specs(7_000)))   # a different element order
    with beam.Pipeline(runner=FnApiRunner()) as p:
        counts = (p | beam.Create(specs) | beam.Reshuffle() | beam.MapTuple(data.batch)
                  | Perturb(mech, seed=9) | CollectStep(mech, fanout=3))[COUNTS]
        assert_that(counts, _matches(local.counts))


def test_perturb_is_retry_safe():
    """Processing the same batch twice (a retried bundle) yields identical
    reports; another batch id yields other reports."""
    mech = registry.make("pckv-ue", 20, 1.0)
    users = SyntheticDataset("uu", n_users=5_000, d=20, seed=1).batch(3, 0, 5_000)
    fn = PerturbFn(mech, seed=42)
    first, again = next(iter(fn.process(users))), next(iter(fn.process(users)))
    assert first.equals(again)
    other = UserBatch(users.offsets, users.keys, users.values, batch_id=4)
    assert not next(iter(fn.process(other))).equals(first)


def test_combine_fn_merges_in_any_order():
    mech = registry.make("pckv-grr", 10, 1.0)
    fn = RoundCombineFn(mech)
    data = SyntheticDataset("uu", n_users=3_000, d=10, seed=2)
    parts = []
    for spec in data.specs(1_000):
        acc = fn.create_accumulator()
        parts.append(fn.add_input(acc, mech.perturb(data.batch(*spec), batch_rng(1, spec[0]))))
    a = fn.merge_accumulators([parts[0], fn.merge_accumulators(parts[1:])])
    b = fn.merge_accumulators(list(reversed(parts)))
    assert np.array_equal(a, b) and a[0] == 3_000
    assert fn.create_accumulator() is not fn.create_accumulator()


def test_windowed_accumulation():
    """Counts per fixed window (streaming-style), without defaults."""
    from apache_beam.transforms import window

    mech = registry.make("pckv-grr", 10, 1.0)
    data = SyntheticDataset("uu", n_users=4_000, d=10, seed=3)
    specs = data.specs(1_000)
    with beam.Pipeline(runner=FnApiRunner()) as p:
        counts = (p | beam.Create(specs) | beam.MapTuple(data.batch)
                  | beam.Map(lambda b: window.TimestampedValue(b, 10.0 * (b.batch_id // 2)))
                  | beam.WindowInto(window.FixedWindows(10))
                  | Perturb(mech, seed=1) | CollectStep(mech, per_window=True))[COUNTS] \
            | beam.Map(lambda c: int(c[0]))
        assert_that(counts, lambda got: _assert(sorted(got) == [2_000, 2_000], got))



def test_windowed_calibration_equals_the_local_estimates_of_each_window():
    """The collector's step per fixed window: each window's Estimates are
    exactly the local runner's over that window's batches."""
    from apache_beam.transforms import window

    from kvldp.mechanisms.privacy.randomness import batch_rng

    mech = registry.make("pckv-grr", 10, 1.0)
    data = SyntheticDataset("uu", n_users=4_000, d=10, seed=3)
    expected = []
    for first in (0, 2):
        counts = mech.new_counts()
        for b in (first, first + 1):
            mech.accumulate(counts, mech.perturb(data.batch(*data.specs(1_000)[b]), batch_rng(1, b)))
        expected.append(mech.estimate(counts).frequency)
    with beam.Pipeline(runner=FnApiRunner()) as p:
        est = (p | beam.Create(data.specs(1_000)) | beam.MapTuple(data.batch)
               | beam.Map(lambda b: window.TimestampedValue(b, 10.0 * (b.batch_id // 2)))
               | beam.WindowInto(window.FixedWindows(10))
               | Perturb(mech, seed=1) | CollectStep(mech, per_window=True))["state"] | beam.Map(mech.estimates)
        assert_that(est, lambda got: _assert(
            sorted(sum(np.array_equal(e.frequency, x) for e in got) for x in expected) == [1, 1], got))

def _assert(cond, got):
    if not cond:
        raise BeamAssertException(f"unexpected: {got}")


def _write_csv(path, rows):
    path.write_text("user,item,rating\n" + "\n".join(rows) + "\n")


def test_read_ratings_dead_letters_and_accounting(tmp_path):
    """Every kind of bad row is rejected with its reason and rows read =
    accepted + rejected; accepted users are grouped and normalised."""
    f = tmp_path / "r.csv"
    _write_csv(f, ["u1,A,5", "u1,B,3", "u2,A,1", "u3,B,2", "u3,B,5", "u4,A,nan", "u5,Z,3", "u6,A,9",
                   "u7,A", "u8,,3", "u9,C,x"])
    out = tmp_path / "dead.jsonl"
    users_out = tmp_path / "users.json"
    p = beam.Pipeline(runner=FnApiRunner())
    read = p | ReadRatings(str(f), (1.0, 5.0), key_dictionary=["A", "B", "C"], shards=3)
    (read[DEAD_LETTER] | beam.Map(json.dumps, default=str)
     | "WD" >> beam.io.WriteToText(str(out), num_shards=1, shard_name_template=""))
    (read["users"] | beam.Map(lambda b: json.dumps({"n": b.n_users, "sizes": b.sizes.tolist(),
                                                      "keys": b.keys.tolist(), "values": b.values.tolist()}))
     | "WU" >> beam.io.WriteToText(str(users_out), num_shards=1, shard_name_template=""))
    result = p.run()
    result.wait_until_finish()
    stats = counters(result)
    dead = [json.loads(x) for x in out.read_text().splitlines()]
    reasons = sorted(d["reason"].split(":")[0] for d in dead)
    assert reasons == sorted(["duplicate key for one user"] * 2 + ["value is NaN or infinite", "unknown key",
                                                                     "value outside the declared rating range [1, 5]",
                                                                     "malformed row", "malformed row",
                                                                     "malformed row"])
    assert stats["rows_read"] == 11
    assert stats["rows_accepted"] == 3 and stats["rows_rejected"] == 8
    batches = [json.loads(x) for x in users_out.read_text().splitlines()]
    assert sum(b["n"] for b in batches) == 2           # u1 and u2; u3's only key was duplicated
    values = sorted(v for b in batches for v in b["values"])
    assert values == [-1.0, 0.0, 1.0]                  # 1 -> -1, 3 -> 0, 5 -> 1


def test_read_ratings_batches_do_not_depend_on_row_order(tmp_path):
    """Shard content (and so its random stream) is the same whatever the
    order of rows in the files."""
    rng = np.random.default_rng(0)
    rows = [f"u{u},{k},{rng.integers(1, 6)}" for u in range(300) for k in rng.choice(8, 2, replace=False)]
    a, b = tmp_path / "a.csv", tmp_path / "b.csv"
    _write_csv(a, rows)
    _write_csv(b, list(reversed(rows)))
    mech = registry.make("pckv-ue", 8, 1.0, padding=2)
    got = []
    for f in (a, b):
        with beam.Pipeline(runner=FnApiRunner()) as p:
            counts = (p | ReadRatings(str(f), (1, 5), [str(k) for k in range(8)], shards=4))["users"]
            got.append((counts | Perturb(mech, seed=7) | CollectStep(mech))[COUNTS]
                       | beam.Map(lambda c, path=str(tmp_path / f"{f.stem}.npy"): np.save(path, c)))
    assert np.array_equal(np.load(tmp_path / "a.npy"), np.load(tmp_path / "b.npy"))


@pytest.mark.parametrize("ext", ["avro", "jsonl", "csv"])
def test_write_estimates_formats(tmp_path, ext):
    from kvldp.plots.tables import read_estimates

    mech = registry.make("pckv-grr", 5, 2.0)
    data = SyntheticDataset("uu", n_users=2_000, d=5, seed=1)
    path = str(tmp_path / f"est.{ext}")
    with beam.Pipeline(runner=FnApiRunner()) as p:
        reports = p | beam.Create(data.specs(1_000)) | beam.MapTuple(data.batch) | Perturb(mech, 3)
        names = p | "Names" >> beam.Create([["a", "b", "c", "d", "e"]])
        collect_graph(reports, mech, 0, None, names)["records"] | WriteEstimates(path)
    records = read_estimates(path)
    assert sorted(r["key"] for r in records) == ["a", "b", "c", "d", "e"]
    local = run_local(mech, data, 3, 1_000).estimates
    by_key = {r["key"]: r for r in records}
    assert np.allclose([by_key[k]["frequency"] for k in "abcde"], local.frequency)
    assert all(r["n_reports"] == 2_000 for r in records)


def test_read_ratings_avro_and_jsonl_agree_with_csv(tmp_path):
    """The three input formats yield the same users (Avro per rating.avsc)."""
    import fastavro

    from kvldp import schemas

    rows = [("u1", "A", 5.0), ("u1", "B", 3.0), ("u2", "A", 1.0), ("u3", "C", 4.0), ("u3", "C", 2.0)]
    _write_csv(tmp_path / "r.csv", [f"{u},{i},{r}" for u, i, r in rows])
    (tmp_path / "r.jsonl").write_text("\n".join(json.dumps({"user": u, "item": i, "rating": r}) for u, i, r in rows))
    with open(tmp_path / "r.avro", "wb") as fh:
        fastavro.writer(fh, schemas.parsed(schemas.RATING), [{"user": u, "item": i, "rating": r} for u, i, r in rows])
    seen = {}
    for ext in ("csv", "jsonl", "avro"):
        out = tmp_path / f"users-{ext}.json"
        with beam.Pipeline(runner=FnApiRunner()) as p:
            read = p | ReadRatings(str(tmp_path / f"r.{ext}"), (1, 5), ["A", "B", "C"], shards=2)
            (read["users"] | beam.Map(lambda b: (b.batch_id, b.sizes.tolist(), b.keys.tolist(), b.values.tolist()))
             | beam.combiners.ToList() | beam.Map(lambda xs: json.dumps(sorted(xs)))
             | beam.io.WriteToText(str(out), num_shards=1, shard_name_template=""))
        seen[ext] = out.read_text()
    assert seen["csv"] == seen["jsonl"] == seen["avro"]
    batches = json.loads(seen["csv"])
    assert sum(len(sizes) for _, sizes, _, _ in batches) == 2      # u3 rejected: C twice


def _stream_of(batches, spacing=10):
    """Batches arriving over event time, one every ``spacing`` seconds."""
    from apache_beam.testing.test_stream import TestStream
    from apache_beam.transforms import window

    stream = TestStream()
    for i, b in enumerate(batches):
        stream = stream.advance_watermark_to(spacing * i).add_elements(
            [window.TimestampedValue(b, spacing * i + 1)])
    return stream.advance_watermark_to_infinity()


def test_streaming_windows_and_early_firings():
    """On the streaming DirectRunner: report batches arriving over event time
    are counted per fixed window, and with early firings (accumulating) the
    last pane holds every report of its window."""
    from apache_beam.options.pipeline_options import PipelineOptions
    from apache_beam.transforms import trigger, window

    mech = registry.make("pckv-grr", 10, 1.0)
    data = SyntheticDataset("uu", n_users=4_000, d=10, seed=3)
    batches = [data.batch(*s) for s in data.specs(1_000)]
    with beam.Pipeline(runner="DirectRunner", options=PipelineOptions(["--streaming"])) as p:
        counts = (p | _stream_of(batches) | beam.WindowInto(window.FixedWindows(20))
                  | Perturb(mech, seed=1) | CollectStep(mech, per_window=True))[COUNTS] | beam.Map(lambda c: int(c[0]))
        assert_that(counts, lambda got: _assert(sorted(got) == [2_000, 2_000], got))
    with beam.Pipeline(runner="DirectRunner", options=PipelineOptions(["--streaming"])) as p:
        panes = (p | _stream_of(batches)
                 | beam.WindowInto(window.GlobalWindows(),
                                   trigger=trigger.Repeatedly(trigger.AfterCount(1)),
                                   accumulation_mode=trigger.AccumulationMode.ACCUMULATING)
                 | Perturb(mech, seed=1) | CollectStep(mech, per_window=True))[COUNTS] | beam.Map(lambda c: int(c[0]))
        # each firing reports the running total of users seen so far
        assert_that(panes, lambda got: _assert(len(got) >= 2 and max(got) == 4_000 and min(got) >= 1_000, got))
