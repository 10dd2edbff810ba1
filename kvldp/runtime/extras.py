"""What needs an optional extra, and the error that says which.

kvldp installs Beam without its ``gcp`` extra (``setup.py``: importing
Beam imports every client that extra brings, 0.45 s of each command's
start). ``gs://`` paths need only ``google-cloud-storage``, a base
dependency; Pub/Sub (``kvldp stream``, ``kvldp publish``) and the Dataflow
runner need the extra, and say so before any job starts. Publishing to
Kafka needs the ``kafka`` extra (``confluent-kafka``); the collector reads
Kafka through Beam's Java KafkaIO on the Flink job server.
"""
from __future__ import annotations

import importlib.util

GCP_EXTRA = "pip install 'kvldp[gcp]'"
# the modules of apache-beam[gcp] that these uses import
GCP_MODULES = {"Pub/Sub": ("google.cloud.pubsub_v1",),
               # Beam's Dataflow runner speaks to the service through apitools (2.62 to 2.77); the extra's
               # google.cloud.dataflow_v1beta3 (2.6x on) is only what kvldp's tests validate templates with
               "the Dataflow runner": ("apitools",)}


def missing(modules) -> list[str]:
    found = []
    for name in modules:
        try:
            present = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:         # a parent package is missing
            present = False
        if not present:
            found.append(name)
    return found


def require_gcp(use: str) -> None:
    """Refuse ``use`` (a key of ``GCP_MODULES``) without Beam's gcp extra."""
    absent = missing(GCP_MODULES[use])
    if absent:
        raise ValueError(f"{use} needs Beam's gcp extra ({', '.join(absent)} not installed): {GCP_EXTRA}")


def require(module: str, use: str, extra: str) -> None:
    """Refuse ``use`` when ``module`` (of kvldp's ``extra``) is not installed."""
    if missing((module,)):
        raise ValueError(f"{use} needs {module} (not installed): pip install 'kvldp[{extra}]'")
