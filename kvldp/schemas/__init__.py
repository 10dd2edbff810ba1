"""Avro schemas shipped with the package, loaded as dicts (usable by WriteToAvro)."""
from __future__ import annotations

import functools
import json
from importlib import resources

import fastavro

RATING = "rating"
REPORT = "report"
ESTIMATE = "estimate"
BROADCAST = "broadcast"
IOH_REPORT = "ioh_report"
IOH_COUNTS = "ioh_counts"
OLH_REPORT = "olh_report"


@functools.cache
def load(name: str) -> dict:
    """The schema ``name`` (``rating``, ``report``, ``estimate``, ``broadcast``) as a JSON dict."""
    text = resources.files(__name__).joinpath(f"{name}.avsc").read_text(encoding="utf-8")
    return json.loads(text)


@functools.cache
def parsed(name: str):
    """The schema parsed by fastavro (for fastavro readers and writers)."""
    return fastavro.parse_schema(load(name))


ESTIMATE_FIELDS = [f["name"] for f in load(ESTIMATE)["fields"]]
