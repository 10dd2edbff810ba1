"""The Google Pub/Sub emulator as a pytest fixture: started once per test
module on a free loopback port (``gcloud beta emulators pubsub start``),
stopped by its process group at the end.

Where the emulator is not installed the tests that use it skip with the
reason, unless ``KVLDP_REQUIRE_PUBSUB_EMULATOR=1`` (``.ci/run`` sets it):
then a missing emulator is a failure, so CI always runs them.
"""
from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import pytest

from ports import free_port

REQUIRE = "KVLDP_REQUIRE_PUBSUB_EMULATOR"
START_TIMEOUT_S = 90.0
PROJECT = "kvldp-tests"



def _unavailable(reason: str):
    if os.environ.get(REQUIRE) == "1":
        pytest.fail(f"the Pub/Sub emulator is required ({REQUIRE}=1) but {reason}")
    pytest.skip(f"Pub/Sub emulator unavailable: {reason} "
                "(install it with: gcloud components install pubsub-emulator beta)")


@contextlib.contextmanager
def running_emulator():
    """Yield ``host:port`` of a fresh emulator; stop it (its whole process
    group: gcloud starts a JVM) afterwards."""
    if shutil.which("gcloud") is None:
        _unavailable("gcloud is not on PATH")
    port = free_port()
    log = Path(tempfile.mkdtemp(prefix="pubsub-emulator-")) / "emulator.log"
    with open(log, "wb") as fh:
        proc = subprocess.Popen(["gcloud", "beta", "emulators", "pubsub", "start",
                                 f"--host-port=127.0.0.1:{port}", "--quiet"],
                                stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            text = log.read_text(errors="replace")
            if "Server started" in text:
                break
            if proc.poll() is not None or time.monotonic() > deadline:
                _unavailable(f"it did not start (exit {proc.poll()}): {text[-500:]}")
            time.sleep(0.3)
        yield f"127.0.0.1:{port}"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=20)


class PubSub:
    """Topics and subscriptions on the emulator, named uniquely per test."""

    def __init__(self, host: str):
        from google.cloud import pubsub_v1
        self.host = host
        self.publisher = pubsub_v1.PublisherClient()
        self.subscriber = pubsub_v1.SubscriberClient()

    def topic_and_subscription(self, name: str) -> tuple[str, str]:
        tag = f"{name}-{uuid.uuid4().hex[:8]}"
        topic = self.publisher.topic_path(PROJECT, f"t-{tag}")
        sub = self.subscriber.subscription_path(PROJECT, f"s-{tag}")
        self.publisher.create_topic(name=topic)
        self.subscriber.create_subscription(name=sub, topic=topic)
        return topic, sub

    def drain(self, subscription: str, seconds: float = 3.0) -> list:
        """Every message on ``subscription`` (acknowledged) within ``seconds``."""
        out, deadline = [], time.monotonic() + seconds
        while time.monotonic() < deadline:
            response = self.subscriber.pull(subscription=subscription, max_messages=100, timeout=1)
            if response.received_messages:
                out += [m.message for m in response.received_messages]
                self.subscriber.acknowledge(subscription=subscription,
                                            ack_ids=[m.ack_id for m in response.received_messages])
            else:
                time.sleep(0.2)
        return out


@pytest.fixture(scope="module")
def emulator_host():
    with running_emulator() as host:
        yield host


@pytest.fixture
def pubsub(emulator_host, monkeypatch):
    """A client of the module's emulator; ``PUBSUB_EMULATOR_HOST`` points
    every Pub/Sub client of this process (Beam's included) at it."""
    monkeypatch.setenv("PUBSUB_EMULATOR_HOST", emulator_host)
    return PubSub(emulator_host)
