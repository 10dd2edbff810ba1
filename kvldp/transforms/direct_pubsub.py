"""The DirectRunner's Pub/Sub read, kept responsive on an idle subscription.

Beam's streaming DirectRunner reads Pub/Sub in ``_PubSubReadEvaluator``,
which pulls with a 30 s deadline (apache-beam 2.77,
``runners/direct/transform_evaluator.py``). Measured here with the
emulator: a pull on an idle subscription blocks ~29 s, and meanwhile the
watermark, the processing-time triggers and the job's metrics stand still,
so after the last message a window closes up to 30 s late and its early
panes stall. Dataflow reads Pub/Sub natively and is not affected.

``responsive_pulls()`` wraps the subscriber client that evaluator uses: a
pull waits at most ``PULL_DEADLINE`` seconds, and an empty one sleeps
``IDLE_SLEEP`` seconds before returning, so an idle read wakes a few times
a second without spinning a core. Messages are read, acknowledged and
timestamped by Beam's own code, unchanged. If a Beam upgrade moves the
evaluator, the wrapper is not installed and a warning says so (reads then
work, only with Beam's latency).
"""
from __future__ import annotations

import logging
import threading
import time

PULL_DEADLINE = 1.0
IDLE_SLEEP = 0.2

_lock = threading.Lock()


class _ResponsivePulls:
    """Delegates to a Pub/Sub subscriber client; ``pull`` waits less."""

    def __init__(self, client):
        self._client = client

    def pull(self, *args, timeout=None, **kwargs):
        deadline = PULL_DEADLINE if timeout is None else min(timeout, PULL_DEADLINE)
        response = self._client.pull(*args, timeout=deadline, **kwargs)
        if not response.received_messages:
            time.sleep(IDLE_SLEEP)
        return response

    def __getattr__(self, name):
        return getattr(self._client, name)


def responsive_pulls() -> bool:
    """Install the wrapper (once per process); ``False`` if Beam's evaluator
    is not where this version expects it."""
    with _lock:
        try:
            from apache_beam.runners.direct import transform_evaluator
            evaluator = transform_evaluator._PubSubReadEvaluator
            original = evaluator._get_subscriber_client.__func__
        except (ImportError, AttributeError) as err:
            logging.getLogger(__name__).warning(
                "DirectRunner Pub/Sub reads keep Beam's 30 s pull deadline (%s): windows may close late "
                "when the subscription is idle", err)
            return False
        if getattr(original, "kvldp_responsive", False):
            return True

        def _get_subscriber_client(cls, transform):
            return _ResponsivePulls(original(cls, transform))

        _get_subscriber_client.kvldp_responsive = True
        evaluator._get_subscriber_client = classmethod(_get_subscriber_client)
        return True
