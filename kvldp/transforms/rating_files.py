"""Parsing ratings files (the client / ingest side): ``RatingsFormat`` and
``ParseRatingFileFn``, which turns one file into ``RatingChunk``s of
arrays and its malformed rows into dead letters with a reason.

CSV, JSON Lines or Avro files, local or ``gs://`` (Beam ``FileSystems``),
parsed in chunks straight into NumPy (a clean CSV block by pyarrow,
``csv_blocks``). Validating the parsed rows and grouping them per user is
``transforms/ratings.py``'s. Raw values appear in dead letters: this module
never runs on the collector.
"""
from __future__ import annotations

import codecs
import csv
import dataclasses
import io
import itertools
import json
import math

import apache_beam as beam
import fastavro
import numpy as np
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems

from kvldp.mechanisms.base import DEFAULT_BATCH_SIZE
from kvldp.runtime import tally
from kvldp.schemas.invalid import reading
from kvldp.transforms import csv_blocks
from kvldp.transforms.coders import register_payload_type
from kvldp.transforms.context import element_context
from kvldp.transforms.io import format_of

DEAD_LETTER = "dead_letter"


CHUNK_ROWS = DEFAULT_BATCH_SIZE


def id_column(values) -> pa.Array:
    """User or item ids as an Arrow string array, what a ``RatingChunk``
    holds: its bytes and offsets, ~15 B per id where a Python ``str`` in an
    object array took ~65 B, and pickled as two buffers instead of a
    million objects (the rows travel through the shard grouping whole)."""
    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks()
    if isinstance(values, pa.Array):
        return values if values.type == pa.string() else values.cast(pa.string())
    return pa.array(np.asarray(values, dtype=object), type=pa.string())


class RatingChunk(dict):
    """Parsed rows of one file as arrays: ``source``, ``lines``, ``users``,
    ``items``, ``ratings`` (after validation also ``keys``, ``values``,
    ``rejected_users``); the ids as Arrow strings (``id_column``). A dict with its own type so the pipeline can declare
    it for ``ArrayPayloadCoder``: as a plain dict Beam pickled each of its
    arrays again to estimate its size, ~150 times per million rows."""


register_payload_type(RatingChunk)


class _Chunk:
    """Parsed rows of one file: source, line numbers, users, items, ratings."""

    def __init__(self, source: str):
        self.source = source
        self.lines: list[int] = []
        self.users: list[str] = []
        self.items: list[str] = []
        self.ratings: list[float] = []

    def __len__(self):
        return len(self.lines)

    def add(self, line: int, user, item, rating):
        self.lines.append(line)
        self.users.append(str(user))
        self.items.append(str(item))
        self.ratings.append(rating)

    def arrays(self):
        return RatingChunk(source=self.source, lines=np.asarray(self.lines, dtype=np.int64),
                           users=id_column(self.users), items=id_column(self.items),
                           ratings=np.asarray(self.ratings, dtype=np.float64))


def dead_row(source: str, line, reason: str, row) -> dict:
    return {"source": source, "line": int(line), "reason": reason, "row": row}


@dataclasses.dataclass(frozen=True)
class RatingsFormat:
    """How ratings files are read: the format (``None``: from the file
    name), which columns hold the user, item and rating, and for text files
    the encoding; for CSV the delimiter and whether the first row is a
    header. Without a header the columns are named ``column_names`` (by
    default ``user,item,rating`` for the first three, then their 0-based
    positions), so a headerless ``u,i,r`` file needs only ``header=False``.

    Item ids are kept exactly as written (whitespace included: ``"A"`` and
    ``"A "`` are two items); an id holding a line break is rejected, since
    the key dictionary holds one id per line."""

    fmt: str | None = None
    user_col: str = "user"
    item_col: str = "item"
    rating_col: str = "rating"
    delimiter: str = ","
    encoding: str = "utf-8"
    header: bool = True
    column_names: tuple[str, ...] | None = None

    def __post_init__(self):
        if self.fmt is not None:
            format_of("", self.fmt)
        if len(self.delimiter) != 1 or self.delimiter in "\r\n\"":
            raise ValueError(f"--delimiter must be one character other than a quote or line break, "
                             f"got {self.delimiter!r}")
        try:
            codecs.lookup(self.encoding)
        except LookupError:
            raise ValueError(f"--encoding {self.encoding!r} is not an encoding Python knows") from None
        if self.column_names is not None:
            object.__setattr__(self, "column_names", tuple(self.column_names))
            if len(set(self.column_names)) != len(self.column_names):
                raise ValueError(f"--column-names names a column twice: {','.join(self.column_names)}")
        if len({self.user_col, self.item_col, self.rating_col}) != 3:
            raise ValueError("--user-col, --item-col and --rating-col must name three different columns")

    @property
    def columns(self) -> tuple[str, str, str]:
        return self.user_col, self.item_col, self.rating_col

    def headerless_names(self, width: int) -> list[str]:
        """The names of a headerless file's ``width`` columns."""
        if self.column_names is not None:
            return list(self.column_names)
        return ["user", "item", "rating", *map(str, range(3, width))][:max(width, 3)]

    def check_columns(self, names: list[str], path: str):
        """Refuse a CSV file whose header (or headerless names) lacks a column, saying which flag fixes it."""
        missing = [c for c in self.columns if c not in names]
        if not missing:
            return
        hint = "set --user-col/--item-col/--rating-col"
        if self.header:
            hint += ", or --no-header if the first row is data"
        if len(names) == 1 and any(sep in names[0] for sep in ";\t|,"):
            hint += f", or --delimiter (the {'header' if self.header else 'first row'} has one column)"
        what = "CSV header" if self.header else "headerless CSV columns"
        raise ValueError(f"{path}: {what} {names} lacks column(s) {missing}: {hint}")

    def check_file(self, path: str):
        """Before any pipeline: a CSV file's first row (its header, or its
        first data row) has the columns asked for."""
        if format_of(path, self.fmt) != "csv":
            return
        with FileSystems.open(path) as fh:
            text = io.TextIOWrapper(fh, encoding=self.encoding, errors="surrogateescape", newline="")
            first = next(ParseRatingFileFn(self)._csv_rows(text), None)
        if first is None or isinstance(first[1], _Bad):
            return                            # empty, or a bad first row: the parse reports it
        row = first[1]
        if _undecodable("".join(row)):
            if self.header:
                raise ValueError(f"{path}: the header row cannot be read as {self.encoding}; set --encoding")
            return
        names = [h.strip().lstrip("\ufeff") for h in row] if self.header else self.headerless_names(len(row))
        self.check_columns(names, path)


UNDECODABLE = "undecodable bytes"


_undecodable = csv_blocks.is_undecodable


def _shown(text: str, encoding: str) -> str:
    """``text`` with its undecodable bytes as ``\\xNN`` escapes (for a dead letter)."""
    return text.encode(encoding, "surrogateescape").decode(encoding, "backslashreplace")


@beam.typehints.with_output_types(RatingChunk)
class ParseRatingFileFn(beam.DoFn):
    """``ReadableFile -> chunks of parsed rows`` (+ malformed rows to dead letter).

    Text is decoded with ``surrogateescape``, so a byte the encoding cannot
    decode rejects its row (``undecodable bytes``) instead of aborting the
    file, and rows in = accepted + rejected still holds."""

    def __init__(self, ratings_format: RatingsFormat):
        self._format = ratings_format
        self._cols = ratings_format.columns
        self._read = tally.counter("rows_read")
        self._rejected = tally.counter("rows_rejected")

    def process(self, readable):
        path = readable.metadata.path
        fmt = format_of(path, self._format.fmt)
        with element_context(path), readable.open() as fh, reading(path, f"{fmt} ratings file"):
            if fmt == "csv":
                yield from self._csv(fh, path)
            else:
                yield from self._chunks(path, {"jsonl": self._jsonl, "avro": self._avro}[fmt](fh, path))

    def _chunks(self, path: str, rows):
        """Parsed ``(line, row)`` pairs -> chunks of arrays, and dead letters."""
        chunk, read, rejected = _Chunk(path), 0, 0
        for line, row in rows:
            read += 1
            if isinstance(row, _Bad):      # a reason: the row is malformed
                rejected += 1
                yield beam.pvalue.TaggedOutput(DEAD_LETTER, dead_row(path, line, str(row), row.row))
                continue
            chunk.add(line, *row)
            if len(chunk) >= CHUNK_ROWS:
                yield chunk.arrays()
                chunk = _Chunk(path)
        if len(chunk):
            yield chunk.arrays()
        self._read.inc(read)
        self._rejected.inc(rejected)

    def _fields(self, record: dict):
        u, i, r = (record.get(c) for c in self._cols)
        if u is None or i is None or r is None or u == "" or i == "":
            missing = [c for c, v in zip(self._cols, (u, i, r), strict=True) if v is None or v == ""]
            return ("malformed row: missing " + ", ".join(missing), _printable(record))
        if isinstance(i, str) and ("\n" in i or "\r" in i):
            return ("malformed row: the item id holds a line break", _printable(record))
        if not all(_is_unicode(str(x)) for x in (u, i)):      # e.g. JSON's "\udc80": no UTF-8 for it
            return ("malformed row: an id holds an unpaired surrogate (not Unicode text)", _printable(record))
        try:
            rating = float(r)
        except (TypeError, ValueError):
            return ("malformed row: rating is not a number", _printable(record))
        return (u, i, rating)

    def _text(self, fh, newline=None):
        return io.TextIOWrapper(fh, encoding=self._format.encoding, errors="surrogateescape", newline=newline)

    def _csv_rows(self, text):
        """``(line, fields)`` of CSV text, or ``(line, _Bad)`` for a row the
        CSV parser refuses (it goes on with the next line)."""
        reader = csv.reader(text, delimiter=self._format.delimiter)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                return
            except csv.Error as err:
                yield reader.line_num, _bad(f"malformed row: {err}", "")
                continue
            yield reader.line_num, row

    def _csv(self, fh, path: str):
        """Blocks of the file (``csv_blocks``): a clean one parsed at once by
        pyarrow, any other row by row by the ``csv`` module."""
        enc = self._format.encoding
        if "\n,\"a".encode(enc, "replace") != b"\n,\"a":     # UTF-16 & co.: no byte-level line ends
            text = io.TextIOWrapper(fh, encoding=enc, errors="surrogateescape", newline="")
            rows = self._csv_rows(text)
            head = next(rows, None)
            names, skip = self._csv_names_of(head, path)
            if names is None:
                return
            yield from self._chunks(path, self._csv_records(rows if skip else itertools.chain([head], rows), names))
            return
        names = None
        for start, whole in csv_blocks.blocks(fh):
            first_line, block = start, whole
            if names is None:             # the header, or the first row's width
                names, skip = self._csv_names(block, path)
                if names is None:
                    return
                newline = block.find(b"\n")
                first_line += skip
                block = block[newline + 1:] if skip and newline >= 0 else (b"" if skip else block)
                if not block:
                    continue
            parsed = csv_blocks.parse_clean_block(block, first_line, names, self._cols, self._format.delimiter,
                                                  self._format.encoding)
            if parsed is not None:
                self._read.inc(len(parsed["lines"]))
                yield RatingChunk(source=path, **parsed)
                continue
            text = io.StringIO(block.decode(self._format.encoding, "surrogateescape"), newline="")
            rows = ((first_line - 1 + line, row) for line, row in self._csv_rows(text))
            yield from self._chunks(path, self._csv_records(rows, names))

    def _csv_names(self, block: bytes, path: str):
        """``(column names, 1 if the first line is a header else 0)`` from a
        file's first block (``None`` names: an empty file)."""
        text = io.StringIO(block.decode(self._format.encoding, "surrogateescape"), newline="")
        return self._csv_names_of(next(self._csv_rows(text), None), path)

    def _csv_names_of(self, first, path: str):
        """The column names from a file's first parsed row (``first``: ``(line, row)``)."""
        enc = self._format.encoding
        if first is None:
            return None, 0
        row = first[1]
        if not self._format.header:
            names = self._format.headerless_names(0 if isinstance(row, _Bad) else len(row))
            self._format.check_columns(names, path)
            return names, 0
        if isinstance(row, _Bad) or _undecodable("".join(row)):
            raise ValueError(f"{path}: the header row cannot be read as {enc} CSV; set --encoding")
        names = [h.strip().lstrip("\ufeff") for h in row]
        self._format.check_columns(names, path)
        return names, 1

    def _csv_records(self, rows, names):
        """Checked rows: undecodable, wrong width, missing or non-numeric
        fields become reasons."""
        enc = self._format.encoding
        for line, row in rows:
            if isinstance(row, _Bad):
                yield line, row
                continue
            if not row:
                continue
            if _undecodable("".join(row)):
                yield line, _bad(f"{UNDECODABLE} (not {enc}; set --encoding)", [_shown(x, enc) for x in row])
                continue
            if len(row) != len(names):
                yield line, _bad(f"malformed row: {len(row)} fields, {len(names)} expected", row)
                continue
            yield line, _unbad(self._fields(dict(zip(names, row, strict=True))))

    def _jsonl(self, fh, path: str):
        enc = self._format.encoding
        for line, raw in enumerate(self._text(fh), start=1):
            if not raw.strip():
                continue
            if _undecodable(raw):
                yield line, _bad(f"{UNDECODABLE} (not {enc}; set --encoding)", _shown(raw.rstrip("\n"), enc))
                continue
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as err:
                yield line, _bad(f"malformed row: invalid JSON ({err.msg})", raw.rstrip("\n"))
                continue
            if not isinstance(record, dict):
                yield line, _bad("malformed row: not a JSON object", raw.rstrip("\n"))
                continue
            yield line, _unbad(self._fields(record))

    def _avro(self, fh, path: str):
        try:
            reader = fastavro.reader(fh)
        except (ValueError, EOFError) as err:         # fastavro: "cannot read header - is it an avro file?"
            raise ValueError(f"{path}: not a readable Avro file (its header: {err}); truncated, or not Avro "
                             "(--input-format)") from None
        for line, record in enumerate(reader, start=1):
            if not isinstance(record, dict):      # an Avro file of arrays or strings: not one rating per record
                yield line, _bad(f"malformed row: an Avro {type(record).__name__}, not a record", repr(record)[:200])
                continue
            yield line, _unbad(self._fields(record))


class _Bad(str):
    """A reason string carrying the offending row (so ``process`` can tell
    malformed rows from parsed tuples with one ``isinstance``)."""


def _bad(reason: str, row) -> _Bad:
    s = _Bad(reason)
    s.row = row
    return s


def _unbad(parsed):
    if len(parsed) == 2:
        return _bad(*parsed)
    return parsed


def _is_unicode(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _printable(record) -> dict:
    """A record as a dead letter can hold it: values JSON can write, and
    text UTF-8 can encode (an unpaired surrogate as its ``\\udXXX`` escape),
    numbers JSON has (NaN and infinities as their ``repr``)."""
    return {k: (_utf8_text(v) if isinstance(v, str) else v if _json_number(v) else repr(v))
            for k, v in record.items()}


def _json_number(v) -> bool:
    """JSON has no NaN or infinity (a dead letter of ``NaN`` is not JSON a reader like jq accepts)."""
    return v is None or isinstance(v, int) or (isinstance(v, float) and math.isfinite(v))


def _utf8_text(text: str) -> str:
    return text if _is_unicode(text) else text.encode("utf-8", "backslashreplace").decode("utf-8")
