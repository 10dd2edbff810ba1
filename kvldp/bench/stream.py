"""``kvldp bench --stream DIR``: the continuous collector's throughput and
latency, on the runner the Beam arguments name (the DirectRunner reading the
Pub/Sub emulator, or Flink reading Kafka).

Two phases against one running ``kvldp stream`` job:

1. **Throughput.** ``--users`` users (batches of ``--batch-size``) are
   published before the job starts; the job drains that backlog. Reported:
   user reports per second from the job's first message read until a pane
   holds them all (``pane``), and until the lateness gate accepted them all
   (``accepted``), and the same per core the job had (parallelism, at most
   the machine's cores).
2. **Latency.** Then ``--stream-rate`` batches per second for
   ``--stream-seconds``, each timed at its send; a batch's latency is the
   time until the first pane file that holds as many reports as were sent
   up to and including it (with batches read out of order this can
   undercount by the gap between two sends). Reported: median, p95 and
   maximum, against the early-pane trigger period (``--early-every`` 1 s).

Every event time is one instant inside a window that stays open for the
whole run (``BENCH_WINDOW_S``, 10^9 s: the window [2001-09-09, 2033-05-18)),
so every pane is an early pane of one window and the trigger alone sets
the latency. Results are printed and appended to ``DIR/stream_bench.csv``.
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import glob
import os
import statistics
import sys
import time
from pathlib import Path

from kvldp.brokers import kafka as kafka_admin
from kvldp.cli import perturb as perturb_flags
from kvldp.cli import stream as stream_flags
from kvldp.pipelines import publish, split, stream, stream_job
from kvldp.plots.tables import read_estimates

BENCH_WINDOW_S = 1_000_000_000
POLL_S = 0.05
CSV_FIELDS = ("runner", "source", "parallelism", "cores", "mechanism", "keys", "batch_size", "users",
              "startup_s", "accepted_per_s", "pane_per_s", "pane_per_core_per_s", "trigger_s", "latency_batches",
              "latency_p50_s", "latency_p95_s", "latency_max_s")


@dataclasses.dataclass(frozen=True)
class StreamBenchConfig:
    """What ``kvldp bench --stream`` measures and where it publishes."""

    out: str
    mechanism: str = "pckv-ue"
    epsilon: float = 4.0
    keys: int = 100
    users: int = 200_000
    batch_size: int = 1_000
    rate: float = 2.0                  # batches per second in the latency phase
    seconds: float = 30.0              # length of the latency phase
    early_every: float = 1.0
    kafka_bootstrap: str | None = None
    expansion_service: str = "localhost:8097"
    pubsub_project: str = "kvldp-bench"
    seed: int = 1

    @property
    def source(self) -> str:
        return "kafka" if self.kafka_bootstrap else "pubsub"


def _perturb(config: StreamBenchConfig, name: str, users: int, seed: int) -> list[tuple[int, str]]:
    prefix = Path(config.out) / name / "R.avro"
    perturb, args = _configured(perturb_flags.add_arguments, split.PerturbConfig, [
        "--mechanism", config.mechanism, "--epsilon", str(config.epsilon), "--keys", str(config.keys),
        "--users", str(users), "--batch-size", str(config.batch_size), "--seed", str(seed),
        "--dataset", "synthetic-uu", "--output", str(prefix), "--overwrite"])
    split.run_perturb(perturb, args)
    return publish.report_files(str(prefix)[:-len(".avro")])


def _configured(add_arguments, config_type, argv) -> tuple:
    """``(config, the Beam arguments)`` of a command's flags: the command's own
    parser (this module is under the CLI, so it cannot ask the CLI)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_arguments(parser)
    args, rest = parser.parse_known_args(argv)
    return config_type.from_args(args), rest


def _destination(config: StreamBenchConfig, tag: str):
    """(the sink the batches go to, the stream's source arguments)."""
    if config.kafka_bootstrap:
        topic = f"kvldp-bench-{tag}"
        kafka_admin.check_topic(config.kafka_bootstrap, topic, create=True, partitions=2)
        return (kafka_admin.KafkaSink(config.kafka_bootstrap, topic),
                ["--kafka-bootstrap", config.kafka_bootstrap, "--kafka-topic", topic,
                 "--expansion-service", config.expansion_service])
    from kvldp.brokers.pubsub import PubSubSink, ensure_subscription
    topic = f"projects/{config.pubsub_project}/topics/kvldp-bench-{tag}"
    subscription = f"projects/{config.pubsub_project}/subscriptions/kvldp-bench-{tag}"
    ensure_subscription(subscription, topic)
    return PubSubSink(topic), ["--subscription", subscription]


class PaneWatch:
    """The pane files of the run's one window: (written at, reports). The
    time is the file's (the sinks write it as the pane is emitted; the
    latency phase sends while nobody polls)."""

    def __init__(self, directory: Path):
        self._dir, self.seen = directory, {}

    def poll(self) -> int:
        for path in glob.glob(str(self._dir / "*.jsonl")):
            if path not in self.seen:
                try:
                    records = read_estimates(path)
                except Exception:          # a file still being written: next poll
                    continue
                self.seen[path] = (os.path.getmtime(path), int(records[0]["n_reports"]))
        return max((n for _, n in self.seen.values()), default=0)

    def first_holding(self, n: int) -> float | None:
        times = [t for t, got in self.seen.values() if got >= n]
        return min(times) if times else None


def run(config: StreamBenchConfig, beam_args) -> dict:
    tag = f"{int(time.time())}-{os.getpid()}"
    backlog = _perturb(config, "backlog", config.users, config.seed)
    n_latency = max(1, round(config.rate * config.seconds))
    later = _perturb(config, "latency", n_latency * config.batch_size, config.seed + 1)[:n_latency]
    sink, source_args = _destination(config, tag)
    event_ms = (int(time.time()) // BENCH_WINDOW_S * BENCH_WINDOW_S + 1) * 1000
    publish.publish_report_files(backlog, sink, [event_ms] * len(backlog))
    n_backlog = config.users
    panes = Path(config.out) / f"panes-{tag}"
    argv = ["--mechanism", config.mechanism, "--epsilon", str(config.epsilon), "--keys", str(config.keys),
            *source_args, "--window", f"{BENCH_WINDOW_S}s", "--early-every", f"{config.early_every:g}s",
            "--output-dir", str(panes), "--dead-letter-dir", str(panes / "dead")]
    stream_config, stream_args = _configured(stream_flags.add_arguments, stream.StreamConfig, argv + list(beam_args))
    submitted = time.time()
    started = stream_job.start(stream_config, stream_args)
    watch = PaneWatch(panes)
    try:
        first_read = accepted_all = pane_all = None
        deadline = submitted + 1800
        while pane_all is None:
            if time.time() > deadline:
                raise TimeoutError(f"the backlog of {n_backlog} reports was not in a pane within 30 minutes")
            counts, now = started.counters(), time.time()
            if first_read is None and counts.get("messages_read", 0) > 0:
                first_read = now
            if accepted_all is None and counts.get("reports_accepted", 0) >= n_backlog:
                accepted_all = now
            if watch.poll() >= n_backlog:
                pane_all = watch.first_holding(n_backlog)
            time.sleep(POLL_S)
        sent_at: list[float] = []
        publish.publish_report_files(later, sink, [event_ms] * len(later), rate=config.rate,
                                     on_publish=lambda i, _: sent_at.append(time.time()))
        total = n_backlog + len(later) * config.batch_size
        deadline = time.time() + 600
        while watch.poll() < total and time.time() < deadline:
            time.sleep(POLL_S)
    finally:
        started.stop()
    latencies = []
    for i, at in enumerate(sent_at):
        shown = watch.first_holding(n_backlog + (i + 1) * config.batch_size)
        if shown is not None:
            latencies.append(max(0.0, shown - at))
    # the counters are read every POLL_S: a backlog drained within one poll is timed as one poll
    return report(config, beam_args, first_read - submitted, n_backlog / max(POLL_S, accepted_all - first_read),
                  n_backlog / max(POLL_S, pane_all - first_read), latencies, len(sent_at))


def _runner_name(beam_args) -> tuple[str, int]:
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    options = PipelineOptions(list(beam_args))
    name = (options.view_as(StandardOptions).runner or "DirectRunner").rsplit(".", 1)[-1]
    if name not in ("PortableRunner", "FlinkRunner"):
        return name, 1              # Beam's streaming DirectRunner: one bundle at a time
    import argparse
    which = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    which.add_argument("--parallelism", type=int, default=1)    # a Flink job server's option
    parallelism = which.parse_known_args(list(beam_args))[0].parallelism
    return "Flink", max(1, parallelism)


def report(config: StreamBenchConfig, beam_args, startup, accepted_rate, pane_rate, latencies, sent) -> dict:
    runner, parallelism = _runner_name(beam_args)
    cores = min(parallelism, os.cpu_count() or 1)
    quantiles = (statistics.quantiles(latencies, n=20, method="inclusive") if len(latencies) >= 2
                 else latencies * 19)
    row = {"runner": runner, "source": config.source, "parallelism": parallelism, "cores": cores,
           "mechanism": config.mechanism, "keys": config.keys, "batch_size": config.batch_size,
           "users": config.users, "startup_s": round(startup, 1), "accepted_per_s": round(accepted_rate),
           "pane_per_s": round(pane_rate), "pane_per_core_per_s": round(pane_rate / cores),
           "trigger_s": config.early_every, "latency_batches": f"{len(latencies)}/{sent}",
           "latency_p50_s": round(statistics.median(latencies), 2) if latencies else None,
           "latency_p95_s": round(quantiles[18], 2) if latencies else None,
           "latency_max_s": round(max(latencies), 2) if latencies else None}
    print(f"kvldp stream on {runner} (parallelism {parallelism}, {config.source}), {config.mechanism} d={config.keys}, "
          f"batches of {config.batch_size}: job up in {row['startup_s']} s; backlog of {config.users:,} reports: "
          f"{pane_rate:,.0f} reports/s to a pane ({pane_rate / cores:,.0f} per core), {accepted_rate:,.0f}/s "
          f"accepted; latency publish -> pane over {len(latencies)} of {sent} batches: median "
          f"{row['latency_p50_s']} s, p95 {row['latency_p95_s']} s, max {row['latency_max_s']} s (early pane "
          f"every {config.early_every:g} s; target < {2 * config.early_every:g} s)")
    path = Path(config.out) / "stream_bench.csv"
    new = not path.exists()
    with open(path, "a", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=CSV_FIELDS)
        if new:
            writer.writeheader()
        writer.writerow(row)
    print(f"appended to {path}", file=sys.stderr)
    return row
