"""Estimate records read back as columns.

A job's estimates file has one record per key; read back as d dicts it
took 2 GB and ~10 s at d = 10^6 (every job reads its file back for the
table and the error summary; issue 17). ``EstimateRecords`` reads the file
one record at a time into columns -- ``array('d')`` for the doubles (NaN
for null: an estimate record never holds a non-finite number, they are
null), lists for the rest with repeated strings shared -- and is still a
sequence of the same dicts, built on access. A JSONL file (the default
output) is parsed by pyarrow's JSON reader straight into those columns,
4x faster than a record at a time; anything it cannot parse as the schema
says is read a record at a time, as before.
"""
from __future__ import annotations

import contextlib
import csv
import io
import json
from array import array
from collections.abc import Iterable, Iterator, Sequence

import fastavro
import numpy as np
from apache_beam.io.filesystems import FileSystems

from kvldp import schemas


def _field_kinds() -> dict[str, str]:
    """``double``, ``long``, ``string``, ... per field of estimate.avsc and
    windowed_estimate.avsc (a pane's records are estimate records with the
    window's fields in front)."""
    kinds = {}
    for name in (schemas.ESTIMATE, schemas.WINDOWED_ESTIMATE):
        for f in schemas.load(name)["fields"]:
            types = f["type"] if isinstance(f["type"], list) else [f["type"]]
            kinds[f["name"]] = next(t for t in types if t != "null")
    return kinds


class EstimateRecords(Sequence):
    """The records of an estimates file, held as columns (the fields of its
    records, in their order); ``column(field)`` gives a double field as a
    float array (NaN where null) without building any dict."""

    def __init__(self, records: Iterable[dict]):
        kinds = _field_kinds()
        self._columns: dict[str, array | list] = {}
        shared: dict[str, str] = {}
        n = 0
        for r in records:
            for f in r:
                if f not in self._columns:     # the first record's fields, in order (a later one: backfilled)
                    self._columns[f] = array("d", [np.nan] * n) if kinds.get(f) == "double" else [None] * n
            for f, col in self._columns.items():
                v = r.get(f)
                if isinstance(col, array):
                    col.append(np.nan if v is None else v)
                else:
                    col.append(shared.setdefault(v, v) if isinstance(v, str) and f != "key" else v)
            n += 1
        self._n = n

    @classmethod
    def from_columns(cls, columns: dict[str, array | list], n: int) -> EstimateRecords:
        """Records already held as columns (doubles as ``array('d')`` with NaN for null)."""
        out = cls(())
        out._columns, out._n = dict(columns), int(n)
        return out

    def __len__(self) -> int:
        return self._n

    def _record(self, i: int) -> dict:
        out = {}
        for f, col in self._columns.items():
            v = col[i]
            out[f] = None if isinstance(col, array) and v != v else v
        return out

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._record(j) for j in range(*i.indices(self._n))]
        if i < 0:
            i += self._n
        if not 0 <= i < self._n:
            raise IndexError(i)
        return self._record(i)

    def __iter__(self) -> Iterator[dict]:
        return (self._record(i) for i in range(self._n))

    def column(self, field: str) -> np.ndarray:
        """A double field as floats (NaN where null), any other as an array
        of its values (a field the file lacks: all NaN, or all None)."""
        col = self._columns.get(field)
        if col is None:
            return np.full(self._n, np.nan) if _field_kinds().get(field) == "double" else \
                np.full(self._n, None, dtype=object)
        if isinstance(col, array):
            return np.frombuffer(col, dtype=np.float64).copy() if self._n else np.zeros(0)
        return np.asarray(col, dtype=object)

    def __eq__(self, other) -> bool:
        if not isinstance(other, Sequence) or len(other) != len(self):
            return False
        return all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None


def _csv_records(text_lines: Iterable[str]) -> Iterator[dict]:
    kinds = _field_kinds()
    for row in csv.DictReader(text_lines):
        yield {k: (None if v == "" else float(v) if kinds.get(k) == "double" else int(float(v))
                   if kinds.get(k) == "long" else v) for k, v in row.items()}


_ARROW_TYPES = {"string": "string", "double": "float64", "long": "int64", "int": "int64"}


def _jsonl_columns(path: str) -> EstimateRecords | None:
    """A JSONL estimates file parsed by pyarrow's streaming JSON reader
    straight into columns, a block at a time (4x faster than ``json.loads``
    per line and then the per-record columns, which were most of reading back
    10^6 keys; memory: the columns and one block); the fields in the order of
    the first record, typed as estimate.avsc says. None where the reader
    cannot: then the caller reads it a record at a time, which gives the
    same records or the same error as before."""
    import pyarrow as pa
    import pyarrow.json as pj

    with FileSystems.open(path) as fh:
        first = next((line for line in fh if line.strip()), None)
    if first is None:
        return None
    try:
        order = list(json.loads(first))
        kinds = _field_kinds()
        schema = pa.schema([(f, getattr(pa, _ARROW_TYPES[kinds[f]])()) for f in order
                            if isinstance(kinds.get(f), str) and kinds[f] in _ARROW_TYPES])
        options = pj.ParseOptions(explicit_schema=schema, unexpected_field_behavior="infer", newlines_in_values=False)
        with contextlib.ExitStack() as stack:
            # a local file: pyarrow reads it itself, outside Python's heap; gs:// etc.: through Beam's file object
            source = stack.enter_context(FileSystems.open(path)) if "://" in path else path
            # pyarrow < 19 has no streaming reader: the whole table, then its blocks
            batches = (pj.open_json(source, parse_options=options) if hasattr(pj, "open_json")
                       else pj.read_json(source, parse_options=options).to_batches())
            return _columns_of_batches(batches, order, kinds)
    except (pa.ArrowException, ValueError, TypeError):
        return None


def _columns_of_batches(batches, order: list[str], kinds: dict) -> EstimateRecords:
    import pyarrow as pa

    columns: dict[str, array | list] | None = None
    shared: dict[str, str] = {}
    n = 0
    for batch in batches:
        if columns is None:
            columns = {f: array("d") if kinds.get(f) == "double" else []
                       for f in order + [f for f in batch.schema.names if f not in order]}
        if sorted(batch.schema.names) != sorted(columns):
            raise ValueError("the fields change between blocks")
        for f, out in columns.items():
            col = batch.column(f)
            if isinstance(out, array):
                out.frombytes(col.to_numpy(zero_copy_only=False).astype(np.float64, copy=False).view(np.uint8))
            elif pa.types.is_string(col.type) and f != "key" and col.null_count == 0:
                # repeated strings (statuses, mechanism) share one object each, as the record path keeps them
                coded = col.dictionary_encode()
                distinct = [shared.setdefault(v, v) for v in coded.dictionary.to_pylist()]
                out.extend(np.asarray(distinct, dtype=object)[coded.indices.to_numpy(zero_copy_only=False)].tolist())
            else:
                out.extend(col.to_pylist())
        n += batch.num_rows
    return EstimateRecords.from_columns(columns or {}, n)


# A JSONL file this small (~125 estimate records) is parsed a record at a
# time: 1.9 ms for 100 records, where pyarrow's reader takes 4.0 ms on its
# first use in a process (importing pyarrow.json, starting its threads) and
# 1.5 ms after; at 300 records 3.3 ms against 5.1 and 2.1.
SMALL_JSONL = 64 * 1024


def read_estimate_records(path: str, fmt: str) -> EstimateRecords:
    """The estimate records of ``path`` (``fmt``: avro, jsonl or csv):
    JSONL parsed a column at a time where it can (``SMALL_JSONL`` and up),
    else one record at a time."""
    if fmt == "jsonl":
        with FileSystems.open(path) as fh:
            head = fh.read(SMALL_JSONL)
            whole = not fh.read(1)      # at its end (a short read that is not comes back with more)
        if whole:
            return _jsonl_records(io.BytesIO(head))
        if (fast := _jsonl_columns(path)) is not None:
            return fast
    with FileSystems.open(path) as fh:
        if fmt == "avro":
            return EstimateRecords(fastavro.reader(fh))
        if fmt == "jsonl":
            return _jsonl_records(fh)
        return EstimateRecords(_csv_records(io.TextIOWrapper(fh, encoding="utf-8", newline="")))


def _jsonl_records(fh) -> EstimateRecords:
    """One record per non-blank line of the binary file ``fh``, split as
    text with universal newlines (not ``str.splitlines``: a raw U+2028 in a
    string is valid JSON)."""
    return EstimateRecords(json.loads(line) for line in io.TextIOWrapper(fh, encoding="utf-8") if line.strip())
