"""Durations, instants, sizes, paths and Pub/Sub resource names on the command line."""
from __future__ import annotations

import argparse
import datetime as dt
import math
import os
import re

DURATION_PATTERN = r"^\s*([0-9]*\.?[0-9]+)\s*(ms|s|m|h|d)?\s*$"
_DURATION = re.compile(DURATION_PATTERN)
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, None: 1.0}


def parse_duration(text: str) -> float:
    """``"90"``, ``"90s"``, ``"250ms"``, ``"5m"``, ``"1h"``, ``"1d"`` -> seconds (>= 0)."""
    match = _DURATION.match(str(text))
    if not match:
        raise argparse.ArgumentTypeError(f"a duration is a number with an optional unit ms, s, m, h or d "
                                         f"(e.g. 30s, 1h), got {text!r}")
    seconds = float(match.group(1)) * _SECONDS[match.group(2)]
    if not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"a duration must be finite, got {text!r}")
    return seconds


BYTES_PATTERN = r"^\s*([0-9]*\.?[0-9]+)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB|K|M|G|T)?\s*$"
_BYTES = re.compile(BYTES_PATTERN, re.IGNORECASE)
_BYTE_UNITS = {"b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
               "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "k": 2**10, "m": 2**20, "g": 2**30,
               "t": 2**40, None: 1}


def parse_bytes(text: str) -> int:
    """``"1GiB"``, ``"512MiB"``, ``"2G"`` (binary), ``"500MB"`` (decimal), ``"1048576"`` -> bytes (>= 1 MiB)."""
    match = _BYTES.match(str(text))
    if not match:
        raise argparse.ArgumentTypeError(f"a size is a number with an optional unit (e.g. 512MiB, 2GiB, 1G), "
                                         f"got {text!r}")
    unit = match.group(2).lower() if match.group(2) else None
    size = float(match.group(1)) * _BYTE_UNITS[unit]
    if not math.isfinite(size):
        raise argparse.ArgumentTypeError(f"a size must be finite, got {text!r}")
    value = int(size)
    if value < 2**20:
        raise argparse.ArgumentTypeError(f"must be at least 1 MiB, got {text!r}")
    return value


def parse_instant_ms(text: str) -> int:
    """An instant as milliseconds since the epoch: ``now``, a whole number of
    ms, or ISO-8601 (a time without an offset is UTC)."""
    text = str(text).strip()
    if text == "now":
        return int(dt.datetime.now(dt.timezone.utc).timestamp() * 1000)
    if text.isascii() and text.isdigit():      # "²".isdigit() too, which int() refuses
        if len(text) > 18:                      # past the year 33658: a typo, and int() refuses 4,300 digits
            raise argparse.ArgumentTypeError(f"an instant in ms since the epoch has at most 18 digits, got {text!r}")
        return int(text)
    try:
        when = dt.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"an instant is 'now', ms since the epoch or ISO-8601, got {text!r}") from None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.timezone.utc)
    return int(when.timestamp() * 1000)


_PROJECT, _NAME = r"projects/[a-z][-a-z0-9]{4,28}[a-z0-9]", r"[A-Za-z][-A-Za-z0-9._~%+]{2,254}"
_RESOURCE = re.compile(rf"^{_PROJECT}/(topics|subscriptions)/{_NAME}$")


def pubsub_pattern(kind: str) -> str:
    """The regex of a full Pub/Sub name of ``kind`` (template validation)."""
    return rf"^{_PROJECT}/{kind}/{_NAME}$"


def pubsub_path(kind: str):
    """An argparse ``type`` for a full Pub/Sub name, ``projects/P/topics/T``
    or ``projects/P/subscriptions/S`` (``kind``: ``topics``/``subscriptions``)."""

    def parse(text: str) -> str:
        match = _RESOURCE.match(text)
        if not match or match.group(1) != kind:
            raise argparse.ArgumentTypeError(f"must be a full Pub/Sub name projects/PROJECT/{kind}/NAME, got {text!r}")
        return text
    parse.__name__ = kind
    parse.pattern = pubsub_pattern(kind)
    return parse


def path_arg(text: str) -> str:
    """A file, directory or pattern flag: a local one made absolute (``~``
    expanded), a URL (``gs://…``) unchanged. Beam's local pattern matching
    needs a directory part, so a bare ``'R-*.avro'`` run inside the reports'
    directory matched nothing while ``./R-*.avro`` worked."""
    text = str(text).strip()
    if not text:
        raise argparse.ArgumentTypeError("an empty path")
    if "://" in text:
        return text
    return os.path.abspath(os.path.expanduser(text))


def fraction(text: str) -> float:
    """A share in [0, 1], as an argparse ``type``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number in [0, 1], got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {value:g}")
    return value


def positive_int(text: str) -> int:
    """A whole number >= 1, as an argparse ``type``."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def non_negative(text: str) -> float:
    """A number >= 0, as an argparse ``type``."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not value >= 0 or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value
