"""Columnar report files (issue 17): one Avro record per chunk of reports,
arrays inside, integers in their smallest type or bit-packed. Every
mechanism's reports survive the round trip bit for bit, files of the
per-report format still read, and a file is no larger than before."""
from __future__ import annotations

import copy
import io

import fastavro
import numpy as np
import pytest

from kvldp import schemas
from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.privacy.randomness import SimulationSeed, batch_rng
from kvldp.mechanisms.protocol import Collection
from kvldp.schemas import envelope

CONFIG = {"mechanism": "test"}


def reports_of(name: str, n: int = 3000, d: int = 40, eps: float = 2.0, **options):
    proto = registry.make(name, d, eps, **options)
    users = SyntheticDataset("multi", n_users=n, d=d, seed=3).batch(7, 0, n)
    state = proto.initial_state(Collection.from_seed(5))
    reports = proto.perturb_round(0, proto.participants(0, users, state), batch_rng(SimulationSeed(9), 7), state)
    return proto, reports


def round_trip(proto, reports):
    body = envelope.reports_bytes(reports, CONFIG)
    container = envelope.ReportContainer(io.BytesIO(body))
    assert container.config == CONFIG and container.columnar
    return list(container.batches(proto, 0, batch_id=reports.batch_id)), body


def legacy_bytes(reports) -> bytes:
    """The per-report format of kvldp 0.1 (one Avro record per user)."""
    buf = io.BytesIO()
    fastavro.writer(buf, schemas.parsed(reports.schema), reports.records(),
                    metadata={envelope.CONFIG_METADATA_KEY: envelope.canonical_config(CONFIG)}, codec="deflate")
    return buf.getvalue()


@pytest.mark.parametrize("name", registry.names())
def test_every_mechanisms_reports_survive_the_columns(name):
    options = {"ioh_keys": [0, 3, 5]} if name.startswith("ioh") else {}
    proto, reports = reports_of(name, **options)
    [back], body = round_trip(proto, reports)
    assert back.equals(reports) and back.batch_id == reports.batch_id
    # the per-report files of kvldp 0.1 still read, to the same reports
    old = envelope.ReportContainer(io.BytesIO(legacy_bytes(reports)))
    assert not old.columnar
    [again] = old.batches(proto, 0, batch_id=reports.batch_id)
    assert again.equals(reports)
    assert envelope.ReportContainer(io.BytesIO(body)).count() == reports.n_reports


@pytest.mark.parametrize("name, eps", [("pckv-ue", 4.0), ("pckv-ue", 1.0), ("pckv-grr", 4.0), ("kvue", 4.0),
                                       ("privkv", 2.0), ("ks-ue", 2.0), ("f2m", 2.0)])
def test_a_columnar_file_is_no_larger_than_the_per_report_one(name, eps):
    _, reports = reports_of(name, n=20_000, d=100, eps=eps)
    assert len(envelope.reports_bytes(reports, CONFIG)) <= len(legacy_bytes(reports))


def test_a_large_batch_is_written_in_chunks_and_read_back_whole():
    proto, reports = reports_of("pckv-ue", n=3000)
    records = list(envelope.column_records(reports, chunk=1000))
    assert [r["n_reports"] for r in records] == [1000, 1000, 1000]
    buf = io.BytesIO()
    fastavro.writer(buf, schemas.parsed(schemas.REPORT_COLUMNS), records)
    parts = list(envelope.ReportContainer(io.BytesIO(buf.getvalue())).batches(proto, 0, batch_id=7))
    kind = type(reports)
    joined = kind.from_columns(kind.concat_columns([p.columns() for p in parts]), 7)
    assert joined.equals(reports)


@pytest.mark.parametrize("bits", [1, 2, 4])
def test_bit_packing_is_lossless(bits):
    rng = np.random.default_rng(bits)
    for n in (0, 1, 7, 8, 9, 1001):
        values = rng.integers(0, 2 ** bits, size=n).astype(np.uint8)
        packed = envelope.pack_bits(values, bits)
        assert len(packed) == -(-n * bits // 8)
        assert np.array_equal(envelope.unpack_bits(packed, bits, n), values)


def test_columns_take_their_smallest_type():
    assert envelope.compact(np.array([0, 255])).dtype == np.dtype("<u1")
    assert envelope.compact(np.array([0, 256])).dtype == np.dtype("<u2")
    assert envelope.compact(np.array([-1, 100])).dtype == np.dtype("<i1")
    assert envelope.compact(np.array([0, 2**40])).dtype == np.dtype("<u8")
    signs = envelope.encode_column("symbols", np.array([-1, 1, 1, -1], dtype=np.int8))
    assert (signs["bits"], signs["offset"], len(signs["data"])) == (1, -1, 1)
    assert np.array_equal(envelope.decode_column(signs), [-1, 1, 1, -1])


def test_a_mostly_sorted_column_is_stored_as_differences_and_read_back_exactly():
    rng = np.random.default_rng(4)
    for d, dtype in ((200, "|u1"), (5000, "<u2"), (70_000, "<u4")):
        # UE positions: sorted within each report, restarting at the next (the wrap-around of a difference)
        positions = np.concatenate([np.sort(rng.choice(d, size=rng.integers(20, 80), replace=False))
                                    for _ in range(300)])
        column = envelope.encode_column("positions", positions)
        assert column["delta"] and column["dtype"] == dtype
        stored = np.frombuffer(column["data"], dtype)
        assert np.median(stored) < d / 20          # small steps, not positions
        back = envelope.decode_column(column)
        assert back.dtype == np.dtype(dtype) and np.array_equal(back, positions)
    unsorted = rng.integers(0, 5000, size=1000)      # GRR's one key per report
    assert not envelope.encode_column("positions", unsorted)["delta"]
    assert np.array_equal(envelope.decode_column(envelope.encode_column("positions", unsorted)), unsorted)
    for edge in (np.array([], dtype=np.uint16), np.array([7]), np.array([65535, 0, 65535, 1])):
        assert np.array_equal(envelope.decode_column(envelope.encode_column("positions", edge)), edge)


def test_files_of_the_deflate_format_before_differences_still_read():
    """Report files written before the ``delta`` field and Zstandard (deflate,
    columns as values) read to the same reports."""
    proto, reports = reports_of("pckv-ue", n=2000, d=300, eps=1.0)
    old_schema = copy.deepcopy(schemas.load(schemas.REPORT_COLUMNS))      # the cached dict stays as it is
    column = old_schema["fields"][2]["type"]["items"]
    column["fields"] = [f for f in column["fields"] if f["name"] != "delta"]
    records = []
    for record in envelope.column_records(reports):
        for c in record["columns"]:
            if c.pop("delta"):
                c["data"] = np.cumsum(np.frombuffer(c["data"], c["dtype"]), dtype=c["dtype"]).tobytes()
        records.append(record)
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(old_schema), records, codec="deflate",
                    metadata={envelope.CONFIG_METADATA_KEY: envelope.canonical_config(CONFIG)})
    [back] = envelope.ReportContainer(io.BytesIO(buf.getvalue())).batches(proto, 0, batch_id=reports.batch_id)
    assert back.equals(reports)
    new = fastavro.reader(io.BytesIO(envelope.reports_bytes(reports, CONFIG)))
    assert new.codec == "zstandard" and any(c["delta"] for r in new for c in r["columns"])


def test_a_record_whose_columns_disagree_with_its_count_is_refused():
    proto, reports = reports_of("pckv-grr", n=50)
    [record] = envelope.column_records(reports)
    record["n_reports"] = 49
    buf = io.BytesIO()
    fastavro.writer(buf, schemas.parsed(schemas.REPORT_COLUMNS), [record])
    with pytest.raises(ValueError, match="says 49 reports, its columns hold 50"):
        list(envelope.ReportContainer(io.BytesIO(buf.getvalue())).batches(proto, 0))


def test_a_report_file_header_is_the_same_in_every_process():
    """The schema text in a file's header must not depend on the process's
    string-hash seed (a field with both a doc and a default came out in
    either key order, so identical runs wrote different headers)."""
    import subprocess
    import sys

    code = ("import io, fastavro; from kvldp.mechanisms.base import ReportBatch; from kvldp.schemas import envelope; "
            "print(repr(sorted(fastavro.reader(io.BytesIO(envelope.reports_bytes(ReportBatch.empty(), {'m': 1})))"
            ".metadata.items())))")
    headers = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                              env={**__import__("os").environ, "PYTHONHASHSEED": str(seed)}).stdout
               for seed in range(1, 9)}
    assert len(headers) == 1
