"""The continuous collector on Flink reading Kafka (marker ``flink``; issue 40).

``kvldp publish --kafka-bootstrap`` -> a broker of ``deploy/kafka/kafka.sh``
-> ``kvldp stream --kafka-bootstrap`` on Flink (the job server of
``deploy/flink/flink.sh``, parallelism 2, checkpoints on). Each window's
final pane equals ``kvldp collect`` over that window's report files and the
DirectRunner's pane over the same reports on Pub/Sub; redeliveries count
once; a record that is not a report is a dead letter with its reason; a
TaskManager killed (SIGKILL) in the middle of a window loses no report and
counts none twice: the window's final pane is the uncrashed one; and a
multi-round protocol runs its rounds over Kafka, its broadcasts on Pub/Sub.
"""
from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from flink_cluster import ENV, cluster, flink_built, job_server, kafka_broker, rest, standalone_cluster  # noqa: F401
from kvldp.brokers import kafka as kafka_admin
from kvldp.cli import commands as cli
from kvldp.pipelines import publish
from kvldp.plots.tables import read_estimates
from kvldp.schemas import envelope
from pubsub_emulator import emulator_host, pubsub  # noqa: F401 - fixtures
from test_streaming import (
    assert_same_estimates,
    collect_window,
    copy_reports,
    dead_letters,
    panes,
    perturb,
    run_stream,
    stream_argv,
    window_start_ms,
)

pytestmark = pytest.mark.flink

D, MECHANISM, EPS = 10, "pckv-ue", 2.0


@pytest.fixture(scope="module")
def broker():
    with kafka_broker() as bootstrap:
        yield bootstrap


@pytest.fixture(scope="module")
def embedded(flink_built):  # noqa: F811
    with job_server() as server:
        yield server


def send(bootstrap: str, topic: str, files, times, run: str | None = None) -> list[dict]:
    kafka_admin.check_topic(bootstrap, topic, create=True, partitions=2)
    return publish.publish_report_files(files, kafka_admin.KafkaSink(bootstrap, topic), times, run=run)


def committed_offsets(bootstrap: str, topic: str, group: str) -> int:
    """Records of ``topic`` the consumer ``group`` has committed as read."""
    from confluent_kafka import Consumer, TopicPartition
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        partitions = consumer.list_topics(topic, timeout=10).topics[topic].partitions
        done = consumer.committed([TopicPartition(topic, k) for k in partitions], timeout=10)
        return sum(max(0, tp.offset) for tp in done)
    finally:
        consumer.close()


def kafka_argv(bootstrap, topic, server, out: Path, window_s: float, *extra) -> list[str]:
    return ["stream", "--mechanism", MECHANISM, "--epsilon", str(EPS), "--keys", str(D),
            "--kafka-bootstrap", bootstrap, "--kafka-topic", topic, "--expansion-service", server.expansion_service,
            "--window", f"{window_s:g}s", "--output-dir", str(out / "panes"), "--dead-letter-dir", str(out / "dead"),
            "--progress-every", "5s", *extra,
            "--runner", "PortableRunner", "--job_endpoint", server.endpoint, "--environment_type", "LOOPBACK",
            "--parallelism", "2"]


def test_each_window_on_flink_equals_collect_and_the_direct_runner(broker, embedded, pubsub, tmp_path):  # noqa: F811
    """60 batches over 2 event-time windows on Kafka, 6 redelivered (the
    same run), one record that is not a report: on Flink each window's final
    pane equals collect over its report files and the DirectRunner's pane
    over the same messages on Pub/Sub, count for count."""
    size = 10.0
    files = perturb(tmp_path, "reports", MECHANISM, EPS, users=6_000, batch=100)
    start = window_start_ms(lead_s=40.0, size_s=size)       # the job is up before the windows' reports are read
    times = publish.spread_event_times(len(files), start, 2 * size - 0.2)
    topic = "reports-equal"
    sent = send(broker, topic, files, times)
    again = list(range(0, len(files), 10))
    send(broker, topic, [files[i] for i in again], [times[i] for i in again], run=sent[0][envelope.RUN])
    from confluent_kafka import Producer
    stray = Producer({"bootstrap.servers": broker})
    stray.produce(topic, b"not a report", timestamp=start)
    stray.flush(30)

    flink_out = tmp_path / "flink"
    result = run_stream(kafka_argv(broker, topic, embedded, flink_out, size, "--early-every", "2s",
                                   "--stop-after-windows", "2", "--max-runtime", "240s"))
    stats = result["stats"]
    assert stats["messages_read"] == 60 + 6 + 1 and stats["messages_rejected"] == 1
    assert stats["messages_valid"] - stats["batches_unique"] == 6 and stats["batches_accepted"] == 60
    [letter] = dead_letters(flink_out)
    assert letter["reason"] == "malformed attributes" and "no kvldp_fingerprint" in letter["detail"]
    # the offsets were committed to the collection's consumer group on Flink's checkpoints
    assert committed_offsets(broker, topic, f"kvldp-{result['fingerprint'][:16]}") == 60 + 6 + 1

    # the same messages on Pub/Sub, on the DirectRunner, in windows as many whole windows later (those above
    # have closed): each window holds the same batches
    ps_topic, ps_sub = pubsub.topic_and_subscription("kafka-twin")
    shift = window_start_ms(lead_s=8.0, size_s=size) - start
    publish.publish_report_files(files, ps_topic, [t + shift for t in times])
    direct_out = tmp_path / "direct"
    run_stream(stream_argv(MECHANISM, EPS, ps_sub, direct_out, size, "--stop-after-windows", "2",
                           "--max-runtime", "120s"))

    flink, direct = panes(flink_out), panes(direct_out)
    assert len(flink) == 2 and [(a + shift, b + shift) for a, b in flink] == list(direct)
    for k, ((w_start, w_end), ps) in enumerate(flink.items()):
        final = ps[-1]
        assert final[0]["pane_timing"] == "ON_TIME", [p[0]["pane_timing"] for p in ps]
        in_window = [f for f, t in zip(files, times, strict=True) if w_start <= t < w_end]
        assert final[0]["n_reports"] == 100 * len(in_window)
        assert_same_estimates(final, collect_window(tmp_path, in_window, MECHANISM, EPS, f"w{k}"))
        twin = direct[(w_start + shift, w_end + shift)][-1]
        assert twin[0]["pane_timing"] == "ON_TIME"
        assert_same_estimates(final, {r["key"]: r for r in twin})


def _latest_pane(out: Path) -> dict | None:
    found = [p for ps in panes(out).values() for p in ps]
    return max(found, key=lambda p: (p[0]["pane_index"]))[0] if found else None


def _checkpoints(port: int) -> dict:
    """Flink's checkpoint statistics of the running job ({} if none runs)."""
    jobs = [j for j in rest(port, "/jobs/overview")["jobs"] if j["state"] == "RUNNING"]
    return rest(port, f"/jobs/{jobs[0]['jid']}/checkpoints") if jobs else {}


def _completed_checkpoints(port: int) -> int:
    return int(_checkpoints(port).get("counts", {}).get("completed", 0))


def _wait(condition, what: str, proc, timeout: float = 180.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"the stream exited while waiting for {what}"
        assert time.monotonic() < deadline, f"no {what} within {timeout:g} s"
        time.sleep(0.5)


def test_a_taskmanager_killed_mid_window_loses_nothing_and_counts_nothing_twice(flink_built, broker,  # noqa: F811
                                                                                tmp_path):
    """Exactly once through a crash: half a window's batches are read and
    checkpointed, the TaskManager is killed (SIGKILL), a new one joins and
    Flink restores the job from its last checkpoint; the other half arrives.
    The window's final pane holds every report once: it equals collect over
    all the window's report files (the uncrashed result, as the test above
    shows for a run without a crash).

    The window is chosen once the job runs, and ``--allowed-lateness``
    covers a slow recovery: the lateness gate judges a batch by the
    collector's clock, so on a loaded machine (CI, issue 42) a job that came
    up or recovered after the window's end made every batch a dead letter
    "late". Batches read after the window closed go to late panes; the
    final pane is the last one that is not early."""
    size = 60.0
    files = perturb(tmp_path, "reports", MECHANISM, EPS, users=4_000, batch=100)      # 40 batches
    first, second = files[:20], files[20:]
    topic = "reports-crash"
    run = envelope.new_run()
    kafka_admin.check_topic(broker, topic, create=True, partitions=2)
    with standalone_cluster() as port, job_server(f"localhost:{port}") as server:
        out = tmp_path / "crash"
        argv = [sys.executable, "-m", "kvldp", *kafka_argv(
            broker, topic, server, out, size, "--early-every", "1s", "--allowed-lateness", "300s",
            "--max-runtime", "900s", "--checkpointing_interval=2000")]
        log = tmp_path / "stream.log"
        with open(log, "w") as fh:
            proc = subprocess.Popen(argv, env={**ENV, "PYTHONUNBUFFERED": "1"}, stdout=fh, stderr=subprocess.STDOUT)
        try:
            _wait(lambda: _completed_checkpoints(port) > 0, "a first checkpoint", proc, timeout=300)
            start = window_start_ms(lead_s=2.0, size_s=size)
            times = [start + 500 * i for i in range(len(files))]                        # the window's first 20 s
            send(broker, topic, first, times[:20], run=run)
            _wait(lambda: (_latest_pane(out) or {}).get("n_reports") == 2_000, "an early pane of the first half",
                  proc)
            before = _completed_checkpoints(port)
            _wait(lambda: _completed_checkpoints(port) >= before + 2, "two checkpoints after it", proc)
            cluster("kill-taskmanager", port)
            crashed_at = time.monotonic()
            cluster("add-taskmanager", port)
            send(broker, topic, second, times[20:], run=run)
            _wait(lambda: any(p[0]["pane_timing"] != "EARLY" and p[0]["n_reports"] == 4_000
                              for ps in panes(out).values() for p in ps), "a final pane of both halves", proc,
                  timeout=400)
            print(f"\nfinal pane {time.monotonic() - crashed_at:.0f} s after the crash", file=sys.stderr)
            restored = (_checkpoints(port).get("latest") or {}).get("restored")
            proc.send_signal(signal.SIGINT)          # a drain: every pane emitted is written
            proc.wait(timeout=180)
        finally:
            if proc.poll() is None:
                proc.kill()
        output = log.read_text()
        assert proc.returncode == 0, output[-3000:]
    # the job was restored from a checkpoint taken before the crash (not run through on a survivor)
    assert restored and restored["id"] >= before, restored
    [(_, ps)] = panes(out).items()
    timings = [(p[0]["pane_timing"], p[0]["n_reports"]) for p in ps]
    assert all(n <= 4_000 for _, n in timings), timings                 # no pane of any life counts twice
    final = [p for p in ps if p[0]["pane_timing"] != "EARLY"][-1]
    assert final[0]["n_reports"] == 4_000, timings
    assert_same_estimates(final, collect_window(tmp_path, files, MECHANISM, EPS, "all"))
    assert not glob.glob(str(out / "dead" / "*.json")), [json.loads(Path(p).read_text())
                                                          for p in glob.glob(str(out / "dead" / "*.json"))]
    summary = {"panes": [(p[0]["pane_index"], p[0]["pane_timing"], p[0]["n_reports"]) for p in ps]}
    (Path(os.environ.get("KVLDP_CRASH_REPORT", tmp_path / "crash.json"))).write_text(json.dumps(summary))


def test_a_multi_round_protocol_over_kafka_on_flink(broker, embedded, pubsub, tmp_path):  # noqa: F811
    """PrivKVM with 2 rounds: the devices' reports go to Kafka, the
    collector on Flink finalises round 1 at its window's on-time pane and
    publishes the broadcast (Pub/Sub), the devices perturb round 2 with it;
    each round's estimates equal the split deployment's ``collect --round r
    --broadcast`` over the same reports."""
    size, cid, topic = 10.0, "0123456789abcdef0123456789abcdef", "rounds"
    common = ["--mechanism", "privkvm", "--rounds", "2", "--epsilon", str(EPS), "--keys", str(D)]
    b_topic, b_sub = pubsub.topic_and_subscription("kafka-broadcasts")
    kafka_admin.check_topic(broker, topic, create=True, partitions=2)
    first = window_start_ms(lead_s=30.0, size_s=size) + 100       # the job is up before round 1's window closes
    publisher: dict = {}

    def devices():
        _, config, beam_args = cli.configure([
            "publish", *common, "--users", "2000", "--batch-size", "200", "--seed", "5", "--dataset",
            "synthetic-gg", "--collection-id", cid, "--output", str(tmp_path / "dev" / "R.avro"),
            "--kafka-bootstrap", broker, "--kafka-topic", topic, "--event-time", str(first),
            "--window", f"{size:g}s", "--broadcast-subscription", b_sub, "--broadcast-timeout", "120s"])
        publisher.update(publish.run(config, beam_args))

    thread = threading.Thread(target=devices)
    thread.start()
    argv = kafka_argv(broker, topic, embedded, tmp_path, size, "--max-runtime", "240s", "--collection-id", cid,
                      "--broadcast-topic", b_topic)
    argv[argv.index("--mechanism"):argv.index("--kafka-bootstrap")] = common
    result = run_stream(argv)
    thread.join(timeout=120)
    assert not thread.is_alive() and len(publisher["rounds"]) == 2
    assert result["stop"] == "the protocol ended after round 2", result["stop"]
    assert result["stats"]["rounds_finalized"] == 2 and result["stats"].get("batches_refused", 0) == 0
    assert not dead_letters(tmp_path)
    by_round = {}
    for ps in panes(tmp_path).values():
        [on_time] = [p for p in ps if p[0]["pane_timing"] == "ON_TIME"]
        by_round[on_time[0]["round"]] = on_time
    assert sorted(by_round) == [1, 2]
    for r in (1, 2):
        files = publisher["rounds"][r - 1]["files"]
        directory = copy_reports(files, tmp_path / f"split-r{r}")
        est = tmp_path / f"split-r{r}.jsonl"
        extra = [] if r == 1 else ["--broadcast", str(tmp_path / "panes" / "round-01.broadcast.avro")]
        assert cli.main(["collect", *common, "--round", str(r), *extra, "--input", str(directory / "R*.avro"),
                         "--output", str(est)]) == 0
        assert_same_estimates(by_round[r], {x["key"]: x for x in read_estimates(str(est))})
