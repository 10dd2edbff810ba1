"""``kvldp publish``: the device side in a box. Perturb users exactly as
``kvldp perturb`` does (same seeding, batches and report files), then publish
each report batch as one Pub/Sub message (``schemas.envelope``: the Avro
container as body; fingerprint, batch, round, event time and message id as
attributes), paced by ``--rate`` and with event times spread over
``--event-time-spread``, as devices reporting over time would.
"""
from __future__ import annotations

import argparse
import dataclasses
import io
import os
import re
import sys
import time
from collections.abc import Callable, Sequence

from apache_beam.io.filesystems import FileSystems

from kvldp.pipelines import runner, split
from kvldp.pipelines.pubsub_admin import ensure_topic
from kvldp.pipelines.split import PerturbConfig
from kvldp.pipelines.units import parse_duration, parse_instant_ms, pubsub_path
from kvldp.schemas import envelope


def add_arguments(parser: argparse.ArgumentParser):
    split.add_perturb_arguments(parser, output_required=False)
    pub = parser.add_argument_group("publishing")
    pub.add_argument("--topic", required=True, type=pubsub_path("topics"),
                     help="projects/PROJECT/topics/TOPIC (with PUBSUB_EMULATOR_HOST set: the emulator's)")
    pub.add_argument("--create-topic", action="store_true", help="create --topic if it does not exist")
    pub.add_argument("--rate", type=float, default=None, help="batches (messages) per second; default: at once")
    pub.add_argument("--event-time", type=parse_instant_ms, default="now",
                     help="event time of the first batch: now, ms since the epoch or ISO-8601 (default now)")
    pub.add_argument("--event-time-spread", type=parse_duration, default=0.0,
                     help="spread the batches' event times evenly over this period, e.g. 3m (default 0)")


@dataclasses.dataclass(frozen=True)
class PublishConfig:
    """The perturbing (``perturb``: its output is where the report files are
    kept; a scratch directory by default) and the publishing: ``topic``,
    ``rate`` (messages/s, ``None``: unpaced), the first event time and the
    spread of the event times (seconds)."""

    perturb: PerturbConfig
    topic: str
    rate: float | None = None
    event_time_ms: int | None = None
    event_time_spread: float = 0.0
    create_topic: bool = False

    def __post_init__(self):
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"--rate must be > 0, got {self.rate}")
        if self.event_time_spread < 0:
            raise ValueError("--event-time-spread must be >= 0")

    @classmethod
    def from_args(cls, args) -> PublishConfig:
        return cls(PerturbConfig.from_args(args), args.topic, args.rate, args.event_time, args.event_time_spread,
                   args.create_topic)


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


def publish_report_files(files: Sequence[tuple[int, str]], topic: str, event_ms: Sequence[int],
                         round_number: int = 1, rate: float | None = None, publisher=None,
                         on_publish: Callable[[int, dict], None] | None = None) -> list[dict]:
    """Publish each report file as one message; return the attributes sent.

    The message id attribute depends only on the configuration, round and
    batch, so publishing a file twice is a redelivery the collector
    deduplicates."""
    from google.cloud import pubsub_v1
    publisher = publisher or pubsub_v1.PublisherClient()
    futures, sent = [], []
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
        attributes = envelope.message_attributes(config, batch, round_number, when)
        futures.append(publisher.publish(topic, body, **attributes))
        sent.append(attributes)
        if on_publish is not None:
            on_publish(i, attributes)
    for future in futures:
        future.result(timeout=60)
    return sent


def run(config: PublishConfig, beam_args) -> dict:
    perturb = config.perturb
    if config.create_topic and ensure_topic(config.topic):
        print(f"created topic {config.topic}")
    if not perturb.output:
        directory = os.path.dirname(runner.scratch_path(beam_args, "x"))
        perturb = dataclasses.replace(perturb, output=os.path.join(directory, "REPORTS.avro"))
    done = split.run_perturb(perturb, beam_args)
    files = report_files(perturb.prefix)
    if not files:
        raise ValueError(f"perturb wrote no report files under {perturb.prefix}")
    start_ms = config.event_time_ms if config.event_time_ms is not None else int(time.time() * 1000)
    times = spread_event_times(len(files), start_ms, config.event_time_spread)
    began = time.perf_counter()
    sent = publish_report_files(files, config.topic, times, perturb.round, config.rate)
    seconds = time.perf_counter() - began
    users = done["stats"].get("reports_written", 0)
    print(f"published {len(sent)} report batches ({users} users) of {done['mechanism']!r} to {config.topic} "
          f"in {seconds:.1f} s; event times {times[0]} … {times[-1]} ms; fingerprint "
          f"{sent[0][envelope.FINGERPRINT][:16]}…", file=sys.stdout)
    return {"sent": sent, "files": files, "event_ms": times, "mechanism": done["mechanism"], "seconds": seconds}
