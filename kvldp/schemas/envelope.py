"""How a batch of reports travels: one Avro container (the batch's records in
its report schema, the round's public configuration in the header), written
as a report file (``transforms.io.WriteReports``) or sent as the body of one
Pub/Sub message or Kafka record (``kvldp publish``), whose attributes (a
Kafka record's headers) repeat what a collector must check before it
decodes the body.

A message's attributes (all strings, Pub/Sub's limit is 100 per message):

* ``kvldp_fingerprint``: ``config_fingerprint(config)``, SHA-256 of the
  canonical JSON of the round's configuration (mechanism, epsilon, d, its
  options, the collection id of a multi-round protocol; not the collection's
  ``layout``, how the perturbing side batched its users, which a streaming
  collector learns from round 1's reports). A collector refuses a message
  whose fingerprint is not its own without decoding it.
* ``kvldp_batch``: the user batch's id; ``kvldp_round``: the 1-based round.
* ``kvldp_event_ms``: the event time, milliseconds since the epoch (Beam's
  ``timestamp_attribute``: the reports' time, not the publish time).
* ``kvldp_run``: the publishing run's random nonce (``new_run``).
* ``kvldp_id``: ``fingerprint[:16]-round-batch-run``, the same for a
  redelivery of the same message, different for every publishing run (two
  runs with the same settings are two sets of devices): Beam's ``id_label``
  (Dataflow deduplicates on it) and the key of the collector's own
  deduplication on every runner.
* ``kvldp_broadcast`` (rounds >= 2 of a multi-round protocol):
  ``broadcast_id`` of the broadcast the batch was perturbed with, so the
  collector can refuse reports made with another round's broadcast.
"""
from __future__ import annotations

import hashlib
import io
import itertools
import json
import secrets
from collections.abc import Iterator, Mapping

import fastavro
import numpy as np

from kvldp import schemas

CONFIG_METADATA_KEY = "kvldp.config"

FINGERPRINT = "kvldp_fingerprint"
BATCH = "kvldp_batch"
ROUND = "kvldp_round"
EVENT_MS = "kvldp_event_ms"
MESSAGE_ID = "kvldp_id"
RUN = "kvldp_run"                       # the publishing run's random nonce: part of a batch's identity
BROADCAST = "kvldp_broadcast"
WINDOW_MS = "kvldp_window_ms"           # on a broadcast: the collector's (fixed) window length
LAYOUT = "layout"


def canonical_config(config: Mapping) -> str:
    """The configuration as canonical JSON (sorted keys): what the header and
    the fingerprint hold."""
    return json.dumps(dict(config), sort_keys=True)


def without_layout(config: Mapping) -> dict:
    """The configuration a streaming collector checks: all but the layout."""
    return {k: v for k, v in dict(config).items() if k != LAYOUT}


def config_fingerprint(config: Mapping) -> str:
    return hashlib.sha256(canonical_config(without_layout(config)).encode()).hexdigest()


def broadcast_id(records) -> str:
    """A broadcast's identity: SHA-256 (32 hex digits) of its records'
    canonical JSON (an Avro file's bytes differ by a random sync marker)."""
    rows = sorted((dict(r) for r in records), key=lambda r: r["key"])
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:32]


COLUMN_CHUNK = 65_536        # reports per columnar record: bounds one record's bytes
# Zstandard at level 1 (Avro's "zstandard" codec), after deflate at level 1:
# written 5-10x faster (PCKV-UE at d = 5,000: 7.0 -> 1.1 us/user, deflate took a
# third of a ratings ingest's worker time) and, with sorted positions stored as
# differences, smaller where a report holds many entries (d = 5,000: 293 -> 207
# B/user; d = 100, eps 1: 25.4 -> 19.2) and within 4 % elsewhere (eps 4: 4.23 ->
# 4.39). Files written with deflate read as before: the codec is the file's own.
CODEC, CODEC_LEVEL = "zstandard", 1
# a column stored as differences when at least this share of its consecutive
# values do not decrease: the positions of a UE report with many entries (GRR's
# one key per report, or UE's few at eps 4, compress better as they are)
DELTA_SORTED_SHARE = 0.9


def compact(array: np.ndarray) -> np.ndarray:
    """An integer array in the smallest little-endian type holding its
    values (positions < 256 take one byte, not four); others as they are."""
    array = np.asarray(array)
    if array.dtype.kind not in "iub" or array.size == 0:
        return array.astype(array.dtype.newbyteorder("<"), copy=False)
    if array.dtype.kind == "b":
        return array
    lo, hi = int(array.min()), int(array.max())
    for kind in (("u1", "u2", "u4", "u8") if lo >= 0 else ("i1", "i2", "i4", "i8")):
        info = np.iinfo(np.dtype(kind))
        if info.min <= lo and hi <= info.max:
            return array.astype(np.dtype(kind).newbyteorder("<"), copy=False)
    return array


def encode_column(name: str, values: np.ndarray) -> dict:
    """One column as stored: an integer column whose values span at most
    16 consecutive integers is bit-packed, ``bits``
    per value above ``offset`` (PCKV's signs: 1 bit); any other in
    ``compact``'s smallest type, as the differences of consecutive values
    (``delta``) when it is mostly sorted (``DELTA_SORTED_SHARE``)."""
    array = np.ascontiguousarray(values)
    if array.dtype.kind in "iu" and array.ndim == 1 and array.size:
        lo, hi = int(array.min()), int(array.max())
        # two values (PCKV's signs -1/+1) take one bit whatever their distance
        scale = hi - lo if hi > lo and not np.any((array != lo) & (array != hi)) else 1
        bits = {0: 1, 1: 1, 2: 2, 3: 4, 4: 4}.get(int((hi - lo) // scale).bit_length())
        if bits is not None:
            steps = (array.astype(np.int64) - lo) // scale
            return {"name": name, "dtype": array.dtype.newbyteorder("<").str, "shape": list(array.shape),
                    "bits": bits, "offset": lo, "scale": scale, "delta": False,
                    "data": pack_bits(steps, bits).tobytes()}
    array = compact(array)
    delta = _mostly_sorted(array)
    if delta:
        array = differences(array)
    return {"name": name, "dtype": array.dtype.str, "shape": list(array.shape), "bits": 0, "offset": 0,
            "scale": 1, "delta": delta, "data": array.tobytes()}


def _mostly_sorted(array: np.ndarray) -> bool:
    return (array.dtype.kind == "u" and array.ndim == 1 and array.size > 1
            and np.count_nonzero(array[1:] >= array[:-1]) >= DELTA_SORTED_SHARE * (array.size - 1))


def differences(array: np.ndarray) -> np.ndarray:
    """Each value minus the one before (the first minus 0), modulo 2^bits of
    the unsigned type: sorted positions become small numbers, and a report's
    first position, which follows the previous report's last, wraps around.
    ``np.cumsum`` in the same type undoes it exactly."""
    return np.diff(array, prepend=array.dtype.type(0))      # unsigned: wraps modulo 2^bits


def column_records(reports, chunk: int = COLUMN_CHUNK) -> Iterator[dict]:
    """``report_columns.avsc`` records of a batch, ``chunk`` reports each."""
    n = reports.n_reports
    for start in range(0, max(n, 1), chunk):
        part = reports.rows(start, min(n, start + chunk)) if n > chunk else reports
        columns = [encode_column(name, values) for name, values in part.columns().items()]
        yield {"kind": reports.schema, "n_reports": part.n_reports, "columns": columns}


def write_reports(fh, reports, config: Mapping) -> None:
    """Write one report batch as an Avro container to the binary file ``fh``:
    columnar records (``report_columns.avsc``) and the round's public
    configuration in the header. The sync marker is derived from the
    configuration and the batch id instead of drawn at random, so a rerun
    writes the same bytes (issue 42: a job killed and rerun is checked byte
    for byte); it is 16 pseudo-random bytes either way."""
    fastavro.writer(fh, schemas.parsed(schemas.REPORT_COLUMNS), column_records(reports),
                    metadata={CONFIG_METADATA_KEY: canonical_config(config)}, codec=CODEC,
                    codec_compression_level=CODEC_LEVEL,
                    sync_marker=sync_marker(f"reports {canonical_config(config)} {reports.batch_id}"))


def sync_marker(what: str) -> bytes:
    """A container's 16-byte sync marker, fixed by what it holds (``what``)."""
    return hashlib.sha256(f"kvldp sync marker: {what}".encode()).digest()[:16]


def reports_bytes(reports, config: Mapping) -> bytes:
    """One report batch as the bytes of an Avro container (a message body)."""
    buf = io.BytesIO()
    write_reports(buf, reports, config)
    return buf.getvalue()


class ReportContainer:
    """An Avro report container opened for reading: its configuration and
    record schema from the header, then its report batches -- columnar
    records (what kvldp writes) or, from files of kvldp before 0.2, one
    record per report."""

    def __init__(self, fh, name: str | None = None):
        try:
            self._reader = fastavro.reader(fh)
        except (ValueError, EOFError, OSError) as err:      # fastavro: "cannot read header - is it an avro file?"
            raise ValueError(f"{name or 'a report file'}: not a readable Avro container (its header: {err}); "
                             "truncated, or not a report file") from None
        raw = self._reader.metadata.get(CONFIG_METADATA_KEY)
        self.config: dict | None = json.loads(raw) if raw else None
        self.schema_name: str = self._reader.writer_schema.get("name", "").split(".")[-1]
        self.columnar = self.schema_name == schemas.load(schemas.REPORT_COLUMNS)["name"]
        self._peeked: list[dict] | None = None        # the first record, once read (columnar)

    def _first(self) -> dict | None:
        if self._peeked is None:
            self._peeked = [next(iter(self._reader), None)]
        return self._peeked[0]

    @property
    def kind(self) -> str | None:
        """The report schema's name (``report``, ``olh_report``, …) the records encode."""
        if self.columnar:
            first = self._first()
            return None if first is None else first["kind"]
        return next((k for k in (schemas.REPORT, schemas.OLH_REPORT, schemas.IOH_REPORT)
                     if schemas.load(k)["name"] == self.schema_name), self.schema_name)

    def batches(self, protocol, round_index: int, batch_id: int = 0, rows: int = 50_000):
        """The container's reports as ``Reports`` of round ``round_index``
        (each columnar record is one; per-report records in ``rows`` chunks)."""
        kind, shape = protocol.round_report_type(round_index), protocol.report_shape(round_index)
        if not self.columnar:
            chunk = []
            for record in self._reader:
                chunk.append(record)
                if len(chunk) >= rows:
                    yield protocol.reports_from_records(round_index, chunk, batch_id)
                    chunk = []
            if chunk:
                yield protocol.reports_from_records(round_index, chunk, batch_id)
            return
        for record in self:
            if record["kind"] != kind.schema:
                raise ValueError(f"{record['kind']} reports where {kind.schema} reports were expected")
            columns = {c["name"]: decode_column(c) for c in record["columns"]}
            reports = kind.from_columns(columns, batch_id, **shape)
            if reports.n_reports != record["n_reports"]:
                raise ValueError(f"a record says {record['n_reports']} reports, its columns hold "
                                 f"{reports.n_reports}")
            yield reports

    def __iter__(self) -> Iterator[dict]:
        """The stored Avro records as they are (columnar or per report)."""
        if self._peeked is None:
            return iter(self._reader)
        return itertools.chain([r for r in self._peeked if r is not None], self._reader)

    def count(self) -> int:
        """Reports in the container (columnar: the records' counts)."""
        if not self.columnar:
            return sum(1 for _ in self._reader)
        return sum(r["n_reports"] for r in self)

    def check(self, expected: Mapping, kind, where: str, layout: bool = True) -> None:
        """Refuse reports made with another configuration or of another
        report type than ``kind`` (a ``Reports`` class) with the reason
        (``layout=False``: the layout is not compared)."""
        found, want = (self.config, dict(expected)) if layout else \
            (None if self.config is None else without_layout(self.config), without_layout(expected))
        if found != want:
            raise ValueError(f"{where}: reports were made by {self.config}, but the collector was "
                             f"configured as {dict(expected)}; rerun collect with the perturbing side's parameters")
        found_kind = self.kind
        if found_kind is not None and found_kind != kind.schema:
            raise ValueError(f"{where}: {found_kind} reports, but the collector reads {kind.schema} reports")


def decode_column(column: dict) -> np.ndarray:
    """One stored column back as an array, in its stored type (the report
    type's constructor converts it to its own)."""
    dtype = np.dtype(column["dtype"])
    if dtype.hasobject:
        raise ValueError(f"column {column['name']}: dtype {dtype} is not a plain array type")
    bits = column.get("bits") or 0
    if not bits:
        values = np.frombuffer(column["data"], dtype=dtype)
        if column.get("delta"):             # absent in files written before it
            if dtype.kind != "u":
                raise ValueError(f"column {column['name']}: differences of a {dtype} column")
            values = np.cumsum(values, dtype=dtype)
        return values.reshape(column["shape"])
    n = int(np.prod(column["shape"]))
    values = unpack_bits(np.frombuffer(column["data"], dtype=np.uint8), bits, n)
    scale = column.get("scale") or 1
    return (values.astype(np.int64) * scale + column["offset"]).astype(dtype).reshape(column["shape"])


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """Non-negative integers < 2^bits (bits 1, 2 or 4), ``8 // bits`` to a
    byte, the first value in the lowest bits."""
    per = 8 // bits
    padded = np.zeros(-(-len(values) // per) * per, dtype=np.uint8)
    padded[:len(values)] = values
    lanes = padded.reshape(-1, per)
    out = lanes[:, 0].copy()
    for i in range(1, per):
        out |= lanes[:, i] << np.uint8(i * bits)
    return out


def unpack_bits(packed: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Inverse of :func:`pack_bits` (the first ``n`` values)."""
    per, mask = 8 // bits, np.uint8((1 << bits) - 1)
    lanes = np.empty((len(packed), per), dtype=np.uint8)
    for i in range(per):
        lanes[:, i] = (packed >> np.uint8(i * bits)) & mask
    return lanes.reshape(-1)[:n]


def message_id(fingerprint: str, round_number: int, batch_id: int, run: str) -> str:
    """A batch's identity: configuration, round, batch number and the run
    that published it (``run``: a random nonce per ``publish`` run). A
    redelivery of the message keeps it (counted once); two runs with the
    same settings never share it (both counted)."""
    return f"{fingerprint[:16]}-{round_number}-{batch_id}-{run}"


def new_run() -> str:
    """A publishing run's nonce: 64 random bits, so two runs never collide."""
    return secrets.token_hex(8)


def message_attributes(config: Mapping, batch_id: int, round_number: int, event_ms: int, run: str,
                       broadcast: str | None = None) -> dict[str, str]:
    """The attributes of the message carrying batch ``batch_id`` of round
    ``round_number`` (1-based) made at ``event_ms``, published by run
    ``run`` (``new_run``; ``broadcast``: the id of the broadcast it was
    perturbed with, rounds >= 2)."""
    fingerprint = config_fingerprint(config)
    out = {FINGERPRINT: fingerprint, BATCH: str(int(batch_id)), ROUND: str(int(round_number)),
           EVENT_MS: str(int(event_ms)), RUN: run,
           MESSAGE_ID: message_id(fingerprint, round_number, batch_id, run)}
    if broadcast:
        out[BROADCAST] = broadcast
    return out


def next_round_event_ms(now_ms: int, window_ms: int) -> int:
    """When the devices of the next round stamp their reports: now, unless
    the current window (fixed, ``window_ms`` long) ends within half a window
    or 30 s, whichever is shorter; then the next window's start. So a round
    never straddles the end of a window, and a stamp is never more than 30 s
    ahead of the clock (``stream --max-future`` is 5 minutes)."""
    guard = min(window_ms // 2, 30_000)
    end = (now_ms // window_ms + 1) * window_ms
    return now_ms if end - now_ms >= guard else end
