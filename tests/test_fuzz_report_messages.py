"""Fuzzing the collector's report messages (issue 42): bodies and attributes
nobody thought of.

A message is untrusted input by construction (a buggy or malicious device
made it). Whatever its body and attributes, the check (``CheckMessageFn``)
ends in exactly one of two ways: an accepted batch, which the collector's
count (``accumulate_round``) takes without error and which counts exactly
its reports, or a dead letter naming one of the known reasons. Never an
exception in the worker, never nothing (a message read = valid + rejected).

Cases: random bytes; a valid body with bytes flipped, cut or appended; the
valid attributes with values replaced by arbitrary text or dropped.
Hypothesis, derandomised, a bounded budget.

What it found: a body with one bit flipped can still decode (Avro has no
checksum) into reports no client makes -- a PCKV sign of 0, a position past
the domain -- which the check accepted and the windows' combine then raised
on, failing the streaming job (and every restart of it, on the same
message): one device could stop the collector. Such reports are a dead
letter now, ``invalid reports``.
"""
from __future__ import annotations

import dataclasses
import io
import resource
import time

import fastavro
import numpy as np
import pytest
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.pvalue import TaggedOutput
from apache_beam.utils.timestamp import Timestamp
from hypothesis import strategies as st

from fuzz_harness import CAMPAIGN_CASES, campaign
from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.schemas import envelope
from kvldp.schemas.expansion import check_expansion
from kvldp.transforms.streaming import REQUIRED_ATTRIBUTES, CheckMessageFn, RoundBatch, expected_rounds

MECH = registry.make("pckv-grr", 6, 2.0)
CONFIG = dict(MECH.config())
NOW_MS = int(time.time() * 1000)
USERS = next(iter(SyntheticDataset("uu", n_users=40, d=6, seed=1).batches(40)))
BODY = envelope.reports_bytes(MECH.perturb(USERS, np.random.default_rng(1)), CONFIG)
ATTRIBUTES = envelope.message_attributes(CONFIG, 3, 1, NOW_MS, "0123456789abcdef")
REASONS = {"malformed attributes", "config fingerprint", "round", "future event time", "undecodable body",
           "invalid reports"}

@st.composite
def bodies(draw):
    kind = draw(st.sampled_from(["random", "flip", "cut", "append", "valid"]))
    if kind == "random":
        return draw(st.binary(max_size=2048))
    body = bytearray(BODY)
    if kind == "flip":
        for i in draw(st.lists(st.integers(0, len(body) - 1), min_size=1, max_size=8)):
            body[i] ^= draw(st.integers(1, 255))
    elif kind == "cut":
        body = body[:draw(st.integers(0, len(body) - 1))]
    elif kind == "append":
        body += draw(st.binary(min_size=1, max_size=256))
    return bytes(body)


@st.composite
def attributes(draw):
    attrs = dict(ATTRIBUTES)
    for name in draw(st.lists(st.sampled_from(sorted(attrs)), max_size=3, unique=True)):
        if draw(st.booleans()):
            del attrs[name]
        else:
            attrs[name] = draw(st.one_of(st.text(max_size=30), st.integers().map(str)))
    return attrs


def _outcome(body: bytes, attrs: dict):
    fn = CheckMessageFn(MECH, expected_rounds(MECH, [CONFIG]), max_future=60.0, job="fuzz")
    out = list(fn.process(PubsubMessage(body, attrs), timestamp=Timestamp.of(NOW_MS / 1000)))
    assert len(out) == 1, out
    return out[0]


def check_message(case) -> str:
    body, attrs = case
    out = _outcome(body, attrs)
    if isinstance(out, TaggedOutput):
        assert out.value["reason"] in REASONS, out.value
        return "dead letter"
    message_id, batch = out
    assert isinstance(batch, RoundBatch) and message_id
    assert all(attrs.get(name) for name in REQUIRED_ATTRIBUTES)
    counts = MECH.accumulate_round(0, MECH.new_round_counts(0), batch.reports)
    assert counts[0] == batch.n_reports                 # the count takes exactly the batch's reports
    return "accepted"


MESSAGES = st.tuples(bodies(), attributes())


def test_every_message_is_one_batch_counted_whole_or_one_dead_letter():
    campaign(MESSAGES, check_message, 1500, "Pub/Sub and Kafka message bodies and attributes")


@pytest.mark.slow
def test_campaign_every_message_is_one_batch_counted_whole_or_one_dead_letter():
    campaign(MESSAGES, check_message, CAMPAIGN_CASES, "Pub/Sub and Kafka message bodies and attributes")


def _crafted(**columns) -> bytes:
    honest = MECH.perturb(USERS, np.random.default_rng(1))
    changed = {name: np.array(getattr(honest, name)) for name in columns}
    for name, (index, value) in columns.items():
        changed[name][index] = value
    return envelope.reports_bytes(dataclasses.replace(honest, **changed), CONFIG)


def test_a_malicious_device_cannot_stop_the_collector():
    """Before: accepted, then ``ValueError`` in the combine (the job failed)."""
    for body in (_crafted(symbols=(0, 0)), _crafted(symbols=(3, 5)), _crafted(positions=(0, 99)),
                 _crafted(positions=(2, -1))):
        out = _outcome(body, ATTRIBUTES)
        assert isinstance(out, TaggedOutput) and out.value["reason"] == "invalid reports", out


def test_the_fuzzer_reaches_both_outcomes():
    """Guard: the valid message is accepted and a cut one refused, so the
    property above is not met vacuously by one of its branches."""
    assert not isinstance(_outcome(BODY, ATTRIBUTES), TaggedOutput)
    assert _outcome(BODY[:10], ATTRIBUTES).value["reason"] == "undecodable body"


def _bomb(column_bytes: int, codec: str = "zstandard") -> bytes:
    """A valid body with one column's data replaced by zeros, which compress to almost nothing."""
    reader = fastavro.reader(io.BytesIO(BODY))
    records = list(reader)
    records[0]["columns"][0]["data"] = bytes(column_bytes)
    buf = io.BytesIO()
    fastavro.writer(buf, reader.writer_schema, records, codec=codec,
                    metadata={k: v for k, v in reader.metadata.items() if not k.startswith("avro.")})
    return buf.getvalue()


@pytest.mark.parametrize("codec", ["zstandard", "deflate"])
def test_a_body_that_inflates_a_thousandfold_is_a_dead_letter_before_it_is_inflated(codec):
    """Before: an 18.5 KB body of 512 MB of zeros was accepted after the
    check grew the process by 4.6 GB in 19 s (at Pub/Sub's 10 MB limit one
    device could exhaust the collector's memory on every restart). Here 64
    MB of zeros, so the test stays cheap; the peak may not grow by more than
    the floor (16 MiB) and a bit."""
    body = _bomb(64 << 20, codec)
    assert len(body) < 100_000
    start = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out = _outcome(body, ATTRIBUTES)
    grew = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - start) * 1024
    assert isinstance(out, TaggedOutput) and out.value["reason"] == "undecodable body", out
    assert "expands past" in out.value["detail"], out.value
    assert grew < 40 << 20, f"the check grew the process by {grew >> 20} MiB"


def test_honest_bodies_of_every_size_pass_the_expansion_check():
    for name, d, eps, n in [("pckv-ue", 2_000, 1.0, 3_000), ("pckv-grr", 6, 2.0, 60_000), ("ks-ue", 500, 0.5, 2_000)]:
        mech = registry.make(name, d, eps)
        users = next(iter(SyntheticDataset("uu", n_users=n, d=d, seed=2).batches(n)))
        check_expansion(envelope.reports_bytes(mech.perturb(users, np.random.default_rng(2)), dict(mech.config())))
