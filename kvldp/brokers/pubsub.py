"""Creating a topic or subscription when a job is asked to (demos, the
emulator): idempotent, and only on an explicit flag (``publish
--create-topic``, ``stream --subscribe-to``); production topics and
subscriptions are the operator's."""
from __future__ import annotations

from google.api_core import exceptions


def ensure_topic(topic: str) -> bool:
    """Create ``topic`` unless it exists; ``True`` if created."""
    from google.cloud import pubsub_v1
    try:
        pubsub_v1.PublisherClient().create_topic(name=topic)
        return True
    except exceptions.AlreadyExists:
        return False


def ensure_subscription(subscription: str, topic: str) -> bool:
    """Create ``subscription`` on ``topic`` (and the topic) unless they exist;
    ``True`` if the subscription was created."""
    from google.cloud import pubsub_v1
    ensure_topic(topic)
    try:
        pubsub_v1.SubscriberClient().create_subscription(name=subscription, topic=topic)
        return True
    except exceptions.AlreadyExists:
        return False


PROBE_TIMEOUT_S = 10.0


def where() -> str:
    """The Pub/Sub a client talks to here: the emulator's host, or Google's."""
    import os
    host = os.environ.get("PUBSUB_EMULATOR_HOST")
    return f"the Pub/Sub emulator at {host} (PUBSUB_EMULATOR_HOST)" if host else "pubsub.googleapis.com"


def check_reachable(topic: str | None = None, subscription: str | None = None,
                    timeout: float | None = None) -> None:
    """Before any compute: ask Pub/Sub for ``topic`` (or ``subscription``)
    once, within ``timeout`` seconds and without retries; a service nobody
    answers for, or no credentials, is one clear error instead of a client
    that retries for minutes. A missing topic or subscription passes: the
    job creates it when asked to, and says so otherwise."""
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth
    from google.cloud import pubsub_v1
    timeout = PROBE_TIMEOUT_S if timeout is None else timeout
    try:
        if topic:
            pubsub_v1.PublisherClient().get_topic(topic=topic, timeout=timeout, retry=None)
        if subscription:
            pubsub_v1.SubscriberClient().get_subscription(subscription=subscription, timeout=timeout, retry=None)
    except api.NotFound:
        return
    except auth.DefaultCredentialsError:
        raise ValueError(f"no Google credentials for {where()}: set them up (gcloud auth application-default "
                         "login), or set PUBSUB_EMULATOR_HOST for the emulator") from None
    except (api.DeadlineExceeded, api.ServiceUnavailable, api.RetryError) as err:
        raise ValueError(f"no answer from {where()} within {timeout:g} s ({type(err).__name__}): start it, or "
                         "check the host and the network") from None


class PubSubSink:
    """Report batches -> messages of ``topic`` (``schemas.envelope``: the
    body and its attributes; the event time is an attribute). ``flush``
    waits for the service's confirmation of every message."""

    def __init__(self, topic: str, client=None):
        from google.cloud import pubsub_v1
        self.topic, self.name = topic, topic
        self._publisher = client or pubsub_v1.PublisherClient()
        self._futures: list = []

    def send(self, body: bytes, attributes: dict[str, str], event_ms: int, key: str) -> None:
        self._futures.append(self._publisher.publish(self.topic, body, **attributes))

    def flush(self, timeout: float = 60.0) -> None:
        for future in self._futures:
            future.result(timeout=timeout)
        self._futures.clear()
