"""Fuzzing the command line's value parsers (issue 42, its first slice).

Every string a user can type for a duration, a size, an instant, a path, a
share, a count or a Pub/Sub name ends in one of two ways: a value of the
type and range the flag promises, or argparse's one-line error
(``ArgumentTypeError``, which the command prints as ``error: argument
--flag: …``). Never another exception: before, ``--collection-time ²``
raised ``ValueError`` from ``int()`` (``"²".isdigit()`` is true), a
400-digit ``--memory-budget`` raised ``OverflowError`` and a 5,000-digit
instant hit Python's integer-string limit; a 400-digit ``--window`` was
accepted as an infinite duration.

Hypothesis, derandomised (the same cases every run), a bounded budget.
"""
from __future__ import annotations

import argparse
import math

import pytest
from hypothesis import strategies as st

from fuzz_harness import CAMPAIGN_CASES, campaign
from kvldp.cli import units

PARSERS = {
    "duration": units.parse_duration, "bytes": units.parse_bytes, "instant": units.parse_instant_ms,
    "path": units.path_arg, "fraction": units.fraction, "positive_int": units.positive_int,
    "non_negative": units.non_negative, "topic": units.pubsub_path("topics"),
    "subscription": units.pubsub_path("subscriptions"),
}

# text near what the parsers accept: numbers with units, dates, long digit runs, odd digits and spaces
NEAR = st.one_of(
    st.text(),
    st.from_regex(r"\s*[-+]?[0-9²٣.]{0,30}\s*(ms|s|m|h|d|B|K|MiB|GiB|TB|e5)?\s*", fullmatch=True),
    st.from_regex(r"[0-9]{1,6}-[0-9]{1,2}-[0-9]{1,2}(T[0-9:.]{1,15})?(Z|[+-][0-9]{2}:?[0-9]{2})?", fullmatch=True),
    st.integers(min_value=1, max_value=6000).map(lambda n: "9" * n),
    st.from_regex(r"projects/[a-z0-9-]{0,40}/(topics|subscriptions|x)/.{0,20}", fullmatch=True),
)


def _check(kind: str, value):
    if kind in ("duration", "fraction", "non_negative"):
        assert isinstance(value, float) and math.isfinite(value) and value >= 0
        if kind == "fraction":
            assert value <= 1
    elif kind in ("bytes", "positive_int"):
        assert isinstance(value, int) and value >= 1
    elif kind == "instant":
        assert isinstance(value, int)
    else:
        assert isinstance(value, str) and value


def check_value(case) -> str:
    kind, text = case
    try:
        value = PARSERS[kind](text)
    except argparse.ArgumentTypeError as err:
        message = str(err)
    else:
        _check(kind, value)
        return "accepted"
    assert message and "\n" not in message
    return "refused"


CASES = st.tuples(st.sampled_from(sorted(PARSERS)), NEAR)


def test_every_string_is_a_value_or_a_one_line_error():
    campaign(CASES, check_value, 2500, "CLI values")


@pytest.mark.slow
def test_campaign_every_string_is_a_value_or_a_one_line_error():
    campaign(CASES, check_value, CAMPAIGN_CASES, "CLI values")


@pytest.mark.parametrize("kind, text", [
    ("instant", "²"),                   # ValueError from int()
    ("instant", "9" * 5000),            # ValueError: exceeds the limit for integer string conversion
    ("bytes", "9" * 400),               # OverflowError: float infinity to integer
    ("bytes", "9" * 400 + "GiB"),
    ("duration", "9" * 400),            # was accepted: an infinite window
    ("non_negative", "inf"),            # --period-budget inf: the accountant refuses it deep in the job
])
def test_what_the_fuzzer_found_is_a_one_line_error(kind, text):
    with pytest.raises(argparse.ArgumentTypeError):
        PARSERS[kind](text)
