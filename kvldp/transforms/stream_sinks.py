"""Where a streaming collection's panes and dead letters go: files (one per
pane, one per dead letter) and/or Pub/Sub topics.

A pane is one element (``streaming.Pane``) holding every key's estimate, so
each pane is written as one file named by its window and pane index
(``Pane.name``): a retried bundle rewrites the same file, and a reader sees
every pane of every window apart. Every file appears whole (``publish_file``:
written under a temporary name, then renamed). (``fileio.WriteToFiles`` would regroup
the per-key records by window under its own trigger and, with accumulating
panes, emit earlier panes' records again.)
"""
from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Sequence

import apache_beam as beam
import fastavro
from apache_beam.io.filesystems import FileSystems

from kvldp import schemas
from kvldp.runtime import atomic
from kvldp.runtime.tally import JobCounter
from kvldp.schemas import envelope
from kvldp.schemas.records import estimate_records

PANE_FORMATS = ("jsonl", "avro")
# what each file sink counts as written (the job's monitor waits for them: pipelines/stream_job.py)
PANE_FILES_WRITTEN, ROUND_FILES_WRITTEN = "pane_files_written", "round_files_written"
DEAD_LETTER_FILES_WRITTEN = "dead_letter_files_written"


def publish_file(path: str, data: bytes) -> str:
    """Write ``data`` to ``path`` so that a reader watching the directory
    never sees it half-written: into a temporary name first (which no
    ``*.jsonl``/``*.avro``/``*.json`` pattern matches), then renamed."""
    with atomic.replaced_on_filesystems(path) as temporary, FileSystems.create(temporary) as fh:
        fh.write(data)
    return path


def pane_records(pane, key_names: Sequence[str], keys: Sequence[int] | None = None) -> list[dict]:
    """``windowed_estimate.avsc`` records of one pane (``keys``: the
    dictionary entries estimated; all by default)."""
    keys = list(range(len(key_names))) if keys is None else list(keys)
    head = {"window_start": pane.window_start_ms, "window_end": pane.window_end_ms, "pane_timing": pane.timing,
            "pane_index": pane.index, "pane_is_last": pane.is_last, "round": pane.round}
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
        self._written = JobCounter(job, PANE_FILES_WRITTEN)

    def process(self, pane):
        path = FileSystems.join(self._dir, f"estimates-{pane.name}.{self._fmt}")
        publish_file(path, pane_bytes(pane_records(pane, self._names, self._keys), self._fmt))
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


PUBLISH_TIMEOUT_S = 60.0


class _PublishConfirmedFn(beam.DoFn):
    """One message per element on ``topic``, confirmed by the service before
    ``published`` (a ``JobCounter``) counts it."""

    def __init__(self, topic: str, published: JobCounter):
        self._topic, self._published = topic, published

    def setup(self):
        from google.cloud import pubsub
        self._client = pubsub.PublisherClient()

    def process(self, message):
        self._client.publish(self._topic, message.data, **(message.attributes or {})).result(timeout=PUBLISH_TIMEOUT_S)
        self._published.inc()


class Publish(beam.PTransform):
    """Elements -> one message each on ``topic`` (``projects/P/topics/T``),
    made by ``to_message(element, *args)``: ``pane_message``,
    ``dead_letter_message`` or ``broadcast_message``; ``published``: a
    ``JobCounter`` of the messages the service confirmed.

    Each message is published and confirmed as it comes, and counted then,
    so the job's monitor can wait for the count before it stops
    (``pipelines/stream_job.py``). Beam's ``WriteToPubSub`` publishes a bundle's
    messages when the bundle finishes, so a job stopped once its files were
    written lost the last pane's message now and then (the streaming test's
    5 messages for 6 pane files)."""

    def __init__(self, topic: str, to_message, *args, published: JobCounter, label: str | None = None):
        super().__init__(label)
        self._topic, self._to_message, self._args, self._published = topic, to_message, args, published

    def expand(self, elements):
        messages = elements | "ToMessage" >> beam.Map(self._to_message, *self._args)
        return messages | "PublishConfirmed" >> beam.ParDo(_PublishConfirmedFn(self._topic, self._published))


def dead_letter_name(letter: dict, body: bytes) -> str:
    """``{reason}-{message id or batch}-{processing ms}-{digest}.json``: the
    digest of the letter's JSON tells apart letters the rest does not (a
    round's refusals carry no message id, batch or time), and a retried
    letter is the same file."""
    attrs = letter.get("attributes", {})
    ident = attrs.get(envelope.MESSAGE_ID) or f"batch{attrs.get(envelope.BATCH, 'unknown')}"
    digest = hashlib.blake2b(body, digest_size=6).hexdigest()
    return f"{letter['reason'].replace(' ', '_')}-{ident}-{letter['processing_time_ms']}-{digest}.json"


class _WriteDeadLetterFn(beam.DoFn):
    def __init__(self, directory: str, job: str):
        self._dir = directory
        self._written = JobCounter(job, DEAD_LETTER_FILES_WRITTEN)

    def process(self, letter: dict):
        body = json.dumps(letter).encode()
        path = publish_file(FileSystems.join(self._dir, dead_letter_name(letter, body)), body)
        self._written.inc()
        yield path


class WriteDeadLetters(beam.PTransform):
    """Dead letters -> one JSON file each under ``directory`` (reason,
    attributes, body), each counted once written (``dead_letter_files_written``)."""

    def __init__(self, directory: str, job: str, label: str | None = None):
        super().__init__(label)
        self._fn = _WriteDeadLetterFn(directory, job)

    def expand(self, letters):
        return letters | "WriteDeadLetterFiles" >> beam.ParDo(self._fn)


def dead_letter_message(letter: dict):
    """The original message (body and attributes) plus the reason, for a dead-letter topic."""
    import base64

    from apache_beam.io.gcp.pubsub import PubsubMessage
    attributes = {**letter.get("attributes", {}), "kvldp_dead_reason": letter["reason"],
                  "kvldp_dead_detail": letter.get("detail", "")[:1024]}
    return PubsubMessage(base64.b64decode(letter.get("data_base64", "")), attributes)


def broadcast_bytes(records: list[dict]) -> bytes:
    """A broadcast as an Avro container (``broadcast.avsc``): the file
    ``kvldp perturb --broadcast`` reads."""
    buf = io.BytesIO()
    fastavro.writer(buf, schemas.parsed(schemas.BROADCAST), records)
    return buf.getvalue()


class _WriteRoundFn(beam.DoFn):
    def __init__(self, directory: str, protocol, job: str):
        self._dir, self._protocol = directory, protocol
        self._written = JobCounter(job, ROUND_FILES_WRITTEN)

    def process(self, outcome):
        stem = FileSystems.join(self._dir, f"round-{outcome.round:02d}")
        publish_file(stem + ".broadcast.avro", broadcast_bytes(outcome.records))
        publish_file(stem + ".json", json.dumps(outcome.summary(self._protocol), sort_keys=True, indent=1).encode())
        self._written.inc()
        yield stem


class WriteRounds(beam.PTransform):
    """Finalised rounds -> ``DIRECTORY/round-NN.broadcast.avro`` (the broadcast
    for round NN+1) and ``round-NN.json`` (window, reports, budget spent, ledger)."""

    def __init__(self, directory: str, protocol, job: str, label: str | None = None):
        super().__init__(label)
        self._fn = _WriteRoundFn(directory, protocol, job)

    def expand(self, outcomes):
        return outcomes | "WriteRoundFiles" >> beam.ParDo(self._fn)


def broadcast_message(outcome):
    """A finalised round's broadcast as a Pub/Sub message for the devices."""
    from apache_beam.io.gcp.pubsub import PubsubMessage
    return PubsubMessage(broadcast_bytes(outcome.records), {
        envelope.ROUND: str(outcome.round), envelope.BROADCAST: outcome.broadcast_id,
        "kvldp_stopped": str(bool(outcome.state.stopped)).lower(),
        "kvldp_collection": outcome.state.collection.id,
        envelope.WINDOW_MS: str(outcome.window_end_ms - outcome.window_start_ms),
        "kvldp_window_end_ms": str(outcome.window_end_ms)})
