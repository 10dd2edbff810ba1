"""The message brokers reports travel on: Pub/Sub (``pubsub.py``) and Kafka
(``kafka.py``) -- their admin calls and the publishing side's sinks."""
