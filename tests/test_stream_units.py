"""The streaming pieces without a Pub/Sub server: the report envelope, the
checks that refuse a message (each with its reason), the lateness gate,
windows and pane records, and the command-line units."""
from __future__ import annotations

import argparse
import io
import json
import math
import time

import numpy as np
import pytest
from apache_beam.io.gcp.pubsub import PubsubMessage
from apache_beam.transforms import window
from apache_beam.utils.timestamp import Timestamp

from kvldp.cli.units import parse_duration, parse_instant_ms, pubsub_path
from kvldp.mechanisms import registry
from kvldp.runtime.tally import forget, tally
from kvldp.schemas import envelope
from kvldp.transforms.stream_rounds import ChainRoundsFn
from kvldp.transforms.stream_sinks import DEAD_LETTER_FILES_WRITTEN, _WriteDeadLetterFn, pane_bytes, pane_records
from kvldp.transforms.streaming import (
    DEAD_LETTER,
    DEAD_LETTERS_EMITTED,
    CheckMessageFn,
    GatedBatch,
    LatenessGateFn,
    Pane,
    RoundBatch,
    WindowSpec,
    expected_rounds,
    keep_open_windows,
)

MECH = registry.make("pckv-grr", 6, 2.0)
CONFIG = dict(MECH.config())


def _reports(seed: int = 1):
    from kvldp.datasets import SyntheticDataset
    data = SyntheticDataset("uu", n_users=50, d=6, seed=seed)
    users = next(iter(data.batches(50)))
    return MECH.perturb(users, np.random.default_rng(seed))


RUN = "0123456789abcdef"


def _message(reports, config=CONFIG, round_number=1, event_ms=None, run=RUN, **override):
    attrs = envelope.message_attributes(config, 3, round_number,
                                        int(time.time() * 1000) if event_ms is None else event_ms, run)
    attrs.update(override)
    return PubsubMessage(envelope.reports_bytes(reports, config), attrs)


def _check(message, timestamp_ms=None):
    """The check of one message, timestamped with its event time (as the
    sources stamp it) unless ``timestamp_ms`` says otherwise."""
    fn = CheckMessageFn(MECH, expected_rounds(MECH, [CONFIG]), max_future=60.0, job="units")
    if timestamp_ms is None:
        stated = (message.attributes or {}).get(envelope.EVENT_MS, "")
        timestamp_ms = int(stated) if stated.isdigit() else int(time.time() * 1000)
    return list(fn.process(message, timestamp=Timestamp.of(timestamp_ms / 1000)))


def test_a_report_batch_survives_the_envelope():
    reports = _reports()
    body = envelope.reports_bytes(reports, CONFIG)
    container = envelope.ReportContainer(io.BytesIO(body))
    assert container.config == CONFIG and container.columnar and container.kind == "report"
    [decoded] = container.batches(MECH, 0)
    assert decoded.equals(reports)
    attrs = envelope.message_attributes(CONFIG, 7, 1, 123, RUN)
    assert attrs[envelope.MESSAGE_ID] == envelope.message_id(envelope.config_fingerprint(CONFIG), 1, 7, RUN)
    assert attrs[envelope.EVENT_MS] == "123" and attrs[envelope.BATCH] == "7"
    other = dict(CONFIG, epsilon=3.0)
    assert envelope.config_fingerprint(other) != envelope.config_fingerprint(CONFIG)


def test_check_accepts_this_collections_batch_with_its_id():
    reports = _reports()
    [(ident, got)] = _check(_message(reports))
    assert ident == envelope.message_id(envelope.config_fingerprint(CONFIG), 1, 3, RUN)
    assert got.reports.equals(reports) and got.reports.batch_id == 3 and got.round_index == 0


def test_two_publishing_runs_of_the_same_batch_have_two_ids():
    """Issue 40: the id had no run component, so a second run with the same
    settings was dropped as a duplicate of the first; a redelivery of one
    run's message keeps its id (counted once)."""
    reports = _reports()
    first, second = envelope.new_run(), envelope.new_run()
    [(id_a, _)] = _check(_message(reports, run=first))
    [(id_b, _)] = _check(_message(reports, run=second))
    [(id_again, _)] = _check(_message(reports, run=first))
    assert id_a != id_b and id_again == id_a


@pytest.mark.parametrize("case, reason", [
    ("other epsilon", "config fingerprint"),
    ("round 2", "round"),
    ("no batch attribute", "malformed attributes"),
    ("an hour ahead", "future event time"),
    ("garbage body", "undecodable body"),
    ("body of another config", "undecodable body"),
    ("garbage without attributes", "malformed attributes"),
    ("batch not a number", "malformed attributes"),
    ("no run attribute", "malformed attributes"),
    ("timestamp is not the event time", "malformed attributes"),
])
def test_check_refuses_with_the_reason(case, reason):
    reports = _reports()
    message = {
        "other epsilon": lambda: _message(reports, dict(CONFIG, epsilon=3.0)),
        "round 2": lambda: _message(reports, round_number=2),
        "no batch attribute": lambda: PubsubMessage(
            envelope.reports_bytes(reports, CONFIG),
            {k: v for k, v in _message(reports).attributes.items() if k != envelope.BATCH}),
        "an hour ahead": lambda: _message(reports, event_ms=int((time.time() + 3600) * 1000)),
        "garbage body": lambda: PubsubMessage(b"not avro", _message(reports).attributes),
        "body of another config": lambda: PubsubMessage(envelope.reports_bytes(reports, dict(CONFIG, d=7)),
                                                        _message(reports).attributes),
        "garbage without attributes": lambda: PubsubMessage(b"garbage", None),
        "batch not a number": lambda: _message(reports, **{envelope.BATCH: "3x"}),
        "no run attribute": lambda: PubsubMessage(
            envelope.reports_bytes(reports, CONFIG),
            {k: v for k, v in _message(reports).attributes.items() if k != envelope.RUN}),
        "timestamp is not the event time": lambda: _message(reports),
    }[case]()
    skew = 5_000 if case == "timestamp is not the event time" else 0
    [out] = _check(message, None if not skew else int(message.attributes[envelope.EVENT_MS]) - skew)
    assert out.tag == DEAD_LETTER and out.value["reason"] == reason
    assert out.value["attributes"] == dict(message.attributes or {})       # enough to find and replay it
    if case == "garbage without attributes":        # it said "config fingerprint" before issue 40
        assert "no kvldp_fingerprint" in out.value["detail"]
    if case == "batch not a number":
        assert "kvldp_batch is '3x'" in out.value["detail"]


def test_lateness_gate_keeps_open_windows_only():
    """Fixed windows: in or out whole. Sliding windows: the element keeps
    the windows still open and is dead-lettered only when none is."""
    now = time.time()
    fixed = LatenessGateFn(WindowSpec(size=10, allowed_lateness=5), job="units")
    reports = RoundBatch(0, "", "", _reports())
    [kept] = list(fixed.process(reports, Timestamp.of(now - 3)))
    assert isinstance(kept, GatedBatch) and len(kept.open_window_starts) == 1 and kept.batch is reports
    [late] = list(fixed.process(reports, Timestamp.of(now - 30)))
    assert late.tag == DEAD_LETTER and late.value["reason"] == "late"
    sliding = LatenessGateFn(WindowSpec(size=10, every=5, allowed_lateness=0), job="units")
    boundary = 5 * math.floor(now / 5)           # the slide boundary just passed: one window ended there
    [part] = list(sliding.process(reports, Timestamp.of(boundary - 4)))
    assert part.open_window_starts == (Timestamp.of(boundary - 5).micros,)      # the window that ended is dropped
    kept = [list(keep_open_windows(part, window.IntervalWindow(start, start + 10)))
            for start in (boundary - 10, boundary - 5)]
    assert kept == [[], [reports]]


class _Chain:
    """A ChainRoundsFn's state cell outside a runner."""

    def __init__(self):
        self.value = None

    def read(self):
        return self.value

    def write(self, value):
        self.value = value


def test_every_dead_letter_is_counted_as_it_is_made():
    """The job's monitor waits until as many dead letters are written and
    published as were made (``stream.Monitor``): each of the three places
    that refuse something counts its letters, and nothing else counts."""
    job = "units-dead-letters"
    forget(job)
    check = CheckMessageFn(MECH, expected_rounds(MECH, [CONFIG]), max_future=60.0, job=job)
    reports = _reports()
    message = _message(reports)
    stamp = Timestamp.of(int(message.attributes[envelope.EVENT_MS]) / 1000)
    list(check.process(message, stamp))                                                   # accepted
    list(check.process(PubsubMessage(b"not avro", message.attributes), stamp))
    assert tally(job)[DEAD_LETTERS_EMITTED] == 1
    gate = LatenessGateFn(WindowSpec(size=10, allowed_lateness=5), job=job)
    list(gate.process(RoundBatch(0, "", "", reports), Timestamp.of(time.time() - 3)))     # in time
    list(gate.process(RoundBatch(0, "", "", reports), Timestamp.of(time.time() - 30)))
    assert tally(job)[DEAD_LETTERS_EMITTED] == 2
    protocol = registry.make("privkvm-plus", 6, 2.0)
    chain = ChainRoundsFn(protocol, "collection-a", [f"k{j}" for j in range(6)], job)
    counts = protocol.new_round_counts(1)
    head = Pane(0, 10_000, "EARLY", 0, False, None)
    out = list(chain.process(("chain", (head, {(1, "broadcast-x", "layout"): (counts, 4)})), _Chain()))
    assert [o.value["reason"] for o in out] == ["round out of order"]
    assert tally(job)[DEAD_LETTERS_EMITTED] == 3 and tally(job)["batches_refused"] == 4
    forget(job)


def test_every_dead_letter_gets_a_file_of_its_own(tmp_path):
    """A round's refusals carry no message id, batch or time: two of them
    had one file name, and the second overwrote the first. A retried
    letter still rewrites its own file."""
    job = "units-dead-letter-files"
    forget(job)
    fn = _WriteDeadLetterFn(str(tmp_path), job)
    refusals = [{"reason": "round out of order", "detail": f"4 batches of round 2 in window {w}",
                 "attributes": {envelope.ROUND: "2", envelope.BROADCAST: "b"}, "data_base64": "",
                 "processing_time_ms": 0} for w in ("w0", "w1")]
    for letter in [*refusals, refusals[0]]:
        list(fn.process(letter))
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 2 and tally(job)[DEAD_LETTER_FILES_WRITTEN] == 3
    assert sorted(json.loads(f.read_text())["detail"] for f in files) == sorted(r["detail"] for r in refusals)
    forget(job)


def test_window_spec_checks_and_builds_windows():
    assert isinstance(WindowSpec(60).windowfn(), window.FixedWindows)
    assert isinstance(WindowSpec(60, every=15).windowfn(), window.SlidingWindows)
    for bad in (dict(size=0), dict(size=10, every=20), dict(size=10, early_every=0),
                dict(size=10, allowed_lateness=-1)):
        with pytest.raises(ValueError):
            WindowSpec(**bad)
    assert WindowSpec(10, allowed_lateness=30, max_future=60).beam_lateness > 90


def test_pane_records_carry_the_window_and_match_the_schema():
    counts = MECH.accumulate(MECH.new_counts(), _reports())
    est = MECH.estimate(counts)
    pane = Pane(1_000, 61_000, "ON_TIME", 2, False, est)
    records = pane_records(pane, [f"k{i}" for i in range(6)])
    assert len(records) == 6 and records[0]["window_start"] == 1_000 and records[0]["pane_timing"] == "ON_TIME"
    assert records[0]["n_reports"] == 50
    import fastavro
    back = list(fastavro.reader(io.BytesIO(pane_bytes(records, "avro"))))     # timestamp-millis -> datetime
    assert [r["window_start"].timestamp() * 1000 for r in back] == [1_000] * 6
    strip = lambda rs: [{k: v for k, v in r.items() if not k.startswith("window_")} for r in rs]  # noqa: E731
    assert strip(back) == strip(records)
    assert pane.name == "1000-61000-pane002-ON_TIME"


def test_units_on_the_command_line():
    assert parse_duration("90") == 90 and parse_duration("250ms") == 0.25 and parse_duration("1h") == 3600
    assert parse_duration("1.5m") == 90
    with pytest.raises(argparse.ArgumentTypeError):
        parse_duration("soon")
    assert parse_instant_ms("1700000000000") == 1_700_000_000_000
    assert parse_instant_ms("2023-11-14T22:13:20Z") == 1_700_000_000_000
    assert abs(parse_instant_ms("now") - time.time() * 1000) < 5_000
    check = pubsub_path("topics")
    assert check("projects/my-proj/topics/reports") == "projects/my-proj/topics/reports"
    for bad in ("reports", "projects/my-proj/subscriptions/reports", "projects/x/topics/reports"):
        with pytest.raises(argparse.ArgumentTypeError):
            check(bad)


def test_sink_files_appear_whole(tmp_path, monkeypatch):
    """A pane file is never opened for writing under its final name (a
    reader polling the directory would see it half-written): it is written
    under a temporary name and renamed."""
    from apache_beam.io.filesystems import FileSystems

    from kvldp.transforms import stream_sinks
    created = []
    real_create = FileSystems.create
    monkeypatch.setattr(FileSystems, "create", lambda path, *a, **k: created.append(path) or real_create(path, *a, **k))
    est = MECH.estimate(MECH.accumulate(MECH.new_counts(), _reports()))
    fn = stream_sinks._WritePaneFn(str(tmp_path), "jsonl", [f"k{i}" for i in range(6)], None, job="units")
    [path] = list(fn.process(Pane(0, 10_000, "EARLY", 0, False, est)))
    assert path not in created and all(".tmp-" in c for c in created)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["estimates-0-10000-pane000-EARLY.jsonl"]
    assert len((tmp_path / "estimates-0-10000-pane000-EARLY.jsonl").read_text().splitlines()) == 6
