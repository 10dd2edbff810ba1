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
