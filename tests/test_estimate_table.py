"""Estimates written from one table, chunk by chunk (issue 17): the same
records and bytes as the record-per-element path, and a graph whose size
does not grow with d."""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
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
from kvldp.plots.tables import read_estimates
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
    monkeypatch.setattr("kvldp.schemas.estimate_table.CHUNK_KEYS", 3)    # several chunks, one partial
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


@pytest.mark.parametrize("ext", ["jsonl", "csv", "avro"])
def test_read_back_gives_the_records_and_their_columns(tmp_path, ext):
    _, res = _run(d=9)
    names = [f"k,{k}" for k in range(9)]
    table = to_table(res.estimates, names, None, rating_range=(1.0, 5.0))
    path = tmp_path / f"est.{ext}"
    with open(path, "wb") as fh:
        write_estimate_table(fh, table, ext)
    records = estimate_records(res.estimates, names, rating_range=(1.0, 5.0))
    back = read_estimates(str(path))
    assert len(back) == 9 and list(back) == records and back[-1] == records[-1] and back[2:4] == records[2:4]
    f = back.column("frequency")
    assert np.array_equal(f, [np.nan if r["frequency"] is None else r["frequency"] for r in records],
                          equal_nan=True)
    assert np.isnan(back.column("true_frequency")).all()
    assert list(back.column("key")) == names


def test_reading_back_a_large_file_holds_columns_not_dicts(tmp_path):
    """200,000 records as dicts take ~300 MB; as columns ~30 MB, ~61 MB at
    the peak of pyarrow's parse (22 double columns: 35 kB a column)."""
    import tracemalloc

    d = 200_000
    est = slice_estimates(_run(d=7)[1].estimates, 0, 1)
    big = dataclasses.replace(est, **{f.name: np.repeat(getattr(est, f.name), d)
                                      for f in dataclasses.fields(est)
                                      if isinstance(getattr(est, f.name), np.ndarray)})
    path = tmp_path / "big.jsonl"
    with open(path, "wb") as fh:
        write_estimate_table(fh, EstimateTable(big, [str(k) for k in range(d)]), "jsonl")
    tracemalloc.start()
    back = read_estimates(str(path))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert len(back) == d and back[d - 1]["key"] == str(d - 1)
    assert peak < 75e6


def _reference_records(est, names, true_f=None, true_m=None, rating_range=None) -> list[dict]:
    """The records as they were built before the columns, key by key."""
    def opt(x):
        x = float(x)
        return x if np.isfinite(x) else None

    lo, hi = rating_range or (np.nan, np.nan)
    held = [k for k in range(len(names)) if np.isfinite(est.frequency[k])]
    total = (est.frequency_total, est.frequency_total_se) if est.frequency_total is not None else (
        sum(float(est.frequency_raw[k]) for k in held), math.sqrt(sum(float(est.frequency_se[k]) ** 2 for k in held)))
    out = []
    for k, name in enumerate(names):
        rating = (lo + (est.mean[k] + 1.0) * (hi - lo) / 2.0, est.mean_se[k] * (hi - lo) / 2.0)
        out.append({
            "key": str(name), "frequency": opt(est.frequency[k]), "mean": opt(est.mean[k]),
            "frequency_raw": opt(est.frequency_raw[k]), "mean_raw": opt(est.mean_raw[k]),
            "frequency_se": opt(est.frequency_se[k]), "mean_se": opt(est.mean_se[k]),
            **{f: None if getattr(est, f) is None else opt(getattr(est, f)[k])
               for f in ("frequency_lo", "frequency_hi", "mean_lo", "mean_hi")},
            "mean_rating": opt(rating[0]), "mean_rating_se": opt(rating[1]),
            "frequency_status": str(est.frequency_status[k]), "mean_status": str(est.mean_status[k]),
            "postprocess": est.postprocess or "raw", "n_reports": int(est.n_reports), "mechanism": est.mechanism,
            "epsilon": float(est.epsilon), "padding": est.padding, "kept_share": float(est.kept_share),
            "frequency_total": opt(total[0]), "frequency_total_se": opt(total[1]),
            "true_frequency": None if true_f is None else opt(true_f[k]),
            "true_mean": None if true_m is None else opt(true_m[k])})
    return out


@pytest.mark.parametrize("postprocessed", [False, True])
@pytest.mark.parametrize("simulated", [False, True])
def test_columns_make_the_records_and_lines_of_the_key_by_key_path(postprocessed, simulated):
    """``estimate_records`` and the JSONL/CSV lines, now built a column at a
    time, equal the old per-key records and ``json.dumps``/``csv`` of them,
    byte for byte: NaN, inf and absent columns as null, names to quote or
    escape, the run's scalars, the truth and the rating scale."""
    from kvldp.mechanisms.estimation.postprocess import postprocess
    from kvldp.schemas.records import estimate_lines

    _, res = _run(d=9, name="privkv")
    est = postprocess(res.estimates, "eb+shrink") if postprocessed else res.estimates
    arrays = {f: np.array(getattr(est, f), dtype=np.float64) for f in ("frequency", "mean", "frequency_raw")}
    arrays["frequency"][1], arrays["mean"][2], arrays["frequency_raw"][3] = np.inf, -np.inf, -0.0
    est = dataclasses.replace(est, **arrays)
    names = ["plain", "com,ma", 'quo"te', "new\nline", "", "ünï", "tab\there", "cr\rx", "é,\"mix\""]
    truth = (np.linspace(0, 1, 9), np.where(np.arange(9) % 3 == 0, np.nan, 0.25)) if simulated else (None, None)
    rating = (1.0, 5.0) if simulated else None
    reference = _reference_records(est, names, *truth, rating)
    assert estimate_records(est, names, *truth, rating_range=rating) == reference
    assert estimate_lines(est, names, "jsonl", *truth, rating_range=rating) == [json.dumps(r) for r in reference]
    rows = []
    for r in reference:
        w = io.StringIO()
        csv.writer(w, lineterminator="").writerow(["" if r[f] is None else r[f] for f in schemas.ESTIMATE_FIELDS])
        rows.append(w.getvalue())
    assert estimate_lines(est, names, "csv", *truth, rating_range=rating) == rows


def _columns_of(records) -> dict:
    return {f: (col.tobytes() if hasattr(col, "tobytes") else list(col)) for f, col in records._columns.items()}


@pytest.mark.parametrize("case", ["written", "truth and blanks", "fields vary", "extra and windowed"])
def test_jsonl_read_a_column_at_a_time_equals_record_by_record(tmp_path, case):
    """pyarrow's reader gives the columns the record-by-record path gives:
    same fields in the same order, the same doubles bit for bit (NaN for
    null), the same ints and strings."""
    from kvldp.schemas.estimate_columns import EstimateRecords, _jsonl_columns, read_estimate_records
    from kvldp.schemas.records import estimate_lines

    _, res = _run(d=9, name="privkv")
    est = res.estimates
    names = [f"k{k}" for k in range(9)]
    truth = (np.linspace(0, 1, 9), np.where(np.arange(9) % 3 == 0, np.nan, 1 / 3)) if case != "written" else (None,) * 2
    lines = estimate_lines(est, names, "jsonl", *truth, rating_range=(1.0, 5.0))
    if case == "truth and blanks":
        lines = ["", *lines[:4], "   ", *lines[4:]]
    elif case == "fields vary":      # a later record lacks a field, another brings a new one
        recs = [json.loads(x) for x in lines]
        del recs[3]["mean_se"]
        recs[5]["note"] = "late field"
        lines = [json.dumps(r) for r in recs]
    elif case == "extra and windowed":
        lines = [json.dumps({"window_start": 1767225600000, "pane_index": 3, **json.loads(x), "x": [1, 2]})
                 for x in lines]
    path = tmp_path / "e.jsonl"
    path.write_text("\n".join(lines) + "\n")
    fast = _jsonl_columns(str(path))                 # the columnar reader itself (a file this small is read
    slow = EstimateRecords(json.loads(x) for x in path.read_text().splitlines() if x.strip())  # record by record)
    assert list(fast._columns) == list(slow._columns)
    assert _columns_of(fast) == _columns_of(slow)
    assert list(fast) == list(slow) and len(fast) == len(slow) == 9
    small = read_estimate_records(str(path), "jsonl")
    assert list(small._columns) == list(slow._columns) and _columns_of(small) == _columns_of(slow)


def _estimate_recs(keys: int) -> list[dict]:
    return [{"key": k, "key_name": f"k{k}", "frequency": k / 7, "mean": None if k % 5 else -0.25,
             "status": "ok", "n_reports": 3 * k} for k in range(keys)]


@pytest.mark.parametrize("bytes_past", [-1000, -1, 0, 1, 200_000])
def test_jsonl_files_small_and_large_read_the_same_records(tmp_path, bytes_past):
    """A file ``bytes_past`` bytes longer than ``SMALL_JSONL`` (records padded
    to land exactly there) reads to the same columns, whichever path reads it."""
    from kvldp.schemas.estimate_columns import SMALL_JSONL, EstimateRecords, read_estimate_records

    size = SMALL_JSONL + bytes_past
    recs = _estimate_recs(max(1, size // 120))
    text = "".join(json.dumps(r) + "\n" for r in recs)
    while len(text) > size:
        recs.pop()
        text = "".join(json.dumps(r) + "\n" for r in recs)
    recs[-1]["status"] += "x" * (size - len(text))          # the last record takes up the rest
    text = "".join(json.dumps(r) + "\n" for r in recs)
    path = tmp_path / "e.jsonl"
    path.write_text(text)
    assert path.stat().st_size == size
    got = read_estimate_records(str(path), "jsonl")
    want = EstimateRecords(iter(recs))
    assert list(got._columns) == list(want._columns) and _columns_of(got) == _columns_of(want)
    assert len(got) == len(recs)


def test_a_malformed_jsonl_file_fails_as_before(tmp_path):
    from kvldp.schemas.estimate_columns import read_estimate_records

    path = tmp_path / "bad.jsonl"
    path.write_text('{"key": "a", "frequency": 0.5}\n{"key": "b", "frequency": "high"}\n')
    with pytest.raises(TypeError):
        read_estimate_records(str(path), "jsonl")


def test_a_small_jsonl_file_splits_lines_as_the_record_path_does(tmp_path):
    """CRLF line ends, and a raw U+2028 inside a string (valid JSON, which
    ``str.splitlines`` would split on): the small-file path reads the
    records the large-file fallback reads."""
    from kvldp.schemas.estimate_columns import read_estimate_records

    recs = [{"key": k, "key_name": f"line\u2028sep {k}", "frequency": 0.5} for k in range(3)]
    path = tmp_path / "e.jsonl"
    path.write_bytes("".join(json.dumps(r, ensure_ascii=False) + "\r\n" for r in recs).encode("utf-8"))
    got = read_estimate_records(str(path), "jsonl")
    assert list(got) == recs
