"""Estimates written from one table, chunk by chunk (issue 17): the same
records and bytes as the record-per-element path, and a graph whose size
does not grow with d."""
from __future__ import annotations

import csv
import io
import json
import pickle

import apache_beam as beam
import fastavro
import numpy as np
import pytest
from apache_beam.internal import pickler
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from kvldp import schemas
from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.local import run_local
from kvldp.pipelines.graphs import to_records, to_table
from kvldp.pipelines.report import read_estimates
from kvldp.schemas.estimate_table import EstimateTable, slice_estimates
from kvldp.schemas.records import estimate_records
from kvldp.transforms.io import WriteEstimates, write_estimate_table


def _run(d=7, name="pckv-ue"):
    mech = registry.make(name, d, 2.0)
    data = SyntheticDataset("gg", n_users=3_000, d=d, seed=4)
    return mech, run_local(mech, data, 9, 1_000)


def test_chunked_records_equal_the_whole_tables_records():
    mech, res = _run(d=23)
    names = [f"item {k}" for k in range(23)]
    table = to_table(res.estimates, names, res.truth, keys=mech.estimate_keys, rating_range=(1.0, 5.0))
    whole = list(table.records(chunk=10**6))
    assert list(table.records(chunk=5)) == whole == list(table.records(chunk=1))
    assert [r["key"] for r in whole] == names
    assert whole == to_records(res.estimates, names, res.truth, rating_range=(1.0, 5.0))


def test_slicing_keeps_scalars_and_slices_every_per_key_array():
    _, res = _run(d=10)
    part = slice_estimates(res.estimates, 3, 7)
    assert part.d == 4 and part.n_reports == res.estimates.n_reports and part.mechanism == res.estimates.mechanism
    assert np.array_equal(part.frequency_raw, res.estimates.frequency_raw[3:7], equal_nan=True)
    assert list(part.mean_status) == list(res.estimates.mean_status[3:7])


def test_a_table_needs_one_name_per_estimate():
    _, res = _run(d=5)
    with pytest.raises(ValueError, match="4 key names for 5 estimates"):
        EstimateTable(res.estimates, ["a", "b", "c", "d"])


@pytest.mark.parametrize("fmt", ["jsonl", "csv", "avro"])
def test_written_file_is_the_records_in_the_format(fmt, monkeypatch):
    """Text files byte for byte as ``WriteToText`` wrote one record per line
    (CSV: the header first); Avro: the same records under estimate.avsc."""
    monkeypatch.setattr("kvldp.transforms.io.ESTIMATE_LINES_PER_WRITE", 3)    # several writes, one partial
    _, res = _run(d=11)
    names = [f"k,{k}" if k % 4 == 0 else f"k{k}" for k in range(11)]           # commas to quote in CSV
    table = EstimateTable(res.estimates, names)
    records = estimate_records(res.estimates, names)
    buf = io.BytesIO()
    assert write_estimate_table(buf, table, fmt) == 11
    data = buf.getvalue()
    if fmt == "jsonl":
        assert data == "".join(json.dumps(r) + "\n" for r in records).encode()
    elif fmt == "csv":
        out = io.StringIO()
        out.write(",".join(schemas.ESTIMATE_FIELDS) + "\n")
        for r in records:
            w = io.StringIO()
            csv.writer(w, lineterminator="").writerow(["" if r[f] is None else r[f] for f in schemas.ESTIMATE_FIELDS])
            out.write(w.getvalue() + "\n")
        assert data == out.getvalue().encode()
    else:
        assert list(fastavro.reader(io.BytesIO(data))) == records


@pytest.mark.parametrize("ext", ["jsonl", "avro"])
def test_the_pipeline_writes_the_table_and_counts_it(tmp_path, ext):
    _, res = _run(d=6)
    names = list("abcdef")
    path = str(tmp_path / f"est.{ext}")
    p = beam.Pipeline(runner=FnApiRunner())
    _ = p | beam.Create([EstimateTable(res.estimates, names)]) | WriteEstimates(path)
    result = p.run()
    result.wait_until_finish()
    assert read_estimates(path) == estimate_records(res.estimates, names)
    written = result.metrics().query()["counters"]
    assert sum(c.committed for c in written if c.key.metric.name == "estimates_written") == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"est.{ext}"]      # no temporary file left


def test_what_the_graph_pickles_does_not_grow_with_d():
    """A d = 10^6 synthetic dataset and a protocol's key list travel inside
    the DoFns Beam pickles (bz2) for every stage; pickled whole they were
    10 MB and 0.7 MB there and took 3-7 s per stage."""
    big = SyntheticDataset("gg", n_users=10, d=1_000_000, seed=2)
    assert len(pickle.dumps(big)) < 2_000
    back = pickler.loads(pickler.dumps(big))
    assert np.array_equal(back.key_probs, big.key_probs) and np.array_equal(back.key_means, big.key_means)
    assert back.batch(0, 0, 10).keys.tolist() == big.batch(0, 0, 10).keys.tolist()
    mech = registry.make("pckv-ue", 1_000_000, 2.0)
    assert len(pickle.dumps(mech.estimate_keys)) < 100
