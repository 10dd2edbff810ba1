"""Real Flink and Kafka for the tests (marker ``flink``): the job server of
``deploy/flink/flink.sh`` (with its expansion service), a standalone
cluster, and a Kafka broker of ``deploy/kafka/kafka.sh``, each on free
loopback ports and stopped afterwards.

Needs Java and Maven; with ``KVLDP_REQUIRE_FLINK=1`` (``.ci/run``) a missing
one is a failure, not a skip. Jars and the Flink distribution are cached
under ``deploy/flink/.cache`` and ``deploy/kafka/.cache``."""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import pytest

from kvldp.runtime import portable
from ports import free_port

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
FLINK_SH = DEPLOY / "flink" / "flink.sh"
KAFKA_SH = DEPLOY / "kafka" / "kafka.sh"
REQUIRE = "KVLDP_REQUIRE_FLINK"
START_TIMEOUT_S = 180.0
ENV = {**os.environ, "PYTHON": sys.executable}


def require_java_and_maven():
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if missing:
        reason = f"{' and '.join(missing)} not on PATH"
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"Flink tests are required ({REQUIRE}=1) but {reason}")
        pytest.skip(f"Flink unavailable: {reason}")


@pytest.fixture(scope="session")
def flink_built():
    require_java_and_maven()
    start = time.monotonic()
    subprocess.run([str(FLINK_SH), "build"], env=ENV, check=True, timeout=1800)
    print(f"\nflink.sh build: {time.monotonic() - start:.0f} s", file=sys.stderr)


@dataclasses.dataclass(frozen=True)
class JobServer:
    endpoint: str               # localhost:PORT of the Job API
    expansion_service: str      # localhost:PORT of the expansion service beside it (KafkaIO)
    log: Path


@contextlib.contextmanager
def job_server(master: str = "[local]"):
    """A running ``flink.sh job-server`` (``JobServer``); stopped (its
    process group: the script runs two JVMs) afterwards."""
    port, expansion = free_port(), free_port()
    log = Path(tempfile.mkdtemp(prefix="flink-job-server-")) / "job-server.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen([str(FLINK_SH), "job-server", "--port", str(port), "--expansion-port",
                                 str(expansion), "--flink-master", master],
                                env=ENV, stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    endpoint = f"localhost:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            try:
                portable.job_server_option_groups(endpoint, timeout=2)
                break
            except portable.UnsupportedRunner:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"the job server did not start:\n{log.read_text(errors='replace')[-3000:]}")
        yield JobServer(endpoint, f"localhost:{expansion}", log)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def rest(port: int, path: str):
    return json.load(urllib.request.urlopen(f"http://localhost:{port}{path}", timeout=10))


@contextlib.contextmanager
def standalone_cluster(slots: int = 2):
    """A JobManager and a TaskManager of the Flink distribution on a free
    REST port (yielded); stopped afterwards."""
    port = free_port()
    subprocess.run([str(FLINK_SH), "cluster", "start", "--rest-port", str(port), "--rpc-port", str(free_port()),
                    "--slots", str(slots)], env=ENV, check=True, timeout=600)
    try:
        yield port
    finally:
        subprocess.run([str(FLINK_SH), "cluster", "stop", "--rest-port", str(port)], check=False, env=ENV,
                       timeout=120)


def cluster(action: str, port: int):
    """``flink.sh cluster ACTION --rest-port PORT`` (add-taskmanager, kill-taskmanager)."""
    subprocess.run([str(FLINK_SH), "cluster", action, "--rest-port", str(port)], env=ENV, check=True, timeout=300)


@contextlib.contextmanager
def kafka_broker():
    """``127.0.0.1:PORT`` of a fresh ``kafka.sh`` broker; stopped afterwards."""
    require_java_and_maven()
    port = free_port()
    controller = free_port()
    start = time.monotonic()
    done = subprocess.run([str(KAFKA_SH), "start", "--port", str(port), "--controller-port", str(controller)],
                          check=False, env=ENV, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"\nkafka.sh start: {time.monotonic() - start:.1f} s", file=sys.stderr)
    try:
        yield done.stdout.strip()
    finally:
        subprocess.run([str(KAFKA_SH), "stop", "--port", str(port)], env=ENV, check=False, timeout=120)
