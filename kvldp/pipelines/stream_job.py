"""Starting ``kvldp stream``'s job and watching it: ``start`` checks the
source and the protocol, builds the graph (``pipelines/stream.py``) and
submits it; ``run`` watches it with a ``Monitor``, which prints the
counters every ``--progress-every`` and stops on ``--max-runtime``,
``--stop-after-windows``, a protocol that ended or SIGINT, then drains (every
batch read is in an emitted pane, at most ``--drain-timeout``).

From Kafka the job runs on Flink (``kafka_job_args``: checkpoints, bundle
time and where the checkpoints are stored).
"""
from __future__ import annotations

import dataclasses
import os
import signal
import sys
import tempfile
import threading
import time
import typing
import uuid

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from kvldp.brokers import kafka as kafka_admin
from kvldp.brokers.pubsub import check_reachable, ensure_subscription
from kvldp.pipelines import mechanism_config, split
from kvldp.pipelines.stream import (
    BROADCASTS_PUBLISHED,
    DEAD_LETTERS_PUBLISHED,
    PANES_PUBLISHED,
    StreamConfig,
    round_configs,
    stream_graph,
)
from kvldp.runtime import extras
from kvldp.runtime import jobs as runner
from kvldp.runtime.tally import forget, tally
from kvldp.schemas import envelope
from kvldp.transforms.stream_sinks import DEAD_LETTER_FILES_WRITTEN, PANE_FILES_WRITTEN, ROUND_FILES_WRITTEN
from kvldp.transforms.streaming import DEAD_LETTERS_EMITTED, WINDOWS_CLOSED, WINDOWS_OPENED

DIRECT_RUNNERS = (None, "DirectRunner", "BundleBasedDirectRunner", "SwitchingDirectRunner")


KAFKA_CHECKPOINT_MS = 10_000


KAFKA_BUNDLE_MS = 200


TERMINAL_STATES = ("FAILED", "CANCELLED", "DONE", "DRAINED", "STOPPED")


class JobEnded(RuntimeError):
    """The streaming job stopped by itself (failed on the runner)."""


def open_windows(stats: dict) -> int:
    """Windows that had a pane before they closed but not yet their on-time pane."""
    return max(0, stats.get(WINDOWS_OPENED, 0) - stats.get(WINDOWS_CLOSED, 0))


def progress_line(stats: dict, elapsed: float) -> str:
    read, valid = stats.get("messages_read", 0), stats.get("messages_valid", 0)
    unique = stats.get("batches_unique", 0)
    return (f"[{elapsed:6.0f} s] messages read {read} (rejected {stats.get('messages_rejected', 0)}, "
            f"duplicates {valid - unique}), batches late {stats.get('batches_late', 0)}, accepted "
            f"{stats.get('batches_accepted', 0)} ({stats.get('reports_accepted', 0)} reports); panes "
            f"{stats.get('panes_emitted', 0)} (on time {stats.get('panes_on_time', 0)}, late "
            f"{stats.get('panes_late', 0)}); dead letters {stats.get(DEAD_LETTERS_EMITTED, 0)}")


class Monitor:
    """Polls a running streaming job's counters, logs them, and decides when
    to stop: ``--max-runtime``, ``--stop-after-windows`` or SIGINT, then a
    drain (every batch read has reached an emitted pane, and every pane
    emitted and dead letter refused has been written and published) bounded
    by ``--drain-timeout``.
    ``--stop-after-windows`` and a stopped protocol wait for the same."""

    def __init__(self, result, config: StreamConfig, job: str, in_process: bool, out=None):
        self._result, self._config, self._out = result, config, out or sys.stdout
        self._job, self._in_process = job, in_process
        self._stop_reason: str | None = None
        self._close_windows = False          # the drain also waits for open windows' on-time panes
        self.stats: dict = {}
        self._last_reads, self._last_panes = (0, 0), 0
        self._read_at = self._pane_at = time.monotonic()

    def request_stop(self, reason: str):
        self._stop_reason = self._stop_reason or reason

    def _poll(self) -> dict:
        # the DirectRunner's streaming metrics go stale after a bundle (runtime/tally.py); LOOPBACK workers
        # count here too (on Flink, a restore from a checkpoint counts the replayed messages again)
        s = tally(self._job) if self._in_process else runner.counters(self._result, quiet=True)
        now = time.monotonic()
        if (s.get("messages_read", 0), s.get("batches_accepted", 0)) != self._last_reads:
            self._last_reads, self._read_at = (s.get("messages_read", 0), s.get("batches_accepted", 0)), now
        if s.get("panes_emitted", 0) != self._last_panes:
            self._last_panes, self._pane_at = s.get("panes_emitted", 0), now
        self.stats = s
        return s

    def _written_all(self, s: dict) -> bool:
        """Every pane emitted, round finalised and dead letter refused is in
        its files and, with a topic, confirmed published (``stream_sinks.Publish``)."""
        return not self._unwritten(s)

    def _unwritten(self, s: dict) -> list[str]:
        """What is emitted but not yet in its sink, as ``"1 of 6 pane messages"``."""
        config = self._config
        panes, rounds = s.get("panes_emitted", 0), s.get("rounds_finalized", 0)
        letters = s.get(DEAD_LETTERS_EMITTED, 0)
        sinks = [(config.output_dir, "pane files", PANE_FILES_WRITTEN, panes),
                 (config.output_dir, "round files", ROUND_FILES_WRITTEN, rounds),
                 (config.output_topic, "pane messages", PANES_PUBLISHED, panes),
                 (config.broadcast_topic, "broadcasts", BROADCASTS_PUBLISHED, rounds),
                 (config.dead_letter_dir, "dead-letter files", DEAD_LETTER_FILES_WRITTEN, letters),
                 (config.dead_letter_topic, "dead-letter messages", DEAD_LETTERS_PUBLISHED, letters)]
        return [f"{emitted - s.get(counter, 0)} of {emitted} {what}" for given, what, counter, emitted in sinks
                if given and s.get(counter, 0) < emitted]

    def _ended(self) -> str | None:
        """The job's state if it has ended (a streaming job only ends when it failed or was cancelled)."""
        try:
            state = self._result.state
        except Exception:  # a runner that cannot tell: keep polling the counters
            return None
        return state if state in TERMINAL_STATES else None

    def _drained(self, s: dict) -> bool:
        """Nothing read for a second, a pane (written) emitted at a poll
        after the last batch accepted (every batch read is in a pane), and
        when stopping after ``--stop-after-windows``, every window that opened
        has had its on-time pane (a window stopped with early panes only sees
        its batches as late on the next start). SIGINT and ``--max-runtime``
        stop without waiting for windows to close, and say which are open."""
        quiet = time.monotonic() - self._read_at >= 1.0
        caught_up = s.get("batches_accepted", 0) == 0 or self._pane_at > self._read_at
        closed = not (self._close_windows and open_windows(s))
        return quiet and caught_up and closed and self._written_all(s)

    def run(self) -> str:
        start = last_log = time.monotonic()
        step = min(1.0, self._config.progress_every)
        while self._stop_reason is None:
            time.sleep(step)
            s, now = self._poll(), time.monotonic()
            if now - last_log >= self._config.progress_every:
                print(progress_line(s, now - start), file=self._out, flush=True)
                last_log = now
            if self._config.max_runtime is not None and now - start >= self._config.max_runtime:
                self.request_stop(f"--max-runtime {self._config.max_runtime:g} s")
            windows = self._config.stop_after_windows
            if windows is not None and s.get(WINDOWS_CLOSED, 0) >= windows and self._written_all(s):
                self.request_stop(f"{windows} windows had their on-time pane")
                self._close_windows = True
            if s.get("protocol_stopped", 0) and self._written_all(s):
                self.request_stop(f"the protocol ended after round {s.get('rounds_finalized', 0)}")
            ended = self._ended()
            if ended:
                raise JobEnded(f"the streaming job ended on its own in state {ended} after {now - start:.0f} s "
                               f"(the runner's log says why); {progress_line(s, now - start)}")
        deadline, drained = time.monotonic() + self._config.drain_timeout, False
        while not drained and time.monotonic() < deadline:
            drained = self._drained(self._poll())
            if not drained:
                time.sleep(0.5)
        print(progress_line(self.stats, time.monotonic() - start), file=self._out, flush=True)
        unwritten, still_open = self._unwritten(self.stats), open_windows(self.stats)
        print(f"stopping: {self._stop_reason}; " + (
            "drained: every batch read is in an emitted pane" + (
                "" if not still_open else f"; {still_open} window(s) open, with early panes only (their batches "
                "count as late on the next start unless --allowed-lateness covers it)") if drained else
            f"drain timed out after {self._config.drain_timeout:g} s: batches read since the last pane may "
            "be in no emitted pane" + (f"; not yet written: {', '.join(unwritten)}" if unwritten else "")
            + (f"; {still_open} window(s) had early panes only (a longer --drain-timeout lets them close)"
               if still_open else "")),
            file=self._out, flush=True)
        return self._stop_reason


def _install_sigint(monitor: Monitor):
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, lambda *_: monitor.request_stop("SIGINT"))


def reads_pubsub_here(beam_args) -> bool:
    """Whether this process's job reads Pub/Sub (the local streaming runner,
    not a dry run); Dataflow's workers read it with the service's credentials."""
    options = PipelineOptions(list(beam_args))
    runner_name = (options.view_as(StandardOptions).runner or "DirectRunner").rsplit(".", 1)[-1]
    return runner_name in ("DirectRunner", "SwitchingDirectRunner") and not runner.is_dry_run(beam_args)


def uses_pubsub(config: StreamConfig) -> bool:
    return bool(config.subscription or config.output_topic or config.dead_letter_topic or config.broadcast_topic)


def kafka_job_args(beam_args) -> list[str]:
    """A Kafka collector's Beam arguments: it runs on a portable runner
    (Flink), which runs KafkaIO; with checkpoints (``--checkpointing_interval``,
    10 s unless given), which commit the offsets and make the state exactly
    once, bundles closed after 200 ms (``--max_bundle_time_mills``: a pane's
    latency), checkpoints stored in files (``--state_backend filesystem``, under
    ``--state_backend_storage_path``, default ``TMPDIR/kvldp-checkpoints``):
    Flink's default keeps them in the JobManager's memory, at most 5 MB, and
    a window's state passes that within a few hundred batches (measured: 28 MB
    after 1,000 batches of PCKV-UE at d = 100), after which every checkpoint
    fails and the job restarts. On a cluster of several machines give a
    path they share."""
    options = PipelineOptions(list(beam_args))
    runner_name = (options.view_as(StandardOptions).runner or "DirectRunner").rsplit(".", 1)[-1]
    if runner_name not in ("PortableRunner", "FlinkRunner"):
        raise ValueError("stream reads Kafka with Beam's Java KafkaIO, a cross-language transform that Beam's "
                         "DirectRunner cannot run: run on Flink (--runner PortableRunner --job_endpoint HOST:PORT "
                         "--environment_type LOOPBACK; deploy/flink/flink.sh job-server), or read Pub/Sub")
    args = list(beam_args)
    given = {a.split("=", 1)[0] for a in args}
    if "--checkpointing_interval" not in given:
        args.append(f"--checkpointing_interval={KAFKA_CHECKPOINT_MS}")
    if "--max_bundle_time_mills" not in given:
        # a batch crosses ~4 fused stages, each closing its bundle after at most this long: Flink's default of
        # 1 s made a pane 3.9 s late (median) at an early pane per second; 200 ms: 1.2 s, throughput the same
        args.append(f"--max_bundle_time_mills={KAFKA_BUNDLE_MS}")
    if "--state_backend" not in given and "--state_backend_factory" not in given:
        args.append("--state_backend=filesystem")
        if "--state_backend_storage_path" not in given:
            path = os.path.join(tempfile.gettempdir(), "kvldp-checkpoints")
            args.append(f"--state_backend_storage_path=file://{path}")
    return args


def in_process_workers(beam_args) -> bool:
    """Whether the job's DoFns run in this process (the DirectRunner, or a
    portable runner's LOOPBACK workers): then its counters are read here."""
    from apache_beam.options.pipeline_options import PortableOptions
    options = PipelineOptions(list(beam_args))
    if options.view_as(StandardOptions).runner in DIRECT_RUNNERS:
        return True
    return (options.view_as(PortableOptions).environment_type or "").upper() == "LOOPBACK"


@dataclasses.dataclass
class StartedStream:
    """A streaming job that runs: its result, the key of its in-process
    counters, the protocol and the first round's configuration fingerprint."""

    result: typing.Any
    job: str
    protocol: typing.Any
    fingerprint: str
    in_process: bool

    def counters(self) -> dict:
        return tally(self.job) if self.in_process else runner.counters(self.result, quiet=True)

    def stop(self):
        self.result.cancel()
        forget(self.job)


def run(config: StreamConfig, beam_args) -> dict:
    started = start(config, beam_args)
    monitor = Monitor(started.result, config, started.job, started.in_process)
    previous = _install_sigint(monitor)
    try:
        reason = monitor.run()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
        started.stop()
    return {"stats": monitor.stats, "stop": reason, "mechanism": started.protocol,
            "fingerprint": started.fingerprint}


def start(config: StreamConfig, beam_args) -> StartedStream:
    """Check the source and the protocol, build the graph and submit it
    (without waiting): ``run`` watches it with a ``Monitor``, ``kvldp bench
    --stream`` with its own clock."""
    if uses_pubsub(config):
        extras.require_gcp("Pub/Sub")
    if config.subscription and reads_pubsub_here(beam_args):
        check_reachable(subscription=config.subscription)
    if config.kafka_topic:
        beam_args = kafka_job_args(beam_args)
        if config.kafka_topic not in kafka_admin.topics(config.kafka_bootstrap):
            raise ValueError(f"Kafka topic {config.kafka_topic} does not exist on {config.kafka_bootstrap} "
                             "(kvldp publish --create-topic makes it)")
    names = split.collect_key_names(config)
    protocol = config.mechanism.make(len(names), ioh_keys=(
        mechanism_config.named_keys(config.mechanism.ioh_keys, names) if config.mechanism.ioh_keys else None))
    if protocol.max_rounds > 1:
        if not config.collection_id:
            raise ValueError(f"{protocol.name} runs several rounds: name the collection with --collection-id "
                             "(publish prints it; give publish the same --collection-id)")
        if config.windows.allowed_lateness > 0:
            raise ValueError("a multi-round stream takes no --allowed-lateness: a round's broadcast is "
                             "final at its window's on-time pane")
        if config.windows.every is not None:
            raise ValueError("a multi-round stream runs one round per fixed window: no --sliding-every")
    first = round_configs(protocol, config.collection_id)[0]
    if config.subscribe_to and ensure_subscription(config.subscription, config.subscribe_to):
        print(f"created subscription {config.subscription} on {config.subscribe_to}")
    args = list(beam_args) + ([] if "--streaming" in beam_args else ["--streaming"])
    runner_name = PipelineOptions(args).view_as(StandardOptions).runner
    direct = runner_name in DIRECT_RUNNERS
    p = runner.make_pipeline(args)
    job = uuid.uuid4().hex
    source = config.source(envelope.config_fingerprint(first), id_label=not direct)
    stream_graph(p, config, protocol, names, id_label=not direct, job=job)
    print(f"streaming {protocol!r} from {source.name} (fingerprint "
          f"{envelope.config_fingerprint(first)[:16]}…); windows of {config.windows.size:g} s",
          flush=True)
    if direct and config.subscription:
        print("DirectRunner: once the subscription is idle a window closes up to 30 s after its end (Beam's "
              "Pub/Sub pull deadline, docs/upstream/direct-pubsub-pull.md; Dataflow does not wait)", flush=True)
    result = runner.run_pipeline(p, wait=False)
    return StartedStream(result, job, protocol, envelope.config_fingerprint(first), in_process_workers(args))
