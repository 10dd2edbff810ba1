"""``kvldp stream``'s flags; the job is ``kvldp.pipelines.stream``."""
from __future__ import annotations

import argparse

from kvldp.brokers import kafka as kafka_admin
from kvldp.cli import mechanism_args
from kvldp.cli.job_args import add_postprocess_arg, collection_id
from kvldp.cli.units import parse_duration, path_arg, positive_int, pubsub_path
from kvldp.transforms.stream_sinks import PANE_FORMATS


def add_arguments(parser: argparse.ArgumentParser):
    mechanism_args.add_mechanism_args(parser)
    mechanism_args.add_longitudinal_args(parser)
    src = parser.add_argument_group("source (Pub/Sub: --subscription; Kafka on Flink: --kafka-bootstrap, "
                                    "--kafka-topic)")
    src.add_argument("--subscription", default=None, type=pubsub_path("subscriptions"),
                     help="projects/PROJECT/subscriptions/NAME the report messages arrive on")
    src.add_argument("--subscribe-to", type=pubsub_path("topics"), default=None,
                     help="create --subscription on this topic (and the topic) if they do not exist")
    src.add_argument("--kafka-bootstrap", default=None, type=kafka_admin.bootstrap_arg,
                     help="HOST:PORT of the Kafka broker the report batches are published to")
    src.add_argument("--kafka-topic", default=None, type=kafka_admin.topic_arg, help="the Kafka topic to read")
    src.add_argument("--kafka-group", default=None,
                     help="the Kafka consumer group whose offsets the job commits on checkpoints (default: "
                          "kvldp-FINGERPRINT, one per collection configuration)")
    src.add_argument("--expansion-service", default="localhost:8097",
                     help="HOST:PORT of the expansion service for Beam's KafkaIO: the Flink job server's "
                          "(deploy/flink/flink.sh job-server starts it beside the job server: --expansion-port, "
                          "default localhost:8097)")
    parser.add_argument("--key-dictionary", default=None, type=path_arg,
                        help="REPORTS.keys.txt (the public key dictionary)")
    parser.add_argument("--collection-id", type=collection_id, default=None,
                        help="multi-round protocols: the collection's id (printed by publish/perturb round 1)")
    parser.add_argument("--keys", type=positive_int, default=None, help="d, when keys are unnamed 0 … d-1")
    win = parser.add_argument_group("windows and panes")
    win.add_argument("--window", type=parse_duration, required=True, help="event-time window length, e.g. 1h")
    win.add_argument("--sliding-every", type=parse_duration, default=None,
                     help="sliding windows starting this often (default: fixed windows)")
    win.add_argument("--early-every", type=parse_duration, default=None,
                     help="an early (accumulating) pane this long after a pane's first batch, e.g. 30s")
    win.add_argument("--allowed-lateness", type=parse_duration, default=0.0,
                     help="late batches up to this long after a window's end get a LATE pane; later ones are "
                          "dead letters (collector's clock; default 0)")
    win.add_argument("--max-future", type=parse_duration, default=300.0,
                     help="refuse event times further ahead of the collector's clock (default 5m)")
    win.add_argument("--dedupe-horizon", type=parse_duration, default=None,
                     help="a batch redelivered until this long after its event time is counted once (default: "
                          "1h, or a window plus --allowed-lateness and --max-future if longer)")
    out = parser.add_argument_group("sinks (at least one of --output-dir, --output-topic)")
    out.add_argument("--output-dir", default=None, type=path_arg,
                     help="one file per pane: estimates-START-END-paneNNN-TIMING.EXT")
    out.add_argument("--output-format", choices=PANE_FORMATS, default="jsonl",
                     help="the format of each pane's estimates file in --output-dir (default jsonl)")
    out.add_argument("--output-topic", type=pubsub_path("topics"), default=None,
                     help="one Avro message per pane (windowed_estimate.avsc)")
    out.add_argument("--broadcast-topic", type=pubsub_path("topics"), default=None,
                     help="multi-round protocols: each finalised round's broadcast (broadcast.avsc) for the devices")
    out.add_argument("--dead-letter-dir", default=None, type=path_arg, help="one JSON file per refused message")
    out.add_argument("--dead-letter-topic", type=pubsub_path("topics"), default=None,
                     help="refused messages, unchanged, with kvldp_dead_reason/_detail attributes")
    run = parser.add_argument_group("running")
    run.add_argument("--max-runtime", type=parse_duration, default=None, help="stop (drain) after this long")
    run.add_argument("--stop-after-windows", type=positive_int, default=None,
                     help="stop once this many windows (each counted once, also when a restore replays it) "
                          "have had their on-time pane")
    run.add_argument("--progress-every", type=parse_duration, default=None,
                     help="counters in the log this often (default: every --early-every, else 10s)")
    run.add_argument("--drain-timeout", type=parse_duration, default=60.0,
                     help="on stop, wait at most this long for the batches read to reach a pane (60s)")
    add_postprocess_arg(out)
