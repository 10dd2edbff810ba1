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
REPORT_COLUMNS = "report_columns"
WINDOWED_ESTIMATE = "windowed_estimate"


@functools.cache
def load(name: str) -> dict:
    """The schema ``name`` (``rating``, ``report``, ``estimate``, ``broadcast``, …) as a JSON dict.

    A schema with ``"extends": BASE`` holds its own fields, then every field
    of ``BASE`` (so ``windowed_estimate`` is ``estimate`` plus the window's
    fields, declared once)."""
    text = resources.files(__name__).joinpath(f"{name}.avsc").read_text(encoding="utf-8")
    schema = json.loads(text)
    base = schema.pop("extends", None)
    if base is not None:
        schema["fields"] = schema["fields"] + load(base)["fields"]
    return schema


@functools.cache
def parsed(name: str):
    """The schema parsed by fastavro (for fastavro readers and writers)."""
    return fastavro.parse_schema(load(name))


ESTIMATE_FIELDS = [f["name"] for f in load(ESTIMATE)["fields"]]
WINDOWED_ESTIMATE_FIELDS = [f["name"] for f in load(WINDOWED_ESTIMATE)["fields"]]
