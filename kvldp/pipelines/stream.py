"""``kvldp stream``: continuous collection. Read report messages from a
Pub/Sub subscription or a Kafka topic, refuse what is not this collection's (dead letter with
the reason), count each batch once, window by event time, and publish the
calibrated estimates of every pane (early, on time, late) to files and/or a
topic. See ``transforms/streaming.py`` for the semantics of lateness and
deduplication.

Locally it runs on Beam's streaming DirectRunner (``PUBSUB_EMULATOR_HOST``
points it at the emulator); the same command runs on Dataflow with
``--runner DataflowRunner`` (which also deduplicates on the message id
attribute, ``id_label``). From Kafka it runs on Flink
(``--runner PortableRunner``, ``deploy/flink``): Beam's Java KafkaIO reads
the topic, with checkpoints every ``--checkpointing_interval`` (10 s) that
commit the consumer group's offsets and make the windows' state exactly
once through a TaskManager's crash. The job prints its counters every
``--progress-every`` and stops on ``--max-runtime``, ``--stop-after-windows``
or SIGINT (then it drains: it waits until every batch read is in an
emitted pane, at most ``--drain-timeout``, and exits 0). This module is the
job's configuration and graph; starting and watching it is ``stream_job.py``'s.
"""
from __future__ import annotations

import dataclasses

import apache_beam as beam

from kvldp.mechanisms.estimation.postprocess import DEFAULT as DEFAULT_POSTPROCESS
from kvldp.mechanisms.estimation.postprocess import postprocess
from kvldp.mechanisms.protocol import Collection
from kvldp.pipelines import split
from kvldp.pipelines.mechanism_config import MechanismConfig
from kvldp.runtime.tally import JobCounter
from kvldp.schemas import envelope
from kvldp.transforms.report_messages import KafkaSource, PubSubSource, ReadReportMessages
from kvldp.transforms.stream_rounds import ROUNDS, ChainRounds
from kvldp.transforms.stream_sinks import (
    Publish,
    WriteDeadLetters,
    WritePanes,
    WriteRounds,
    broadcast_message,
    dead_letter_message,
    pane_message,
)
from kvldp.transforms.streaming import (
    DEAD_LETTER,
    CalibratePanes,
    CheckReports,
    DeduplicateBatches,
    Pane,
    WindowReports,
    WindowSpec,
    expected_rounds,
)

# counters of the messages the service confirmed (stream_sinks.Publish): the job stops only after them
PANES_PUBLISHED, BROADCASTS_PUBLISHED = "pane_messages_published", "broadcasts_published"
DEAD_LETTERS_PUBLISHED = "dead_letters_published"
DEFAULT_DEDUPE_HORIZON = 3600.0


@dataclasses.dataclass(frozen=True)
class StreamConfig:
    """A continuous collection: the mechanism, the subscription, the key
    names, the windows, the sinks and when to stop."""

    mechanism: MechanismConfig
    subscription: str | None
    windows: WindowSpec
    key_dictionary: str | None = None
    keys: int | None = None
    dedupe_horizon: float | None = None     # None: DEFAULT_DEDUPE_HORIZON, or longer for long windows
    output_dir: str | None = None
    output_format: str = "jsonl"
    output_topic: str | None = None
    dead_letter_dir: str | None = None
    dead_letter_topic: str | None = None
    max_runtime: float | None = None
    stop_after_windows: int | None = None
    progress_every: float = 10.0
    drain_timeout: float = 60.0
    subscribe_to: str | None = None
    collection_id: str | None = None
    broadcast_topic: str | None = None
    postprocess: str = DEFAULT_POSTPROCESS.name     # kvldp.mechanisms.estimation.postprocess, per pane
    kafka_bootstrap: str | None = None
    kafka_topic: str | None = None
    kafka_group: str | None = None
    expansion_service: str = "localhost:8097"

    def __post_init__(self):
        if bool(self.kafka_bootstrap) != bool(self.kafka_topic):
            raise ValueError("Kafka needs both --kafka-bootstrap and --kafka-topic")
        if bool(self.subscription) == bool(self.kafka_topic):
            raise ValueError("stream reads one source: --subscription (Pub/Sub) or --kafka-bootstrap/--kafka-topic")
        reach = self.windows.size + self.windows.allowed_lateness + self.windows.max_future
        if self.dedupe_horizon is None:
            object.__setattr__(self, "dedupe_horizon", max(DEFAULT_DEDUPE_HORIZON, reach))
        if self.dedupe_horizon < reach:
            raise ValueError(f"--dedupe-horizon {self.dedupe_horizon:g} s is shorter than a window plus its "
                             f"--allowed-lateness and --max-future ({reach:g} s): a redelivery the windows still "
                             "take could be counted twice")
        if self.kafka_topic and self.subscribe_to:
            raise ValueError("--subscribe-to makes a Pub/Sub subscription: not with Kafka (publish "
                             "--create-topic makes the Kafka topic)")
        if not self.key_dictionary and not self.keys:
            raise ValueError("stream needs --key-dictionary (written by perturb/publish) or --keys d")
        if not self.output_dir and not self.output_topic:
            raise ValueError("stream needs a sink: --output-dir and/or --output-topic")
        if self.mechanism.takes_ioh_keys() and not self.mechanism.ioh_keys:
            raise ValueError("stream cannot read IOH's keys from report files: name them with --ioh-keys")
        if self.mechanism.get("padding") == "auto":
            raise ValueError("stream cannot read the padding from report files: give --padding l")

    @classmethod
    def from_args(cls, args) -> StreamConfig:
        spec = WindowSpec(args.window, args.sliding_every, args.early_every, args.allowed_lateness, args.max_future)
        progress = args.progress_every or args.early_every or 10.0
        return cls(MechanismConfig.from_args(args), args.subscription, spec, args.key_dictionary, args.keys,
                   args.dedupe_horizon, args.output_dir, args.output_format, args.output_topic,
                   args.dead_letter_dir, args.dead_letter_topic, args.max_runtime, args.stop_after_windows,
                   progress, args.drain_timeout, args.subscribe_to, args.collection_id,
                   args.broadcast_topic, args.postprocess, args.kafka_bootstrap, args.kafka_topic,
                   args.kafka_group, args.expansion_service)

    def source(self, fingerprint: str, id_label: bool):
        """Where the report messages come from (``transforms.report_messages``)."""
        if self.kafka_topic:
            return KafkaSource(self.kafka_bootstrap, self.kafka_topic, self.kafka_group or f"kvldp-{fingerprint[:16]}",
                               self.expansion_service)
        return PubSubSource(self.subscription, id_label)


def postprocess_pane(pane: Pane, method: str) -> Pane:
    """The pane with its estimates post-processed (``kvldp.mechanisms.estimation.postprocess``)."""
    return dataclasses.replace(pane, estimates=postprocess(pane.estimates, method))


def round_configs(protocol, collection_id: str | None) -> list[dict]:
    """What each round's reports are pinned to (``split.round_config``; a
    multi-round protocol's collection by id, its layout learnt from round 1)."""
    if protocol.max_rounds == 1:
        return [split.round_config(protocol, 0, None)]
    collection = Collection(collection_id)
    return [split.round_config(protocol, r, collection) for r in range(protocol.max_rounds)]


def stream_graph(p: beam.Pipeline, config: StreamConfig, protocol, key_names, id_label: bool, job: str):
    """``source -> panes`` with the sinks attached; returns the panes
    (``job``: the key of the job's in-process counters, ``runtime.tally``).
    One graph for every source: only the read differs."""
    configs = round_configs(protocol, config.collection_id)
    source = config.source(envelope.config_fingerprint(configs[0]), id_label)
    messages = p | "ReadMessages" >> ReadReportMessages(source)
    checked = messages | "CheckReports" >> CheckReports(
        protocol, expected_rounds(protocol, configs), config.windows.max_future, job)
    unique = checked["reports"] | "DeduplicateBatches" >> DeduplicateBatches(config.dedupe_horizon, job)
    windowed = unique | "Windows" >> WindowReports(config.windows, job)
    dead = [checked[DEAD_LETTER], windowed[DEAD_LETTER]]
    if protocol.max_rounds == 1:
        panes = windowed["reports"] | "CalibratePanes" >> CalibratePanes(protocol, job)
    else:
        chained = windowed["reports"] | "ChainRounds" >> ChainRounds(protocol, config.collection_id, key_names,
                                                                     job)
        panes = chained["panes"]
        dead.append(chained[DEAD_LETTER])
        if config.output_dir:
            chained[ROUNDS] | "WriteRounds" >> WriteRounds(config.output_dir, protocol, job)
        if config.broadcast_topic:
            chained[ROUNDS] | "PublishBroadcasts" >> Publish(config.broadcast_topic, broadcast_message,
                                                             published=JobCounter(job, BROADCASTS_PUBLISHED))
    panes = panes | "Postprocess" >> beam.Map(postprocess_pane, config.postprocess)
    keys = protocol.estimate_keys
    if config.output_dir:
        panes | "WritePanes" >> WritePanes(config.output_dir, key_names, job, keys, config.output_format)
    if config.output_topic:
        panes | "PublishPanes" >> Publish(config.output_topic, pane_message, list(key_names), keys,
                                          envelope.config_fingerprint(configs[0]),
                                          published=JobCounter(job, PANES_PUBLISHED))
    letters = tuple(dead) | "DeadLetters" >> beam.Flatten()
    if config.dead_letter_dir:
        letters | "WriteDeadLetters" >> WriteDeadLetters(config.dead_letter_dir, job)
    if config.dead_letter_topic:
        letters | "PublishDeadLetters" >> Publish(config.dead_letter_topic, dead_letter_message,
                                                  published=JobCounter(job, DEAD_LETTERS_PUBLISHED))
    return panes
