"""``kvldp publish``: the device side in a box. Perturb users exactly as
``kvldp perturb`` does (same seeding, batches and report files), then publish
each report batch as one Pub/Sub message (``schemas.envelope``: the Avro
container as body; fingerprint, batch, round, event time and message id as
attributes), paced by ``--rate`` and with event times spread over
``--event-time-spread``, as devices reporting over time would.

A multi-round protocol runs its rounds against ``kvldp stream``: after
round r the devices wait for the broadcast the collector publishes when
round r's window closes (``--broadcast-subscription``), perturb round r+1
with it (``perturb --round r+1 --broadcast``: same checks of the collection
and layout) and publish it with the broadcast's id, event times from the
moment they received it.
"""
from __future__ import annotations

import dataclasses
import io
import os
import re
import time
from collections.abc import Callable, Sequence

import fastavro
from apache_beam.io.filesystems import FileSystems

from kvldp.brokers import kafka as kafka_admin
from kvldp.brokers.pubsub import PubSubSink, check_reachable, ensure_subscription, ensure_topic
from kvldp.mechanisms.privacy.randomness import fresh_seed
from kvldp.pipelines import split
from kvldp.pipelines.split import PerturbConfig
from kvldp.runtime import extras
from kvldp.schemas import envelope


@dataclasses.dataclass(frozen=True)
class PublishConfig:
    """The perturbing (``perturb``: its output is where the report files are
    kept; a scratch directory by default) and the publishing: ``topic``,
    ``rate`` (messages/s, ``None``: unpaced), the first event time and the
    spread of the event times (seconds)."""

    perturb: PerturbConfig
    topic: str | None
    rate: float | None = None
    event_time_ms: int | None = None
    event_time_spread: float = 0.0
    create_topic: bool = False
    broadcast_subscription: str | None = None
    broadcast_topic: str | None = None
    broadcast_timeout: float = 600.0
    window: float | None = None
    kafka_bootstrap: str | None = None
    kafka_topic: str | None = None
    kafka_partitions: int = 2

    def __post_init__(self):
        if bool(self.kafka_bootstrap) != bool(self.kafka_topic):
            raise ValueError("Kafka needs both --kafka-bootstrap and --kafka-topic")
        if bool(self.topic) == bool(self.kafka_topic):
            raise ValueError("publish to one place: --topic (Pub/Sub) or --kafka-bootstrap/--kafka-topic (Kafka)")
        if self.kafka_partitions < 1:
            raise ValueError(f"--kafka-partitions must be >= 1, got {self.kafka_partitions}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"--rate must be > 0, got {self.rate}")
        if self.event_time_spread < 0:
            raise ValueError("--event-time-spread must be >= 0")

    @classmethod
    def from_args(cls, args) -> PublishConfig:
        return cls(PerturbConfig.from_args(args), args.topic, args.rate, args.event_time, args.event_time_spread,
                   args.create_topic, args.broadcast_subscription, args.broadcast_topic, args.broadcast_timeout,
                   args.window, args.kafka_bootstrap, args.kafka_topic, args.kafka_partitions)

    @property
    def destination(self) -> str:
        return f"kafka://{self.kafka_bootstrap}/{self.kafka_topic}" if self.kafka_topic else self.topic

    def sink(self):
        """Where the batches go: a ``kafka_admin.KafkaSink`` or a ``pubsub_admin.PubSubSink``."""
        if self.kafka_topic:
            return kafka_admin.KafkaSink(self.kafka_bootstrap, self.kafka_topic)
        return PubSubSink(self.topic)


_BATCH_FILE = re.compile(r"-(\d+)\.avro$")


def report_files(prefix: str) -> list[tuple[int, str]]:
    """``(batch id, path)`` of the report files ``perturb`` wrote under ``prefix``."""
    matched = FileSystems.match([f"{prefix}-*.avro"])[0].metadata_list
    out = []
    for meta in matched:
        found = _BATCH_FILE.search(meta.path)
        if found:
            out.append((int(found.group(1)), meta.path))
    return sorted(out)


def spread_event_times(n: int, start_ms: int, spread_s: float) -> list[int]:
    """``n`` event times from ``start_ms``, evenly over ``spread_s`` seconds."""
    return [start_ms + round(1000 * spread_s * i / n) for i in range(n)]


def publish_report_files(files: Sequence[tuple[int, str]], sink, event_ms: Sequence[int],
                         round_number: int = 1, rate: float | None = None,
                         on_publish: Callable[[int, dict], None] | None = None,
                         broadcast: str | None = None, run: str | None = None) -> list[dict]:
    """Publish each report file as one message to ``sink`` (a
    ``pubsub_admin.PubSubSink``, a ``kafka_admin.KafkaSink``, or a Pub/Sub
    topic's path); return the attributes sent (``broadcast``: the id of the
    broadcast the reports were perturbed with; ``run``: the publishing
    run's nonce, ``envelope.new_run()`` by default).

    The message id attribute is (configuration, round, batch, run): sending
    a file again with the same ``run`` is a redelivery the collector counts
    once; another run's batches are other devices' and all count."""
    sink = PubSubSink(sink) if isinstance(sink, str) else sink
    run = run or envelope.new_run()
    sent = []
    start = time.monotonic()
    for i, ((batch, path), when) in enumerate(zip(files, event_ms, strict=True)):
        if rate:
            delay = start + i / rate - time.monotonic()
            if delay > 0:
                time.sleep(delay)
        with FileSystems.open(path) as fh:
            body = fh.read()
        config = envelope.ReportContainer(io.BytesIO(body)).config
        if config is None:
            raise ValueError(f"{path} carries no configuration (not written by kvldp perturb?)")
        attributes = envelope.message_attributes(config, batch, round_number, when, run, broadcast)
        sink.send(body, attributes, when, attributes[envelope.MESSAGE_ID])
        sent.append(attributes)
        if on_publish is not None:
            on_publish(i, attributes)
    sink.flush()
    return sent


def wait_for_broadcast(subscription: str, round_number: int, timeout: float, subscriber=None):
    """The broadcast after round ``round_number`` from ``subscription``:
    ``(body, attributes)``. Older rounds' broadcasts are acknowledged and
    skipped; a newer one, or none within ``timeout`` seconds, is an error."""
    from google.cloud import pubsub_v1
    subscriber = subscriber or pubsub_v1.SubscriberClient()
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        response = subscriber.pull(subscription=subscription, max_messages=10, timeout=5)
        if not response.received_messages:
            time.sleep(0.2)
            continue
        subscriber.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in response.received_messages])
        for received in response.received_messages:
            attrs = dict(received.message.attributes)
            found = int(attrs.get(envelope.ROUND, 0))
            if found == round_number:
                return received.message.data, attrs
            if found > round_number:
                raise ValueError(f"{subscription} delivered the broadcast of round {found} while waiting for "
                                 f"round {round_number}'s: the devices missed a round")
    raise ValueError(f"no broadcast of round {round_number} on {subscription} within {timeout:g} s "
                     "(is kvldp stream running with --broadcast-topic, and has round's window closed?)")


def discard_pending(subscription: str, subscriber=None) -> int:
    """Acknowledge what is already on ``subscription`` (broadcasts of an
    earlier collection must not steer this one's rounds); how many."""
    from google.cloud import pubsub_v1
    subscriber = subscriber or pubsub_v1.SubscriberClient()
    dropped = 0
    while True:
        response = subscriber.pull(subscription=subscription, max_messages=100, timeout=2)
        if not response.received_messages:
            return dropped
        subscriber.acknowledge(subscription=subscription, ack_ids=[m.ack_id for m in response.received_messages])
        dropped += len(response.received_messages)


def _publish_round(config: PublishConfig, perturb: PerturbConfig, beam_args, run: str,
                   broadcast: str | None = None, window_ms: int | None = None) -> dict:
    """Perturb one round and publish it. Event times: from ``--event-time``
    if given, else from when they are published; with ``window_ms`` (a
    multi-round protocol) kept inside one of the collector's windows
    (``envelope.next_round_event_ms``)."""
    done = split.run_perturb(perturb, beam_args)
    files = report_files(perturb.prefix)
    if not files:
        raise ValueError(f"perturb wrote no report files under {perturb.prefix}")
    now = int(time.time() * 1000)
    if perturb.round == 1 and config.event_time_ms is not None:
        start_ms = config.event_time_ms
    elif window_ms is not None:
        start_ms = envelope.next_round_event_ms(now, window_ms)
    else:
        start_ms = now
    times = spread_event_times(len(files), start_ms, config.event_time_spread)
    began = time.perf_counter()
    sent = publish_report_files(files, config.sink(), times, perturb.round, config.rate, broadcast=broadcast,
                                run=run)
    seconds = time.perf_counter() - began
    users = done["stats"].get("reports_written", 0)
    label = f" round {perturb.round}" if done["mechanism"].max_rounds > 1 else ""
    print(f"published {len(sent)} report batches{label} ({users} users) of {done['mechanism']!r} to "
          f"{config.destination} in {seconds:.1f} s (run {run}); event times {times[0]} … {times[-1]} ms; fingerprint "
          f"{sent[0][envelope.FINGERPRINT][:16]}…", flush=True)
    return {**done, "sent": sent, "files": files, "event_ms": times, "seconds": seconds}


def run(config: PublishConfig, beam_args) -> dict:
    perturb = config.perturb
    rounds = perturb.mechanism.make(2).max_rounds
    if not config.kafka_topic or config.broadcast_subscription:
        extras.require_gcp("Pub/Sub")
    if rounds > 1 and (not config.broadcast_subscription or not config.window):
        raise ValueError(f"{perturb.mechanism.name} runs {rounds} rounds: give --broadcast-subscription (where "
                         "kvldp stream --broadcast-topic publishes each round's broadcast) and --window (the "
                         "collector's window length)")
    window_ms = round(config.window * 1000) if rounds > 1 else None
    _prepare_destination(config, rounds)
    perturb = _perturb_to_publish(perturb, rounds)
    run_nonce = envelope.new_run()      # one per publish: every round's batches are this run's devices
    first = _publish_round(config, perturb, beam_args, run_nonce, window_ms=window_ms)
    out = {**first, "rounds": [first]}
    if rounds == 1:
        return out
    cid = first["collection"].id
    print(f"collection id {cid} (kvldp stream --collection-id {cid})", flush=True)
    out["rounds"] += _later_rounds(config, perturb, beam_args, run_nonce, window_ms, rounds, cid)
    return out


def _prepare_destination(config: PublishConfig, rounds: int):
    """Before any perturbing: the topic (Kafka or Pub/Sub) and the broadcast
    subscription are there (made if asked), an earlier collection's
    broadcasts dropped."""
    if config.kafka_topic:
        if kafka_admin.check_topic(config.kafka_bootstrap, config.kafka_topic, config.create_topic,
                                   config.kafka_partitions):
            print(f"created Kafka topic {config.kafka_topic} ({config.kafka_partitions} partitions)")
        if config.broadcast_subscription:       # a multi-round protocol's broadcasts come on Pub/Sub
            check_reachable(subscription=config.broadcast_subscription)
    else:
        check_reachable(topic=config.topic, subscription=config.broadcast_subscription)
        if config.create_topic and ensure_topic(config.topic):
            print(f"created topic {config.topic}")
    if config.broadcast_topic and ensure_subscription(config.broadcast_subscription, config.broadcast_topic):
        print(f"created subscription {config.broadcast_subscription} on {config.broadcast_topic}")
    if rounds > 1:
        stale = discard_pending(config.broadcast_subscription)
        if stale:
            print(f"discarded {stale} broadcasts of an earlier collection on {config.broadcast_subscription}")


def _perturb_to_publish(perturb: PerturbConfig, rounds: int) -> PerturbConfig:
    """The perturbing, with its report files kept (by default under
    ``./kvldp-published``) and, over several rounds, one seed for all."""
    if not perturb.output:          # the key dictionary and manifest are the collector's: keep them
        perturb = dataclasses.replace(perturb, output=os.path.abspath(os.path.join("kvldp-published",
                                                                                   "REPORTS.avro")))
    if rounds > 1 and perturb.data.seed is None:
        # every round must see the same users: one fresh secret seed for the whole collection
        perturb = dataclasses.replace(perturb, data=dataclasses.replace(perturb.data, seed=fresh_seed()))
    return perturb


def _later_rounds(config: PublishConfig, perturb: PerturbConfig, beam_args, run_nonce: str, window_ms: int,
                  rounds: int, cid: str) -> list[dict]:
    """Rounds 2 … ``rounds``: each waits for the collector's broadcast of the
    round before, checks it, and perturbs and publishes with it; stops early
    when the broadcast says the protocol has ended."""
    done = []
    base = perturb.output[:-len(".avro")] if perturb.output.endswith(".avro") else perturb.output
    for r in range(2, rounds + 1):
        body, attrs = wait_for_broadcast(config.broadcast_subscription, r - 1, config.broadcast_timeout)
        path = f"{base}.round{r - 1}.broadcast.avro"
        with FileSystems.create(path) as fh:
            fh.write(body)
        if attrs.get("kvldp_stopped") == "true":
            print(f"the collector's broadcast after round {r - 1} says the protocol has ended")
            break
        claimed = attrs.get(envelope.BROADCAST)
        if int(attrs.get(envelope.WINDOW_MS, 0)) != window_ms:
            raise ValueError(f"--window is {window_ms} ms but the collector's windows are "
                             f"{attrs.get(envelope.WINDOW_MS)} ms: rounds would straddle its windows")
        if envelope.broadcast_id(fastavro_records(body)) != claimed:
            raise ValueError(f"the broadcast of round {r - 1} does not match its id {claimed}")
        this = dataclasses.replace(perturb, round=r, broadcast=path, collection_id=cid,
                                   output=f"{base}.round{r}.avro")
        done.append(_publish_round(config, this, beam_args, run_nonce, claimed, window_ms=window_ms))
    return done


def fastavro_records(body: bytes) -> list[dict]:
    return list(fastavro.reader(io.BytesIO(body)))
