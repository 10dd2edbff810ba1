"""``kvldp publish``'s flags: ``kvldp perturb``'s, then where and how the
report batches are published; the job is ``kvldp.pipelines.publish``."""
from __future__ import annotations

import argparse

from kvldp.brokers import kafka as kafka_admin
from kvldp.cli import perturb
from kvldp.cli.units import parse_duration, parse_instant_ms, pubsub_path


def add_arguments(parser: argparse.ArgumentParser):
    perturb.add_arguments(parser, output_required=False)
    pub = parser.add_argument_group("publishing (to Pub/Sub: --topic; to Kafka: --kafka-bootstrap and --kafka-topic)")
    pub.add_argument("--topic", default=None, type=pubsub_path("topics"),
                     help="projects/PROJECT/topics/TOPIC (with PUBSUB_EMULATOR_HOST set: the emulator's)")
    pub.add_argument("--kafka-bootstrap", default=None, type=kafka_admin.bootstrap_arg,
                     help="HOST:PORT of a Kafka broker (deploy/kafka/kafka.sh start): publish there instead")
    pub.add_argument("--kafka-topic", default=None, type=kafka_admin.topic_arg,
                     help="the Kafka topic the report batches go to (one record per batch)")
    pub.add_argument("--kafka-partitions", default=2, type=int,
                     help="partitions of a Kafka topic made by --create-topic (default 2: a collector on Flink "
                          "reads one per task)")
    pub.add_argument("--create-topic", action="store_true",
                     help="create --topic (or --kafka-topic) if it does not exist")
    pub.add_argument("--rate", type=float, default=None, help="batches (messages) per second; default: at once")
    pub.add_argument("--event-time", type=parse_instant_ms, default="now",
                     help="event time of the first batch: now, ms since the epoch or ISO-8601 (default now)")
    pub.add_argument("--event-time-spread", type=parse_duration, default=0.0,
                     help="spread the batches' event times evenly over this period, e.g. 3m (default 0)")
    rounds = parser.add_argument_group("multi-round protocols against kvldp stream")
    rounds.add_argument("--broadcast-subscription", type=pubsub_path("subscriptions"), default=None,
                        help="where the collector's broadcasts arrive (stream --broadcast-topic)")
    rounds.add_argument("--broadcast-topic", type=pubsub_path("topics"), default=None,
                        help="create --broadcast-subscription on this topic before round 1 if missing")
    rounds.add_argument("--broadcast-timeout", type=parse_duration, default=600.0,
                        help="how long to wait for a round's broadcast (default 10m)")
    rounds.add_argument("--window", type=parse_duration, default=None,
                        help="the collector's window length (stream --window): each round's reports are stamped "
                             "inside one window")
