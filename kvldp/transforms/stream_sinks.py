"""Where a streaming collection's panes and dead letters go: files (one per
pane, one per dead letter) and/or Pub/Sub topics.

A pane is one element (``streaming.Pane``) holding every key's estimate, so
each pane is written as one file named by its window and pane index
(``Pane.name``): a retried bundle rewrites the same file, and a reader sees
every pane of every window apart. (``fileio.WriteToFiles`` would regroup
the per-key records by window under its own trigger and, with accumulating
panes, emit earlier panes' records again.)
"""
from __future__ import annotations

import io
import json
from collections.abc import Sequence

import apache_beam as beam
import fastavro
from apache_beam.io.filesystems import FileSystems

from kvldp import schemas
from kvldp.schemas import envelope
from kvldp.schemas.records import estimate_records
from kvldp.transforms.tally import JobCounter

PANE_FORMATS = ("jsonl", "avro")


def pane_records(pane, key_names: Sequence[str], keys: Sequence[int] | None = None) -> list[dict]:
    """``windowed_estimate.avsc`` records of one pane (``keys``: the
    dictionary entries estimated; all by default)."""
    keys = list(range(len(key_names))) if keys is None else list(keys)
    head = {"window_start": pane.window_start_ms, "window_end": pane.window_end_ms, "pane_timing": pane.timing,
            "pane_index": pane.index, "pane_is_last": pane.is_last}
    return [{**head, **r} for r in estimate_records(pane.estimates, [key_names[k] for k in keys])]


def pane_bytes(records: list[dict], fmt: str) -> bytes:
    if fmt == "jsonl":
        return "".join(json.dumps(r) + "\n" for r in records).encode()
    buf = io.BytesIO()
    fastavro.writer(buf, schemas.parsed(schemas.WINDOWED_ESTIMATE), records, codec="deflate")
    return buf.getvalue()


class _WritePaneFn(beam.DoFn):
    def __init__(self, directory: str, fmt: str, key_names, keys, job: str):
        self._dir, self._fmt, self._names, self._keys = directory, fmt, list(key_names), keys
        self._written = JobCounter(job, "pane_files_written")

    def process(self, pane):
        path = FileSystems.join(self._dir, f"estimates-{pane.name}.{self._fmt}")
        with FileSystems.create(path) as fh:
            fh.write(pane_bytes(pane_records(pane, self._names, self._keys), self._fmt))
        self._written.inc()
        yield path


class WritePanes(beam.PTransform):
    """Panes -> ``DIRECTORY/estimates-{start}-{end}-pane{NNN}-{TIMING}.{jsonl|avro}``."""

    def __init__(self, directory: str, key_names, job: str, keys=None, fmt: str = "jsonl",
                 label: str | None = None):
        super().__init__(label)
        if fmt not in PANE_FORMATS:
            raise ValueError(f"pane files are one of {PANE_FORMATS}, not {fmt!r}")
        self._fn = _WritePaneFn(directory, fmt, key_names, keys, job)

    def expand(self, panes):
        return panes | "WritePaneFiles" >> beam.ParDo(self._fn)


def pane_message(pane, key_names, keys, fingerprint: str):
    """One pane as a Pub/Sub message: Avro body, the window and pane as attributes."""
    from apache_beam.io.gcp.pubsub import PubsubMessage
    attributes = {"window_start_ms": str(pane.window_start_ms), "window_end_ms": str(pane.window_end_ms),
                  "pane_timing": pane.timing, "pane_index": str(pane.index), "n_reports": str(pane.n_reports),
                  envelope.FINGERPRINT: fingerprint}
    return PubsubMessage(pane_bytes(pane_records(pane, key_names, keys), "avro"), attributes)


class PublishPanes(beam.PTransform):
    """Panes -> one message per pane on ``topic`` (``projects/P/topics/T``)."""

    def __init__(self, topic: str, key_names, keys, fingerprint: str, label: str | None = None):
        super().__init__(label)
        self._topic, self._names, self._keys, self._fingerprint = topic, list(key_names), keys, fingerprint

    def expand(self, panes):
        return (panes
                | "ToMessage" >> beam.Map(pane_message, self._names, self._keys, self._fingerprint)
                | "Publish" >> beam.io.WriteToPubSub(self._topic, with_attributes=True))


class _WriteDeadLetterFn(beam.DoFn):
    def __init__(self, directory: str):
        self._dir = directory

    def process(self, letter: dict):
        attrs = letter.get("attributes", {})
        ident = attrs.get(envelope.MESSAGE_ID) or f"batch{attrs.get(envelope.BATCH, 'unknown')}"
        name = f"{letter['reason'].replace(' ', '_')}-{ident}-{letter['processing_time_ms']}.json"
        path = FileSystems.join(self._dir, name)
        with FileSystems.create(path) as fh:
            fh.write(json.dumps(letter).encode())
        yield path


class WriteDeadLetters(beam.PTransform):
    """Dead letters -> one JSON file each under ``directory`` (reason, attributes, body)."""

    def __init__(self, directory: str, label: str | None = None):
        super().__init__(label)
        self._fn = _WriteDeadLetterFn(directory)

    def expand(self, letters):
        return letters | "WriteDeadLetterFiles" >> beam.ParDo(self._fn)


def dead_letter_message(letter: dict):
    """The original message (body and attributes) plus the reason, for a dead-letter topic."""
    import base64

    from apache_beam.io.gcp.pubsub import PubsubMessage
    attributes = {**letter.get("attributes", {}), "kvldp_dead_reason": letter["reason"],
                  "kvldp_dead_detail": letter.get("detail", "")[:1024]}
    return PubsubMessage(base64.b64decode(letter.get("data_base64", "")), attributes)


class PublishDeadLetters(beam.PTransform):
    def __init__(self, topic: str, label: str | None = None):
        super().__init__(label)
        self._topic = topic

    def expand(self, letters):
        return (letters
                | "ToMessage" >> beam.Map(dead_letter_message)
                | "Publish" >> beam.io.WriteToPubSub(self._topic, with_attributes=True))
