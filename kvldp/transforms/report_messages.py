"""Where a streaming collector's report messages come from: a Pub/Sub
subscription or a Kafka topic. Both give the same elements — a body and its
attributes (``schemas.envelope``), timestamped with the batch's event time —
so everything after the read (checks, deduplication, windows, panes) is one
graph whatever the source (``pipelines/stream.py``).

* Pub/Sub: Beam's ``ReadFromPubSub``, the event time from the
  ``kvldp_event_ms`` attribute, ``id_label`` where the runner honours it.
* Kafka: Beam's Java ``KafkaIO`` through ``ReadFromKafka`` (a
  cross-language transform, expanded by the expansion service that
  ``deploy/flink/flink.sh job-server`` starts beside the job server, as
  KafkaIO's UnboundedSource, which Flink runs natively in the job's JVM). The record's
  timestamp (CreateTime, set by ``kvldp publish`` to the event time) is the
  element's; headers are the attributes. Offsets are committed to the
  consumer group when Flink finalises a checkpoint, so a job restored from
  a checkpoint re-reads exactly what its restored state has not seen, and a
  new job starts after what the last one committed.
"""
from __future__ import annotations

import dataclasses

import apache_beam as beam

from kvldp.schemas import envelope

# Kafka's consumer fetches at most this much of a partition at once: a batch is up to Pub/Sub's 10 MB
MAX_FETCH_BYTES = 10 * 1024 * 1024 + 4096


@dataclasses.dataclass(frozen=True)
class ReportMessage:
    """A report message from a source other than Pub/Sub: what a
    ``PubsubMessage`` offers the checks (``data``, ``attributes``)."""

    data: bytes
    attributes: dict


def kafka_message(row) -> ReportMessage:
    """A KafkaIO record with metadata -> its value and headers (as strings;
    a header that is not UTF-8 is kept replaced, and the check refuses it).
    A header named twice keeps its first value: a device cannot override
    an attribute by repeating it."""
    attributes: dict[str, str] = {}
    for header in row.headers or ():
        if header.key not in attributes:
            attributes[header.key] = bytes(header.value or b"").decode("utf-8", errors="replace")
    return ReportMessage(bytes(row.value or b""), attributes)


@dataclasses.dataclass(frozen=True)
class PubSubSource:
    """A Pub/Sub subscription (``projects/P/subscriptions/S``); ``id_label``:
    let the runner deduplicate on the message id attribute (Dataflow)."""

    subscription: str
    id_label: bool = False

    @property
    def name(self) -> str:
        return self.subscription

    def read(self, p):
        return p | "Read" >> beam.io.ReadFromPubSub(
            subscription=self.subscription, with_attributes=True, timestamp_attribute=envelope.EVENT_MS,
            id_label=envelope.MESSAGE_ID if self.id_label else None)


@dataclasses.dataclass(frozen=True)
class KafkaSource:
    """A Kafka topic read as consumer group ``group`` (offsets committed on
    checkpoints), expanded by the expansion service at ``expansion_service``."""

    bootstrap: str
    topic: str
    group: str
    expansion_service: str

    @property
    def name(self) -> str:
        return f"kafka://{self.bootstrap}/{self.topic} (group {self.group})"

    def consumer_config(self) -> dict[str, str]:
        # offsets are committed by Beam on checkpoints, never by the client on its own timer
        return {"bootstrap.servers": self.bootstrap, "group.id": self.group, "auto.offset.reset": "earliest",
                "enable.auto.commit": "false", "max.partition.fetch.bytes": str(MAX_FETCH_BYTES),
                "fetch.max.bytes": str(4 * MAX_FETCH_BYTES)}

    def read(self, p):
        from apache_beam.io.kafka import ReadFromKafka
        return (p
                | "Read" >> ReadFromKafka(self.consumer_config(), [self.topic], with_metadata=True,
                                          timestamp_policy=ReadFromKafka.create_time_policy,
                                          commit_offset_in_finalize=True,
                                          expansion_service=self.expansion_service)
                | "Messages" >> beam.Map(kafka_message))


class ReadReportMessages(beam.PTransform):
    """``PBegin -> messages`` (``.data``, ``.attributes``, event timestamps)
    from ``source`` (``PubSubSource`` or ``KafkaSource``)."""

    def __init__(self, source, label: str | None = None):
        super().__init__(label)
        self._source = source

    def expand(self, p):
        return self._source.read(p)
