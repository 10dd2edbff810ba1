"""Kafka for the streaming path, through the field's client (``confluent-kafka``,
librdkafka): is the broker there, make a topic, and the producer the device
side publishes report batches with (``kvldp publish --kafka-bootstrap``).
The collector reads Kafka with Beam's own KafkaIO (``transforms/report_messages.py``).

A report batch is one record: the message id as key, the Avro container as
value, the envelope's attributes as headers and the batch's event time as
the record's timestamp (CreateTime), which the collector's windows use.
"""
from __future__ import annotations

import re

from kvldp.runtime import extras

PROBE_TIMEOUT_S = 10.0
START_HINT = "start one with `deploy/kafka/kafka.sh start --port PORT`"
# a report batch may be large (unary reports of big domains): Pub/Sub's 10 MB, not Kafka's default 1 MB
MAX_MESSAGE_BYTES = 10 * 1024 * 1024
_TOPIC = re.compile(r"^[A-Za-z0-9._-]{1,249}$")
_BOOTSTRAP = re.compile(r"^[^\s,:]+:\d{1,5}(,[^\s,:]+:\d{1,5})*$")


class KafkaUnavailable(ValueError):
    """No broker answers, or the topic cannot be used."""


def bootstrap_arg(value: str) -> str:
    """argparse type: ``HOST:PORT[,HOST:PORT…]``."""
    if not _BOOTSTRAP.match(value or ""):
        import argparse
        raise argparse.ArgumentTypeError(f"expected HOST:PORT[,HOST:PORT…], got {value!r}")
    return value


def topic_arg(value: str) -> str:
    """argparse type: a legal Kafka topic name."""
    if not _TOPIC.match(value or "") or value in (".", ".."):
        import argparse
        raise argparse.ArgumentTypeError(f"a Kafka topic is 1-249 of [A-Za-z0-9._-], got {value!r}")
    return value


def _admin(bootstrap: str):
    extras.require("confluent_kafka", "Kafka", "kafka")
    from confluent_kafka.admin import AdminClient
    return AdminClient({"bootstrap.servers": bootstrap})


def topics(bootstrap: str, timeout: float = PROBE_TIMEOUT_S) -> dict[str, int]:
    """``topic -> partitions`` on the cluster; a clear error when no broker answers."""
    from confluent_kafka import KafkaException
    try:
        meta = _admin(bootstrap).list_topics(timeout=timeout)
    except KafkaException as err:
        raise KafkaUnavailable(f"no Kafka broker answers at {bootstrap} (waited {timeout:g} s: "
                               f"{err.args[0].str() if err.args else err}): {START_HINT}") from None
    return {name: len(t.partitions) for name, t in meta.topics.items()}


def check_topic(bootstrap: str, topic: str, create: bool = False, partitions: int = 2) -> bool:
    """Before any compute: the broker answers and ``topic`` exists (created
    with ``partitions`` when ``create``); returns whether it was created."""
    existing = topics(bootstrap)
    if topic in existing:
        return False
    if not create:
        raise KafkaUnavailable(f"Kafka topic {topic} does not exist on {bootstrap}: create it, or pass "
                               "--create-topic")
    from confluent_kafka.admin import NewTopic
    admin = _admin(bootstrap)           # kept alive until the futures resolve (a dropped client fails them)
    futures = admin.create_topics(
        [NewTopic(topic, num_partitions=partitions, replication_factor=1,
                  config={"max.message.bytes": str(MAX_MESSAGE_BYTES)})], operation_timeout=30)
    for future in futures.values():
        future.result(timeout=60)
    return True


def producer(bootstrap: str):
    """An idempotent producer (a retried send is written once) that waits for
    the broker's acknowledgement of every record."""
    extras.require("confluent_kafka", "Kafka", "kafka")
    import confluent_kafka
    return confluent_kafka.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all",
                                     "linger.ms": 5, "message.max.bytes": MAX_MESSAGE_BYTES,
                                     "compression.type": "none"})


class KafkaSink:
    """Report batches -> records of ``topic`` (see the module's docstring).
    ``flush`` waits until the broker acknowledged every record and raises
    on any that failed, naming it: nothing is lost in silence."""

    def __init__(self, bootstrap: str, topic: str, client=None):
        self.bootstrap, self.topic = bootstrap, topic
        self._producer = client or producer(bootstrap)
        self._failed: list[str] = []
        self.name = f"kafka://{bootstrap}/{topic}"

    def _delivered(self, err, record):
        if err is not None:
            self._failed.append(f"{record.key().decode(errors='replace')}: {err.str()}")

    def send(self, body: bytes, attributes: dict[str, str], event_ms: int, key: str) -> None:
        while True:
            try:
                self._producer.produce(self.topic, value=body, key=key.encode(), timestamp=int(event_ms),
                                       headers=[(k, v.encode()) for k, v in attributes.items()],
                                       on_delivery=self._delivered)
                break
            except BufferError:          # the local queue is full: let librdkafka send some first
                self._producer.poll(0.5)
        self._producer.poll(0)

    def flush(self, timeout: float = 60.0) -> None:
        left = self._producer.flush(timeout)
        if left:
            raise KafkaUnavailable(f"{left} record(s) to {self.name} were not acknowledged within {timeout:g} s")
        if self._failed:
            raise KafkaUnavailable(f"{len(self._failed)} record(s) to {self.name} failed: "
                                   + "; ".join(self._failed[:3]))
