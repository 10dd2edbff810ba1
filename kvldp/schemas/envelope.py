"""How a batch of reports travels: one Avro container (the batch's records in
its report schema, the round's public configuration in the header), written
as a report file (``transforms.io.WriteReports``) or sent as the body of one
Pub/Sub message (``kvldp publish``), whose attributes repeat what a
collector must check before it decodes the body.

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
* ``kvldp_id``: ``fingerprint[:16]-round-batch``, the same for a redelivery
  of the same batch: Beam's ``id_label`` (Dataflow deduplicates on it) and
  the key of the collector's own deduplication on every runner.
* ``kvldp_broadcast`` (rounds >= 2 of a multi-round protocol):
  ``broadcast_id`` of the broadcast the batch was perturbed with, so the
  collector can refuse reports made with another round's broadcast.
"""
from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Iterator, Mapping

import fastavro

from kvldp import schemas

CONFIG_METADATA_KEY = "kvldp.config"

FINGERPRINT = "kvldp_fingerprint"
BATCH = "kvldp_batch"
ROUND = "kvldp_round"
EVENT_MS = "kvldp_event_ms"
MESSAGE_ID = "kvldp_id"
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


def write_reports(fh, reports, config: Mapping) -> None:
    """Write one report batch as an Avro container to the binary file ``fh``."""
    fastavro.writer(fh, schemas.parsed(reports.schema), reports.records(),
                    metadata={CONFIG_METADATA_KEY: canonical_config(config)}, codec="deflate")


def reports_bytes(reports, config: Mapping) -> bytes:
    """One report batch as the bytes of an Avro container (a message body)."""
    buf = io.BytesIO()
    write_reports(buf, reports, config)
    return buf.getvalue()


class ReportContainer:
    """An Avro report container opened for reading: its configuration and
    record schema from the header, then its records."""

    def __init__(self, fh):
        self._reader = fastavro.reader(fh)
        raw = self._reader.metadata.get(CONFIG_METADATA_KEY)
        self.config: dict | None = json.loads(raw) if raw else None
        self.schema_name: str = self._reader.writer_schema.get("name", "").split(".")[-1]

    def check(self, expected: Mapping, kind, where: str, layout: bool = True) -> None:
        """Refuse reports made with another configuration or of another
        report type than ``kind`` (a ``Reports`` class) with the reason
        (``layout=False``: the layout is not compared)."""
        found, want = (self.config, dict(expected)) if layout else \
            (None if self.config is None else without_layout(self.config), without_layout(expected))
        if found != want:
            raise ValueError(f"{where}: reports were made by {self.config}, but the collector was "
                             f"configured as {dict(expected)}; rerun collect with the perturbing side's parameters")
        if self.schema_name != schemas.load(kind.schema)["name"]:
            raise ValueError(f"{where}: {self.schema_name} records, but the collector reads {kind.schema} records")

    def __iter__(self) -> Iterator[dict]:
        return iter(self._reader)


def message_id(fingerprint: str, round_number: int, batch_id: int) -> str:
    return f"{fingerprint[:16]}-{round_number}-{batch_id}"


def message_attributes(config: Mapping, batch_id: int, round_number: int, event_ms: int,
                       broadcast: str | None = None) -> dict[str, str]:
    """The attributes of the message carrying batch ``batch_id`` of round
    ``round_number`` (1-based) made at ``event_ms`` (``broadcast``: the id
    of the broadcast it was perturbed with, rounds >= 2)."""
    fingerprint = config_fingerprint(config)
    out = {FINGERPRINT: fingerprint, BATCH: str(int(batch_id)), ROUND: str(int(round_number)),
           EVENT_MS: str(int(event_ms)), MESSAGE_ID: message_id(fingerprint, round_number, batch_id)}
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
