"""Streaming collection: report messages (``schemas.envelope``) from Pub/Sub
or Kafka (``report_messages``) -> calibrated estimates per event-time window
and pane.

``messages -> CheckReports -> DeduplicateBatches -> WindowReports ->
CalibratePanes -> panes``, each pane one ``Pane`` (the window, the pane's
timing and index, the calibrated estimates) that the sinks write.

Nothing is lost without a trace: every message read is either accepted, a
duplicate (counted), or a dead letter with its reason (wrong
fingerprint/round, undecodable, event time too far in the future, late).

Lateness is judged against the collector's clock, per window a batch
belongs to: a batch arriving more than ``allowed_lateness`` after a
window's end is dead-lettered for that window (``WindowReports``). Beam's own
allowed lateness is set to ``allowed_lateness + max_future``: the watermark
never runs ahead of the clock by more than the future tolerance (later
event times are refused), so Beam never silently drops a batch the gate
let through. After a restart on a backlog older than ``allowed_lateness``
the gate refuses batches Beam would still have accepted: raise
``allowed_lateness`` for such a catch-up.
"""
from __future__ import annotations

import base64
import dataclasses
import io
import json
import time
import typing

import apache_beam as beam
from apache_beam.transforms import trigger, window
from apache_beam.transforms.deduplicate import DeduplicatePerKey
from apache_beam.utils.timestamp import Duration, Timestamp
from apache_beam.utils.windowed_value import PaneInfoTiming

from kvldp.mechanisms.base import Estimates
from kvldp.runtime.tally import DistinctCounter, JobCounter
from kvldp.schemas import envelope
from kvldp.schemas.expansion import check_expansion
from kvldp.transforms.collector import CollectStep

DEAD_LETTER = "dead_letter"


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """Event-time windows and their panes (durations in seconds).

    ``size``: window length; ``every``: the slide of sliding windows
    (``None``: fixed windows); ``early_every``: an early, accumulating pane
    this long after the first batch of each pane (``None``: none; Beam's
    processing-time trigger counts whole seconds, so it is rounded, >= 1);
    ``allowed_lateness``: how long after its end a window takes late batches
    (each in a LATE pane); ``max_future``: how far ahead of the collector's
    clock an event time may be."""

    size: float
    every: float | None = None
    early_every: float | None = None
    allowed_lateness: float = 0.0
    max_future: float = 300.0

    def __post_init__(self):
        if not self.size > 0:
            raise ValueError(f"the window size must be > 0 s, got {self.size}")
        if self.every is not None and not 0 < self.every <= self.size:
            raise ValueError(f"--sliding-every must be in (0, window], got {self.every}")
        if self.early_every is not None and not self.early_every > 0:
            raise ValueError(f"--early-every must be > 0 s, got {self.early_every}")
        if self.allowed_lateness < 0 or self.max_future < 0:
            raise ValueError("--allowed-lateness and --max-future must be >= 0")

    def windowfn(self) -> window.WindowFn:
        if self.every is None:
            return window.FixedWindows(self.size)
        return window.SlidingWindows(self.size, self.every)

    def trigger(self):
        # Beam's AfterProcessingTime takes whole seconds
        early = trigger.AfterProcessingTime(max(1, round(self.early_every))) if self.early_every else None
        return trigger.AfterWatermark(early=early, late=trigger.AfterCount(1))

    @property
    def beam_lateness(self) -> float:
        """Beam's allowed lateness: wide enough never to drop what the gate passes."""
        return self.allowed_lateness + self.max_future + 1.0


DEAD_LETTERS_EMITTED = "dead_letters_emitted"
WINDOWS_OPENED = "windows_opened"
WINDOWS_CLOSED = "windows_closed"


class DeadLetterOutput:
    """A streaming DoFn's dead-letter output: ``out(letter)`` is the tagged
    output, counted (``dead_letters_emitted``) as it is made, so the job's
    monitor can wait until its sinks have written and published as many
    (``pipelines/stream.py``): a letter refused at the end of a job is never
    lost to the stop."""

    def __init__(self, job: str):
        self._emitted = JobCounter(job, DEAD_LETTERS_EMITTED)

    def __call__(self, letter: dict) -> beam.pvalue.TaggedOutput:
        self._emitted.inc()
        return beam.pvalue.TaggedOutput(DEAD_LETTER, letter)


def dead_letter(reason: str, message, detail: str = "") -> dict:
    """A dead letter: the reason, the message's attributes and body (base64;
    the body is randomised reports, what the collector may see), so it can
    be inspected and replayed."""
    return {"reason": reason, "detail": detail, "attributes": dict(message.attributes or {}),
            "data_base64": base64.b64encode(message.data or b"").decode("ascii"),
            "processing_time_ms": int(time.time() * 1000)}


@dataclasses.dataclass(frozen=True)
class RoundBatch:
    """A checked batch: its round (0-based), the broadcast it was perturbed
    with (rounds >= 1 of a multi-round protocol, else ``""``), the layout
    its perturbing side batched users with, and the reports."""

    round_index: int
    broadcast: str
    layout: str
    reports: typing.Any

    @property
    def n_reports(self) -> int:
        return self.reports.n_reports


def expected_rounds(protocol, round_configs: typing.Sequence[dict]) -> dict[str, tuple[int, dict]]:
    """``fingerprint -> (round index, configuration)`` a collector accepts."""
    return {envelope.config_fingerprint(c): (r, dict(c)) for r, c in enumerate(round_configs)}


# what every report message carries (schemas/envelope.py); a broadcast id only from round 2 on
REQUIRED_ATTRIBUTES = (envelope.FINGERPRINT, envelope.ROUND, envelope.BATCH, envelope.EVENT_MS, envelope.RUN)


class CheckMessageFn(beam.DoFn):
    """A report message (``PubsubMessage`` or ``report_messages.ReportMessage``)
    -> ``(message id, RoundBatch)``, or a dead letter: attributes missing or
    not integers, another configuration (fingerprint), a round attribute
    that disagrees with it, an event time that is not the message's
    timestamp or is too far in the future, a body that does not decode as
    that round's reports, or reports the round's count refuses (values no
    honest client makes). ``expected``: ``expected_rounds``."""

    def __init__(self, protocol, expected: dict, max_future: float, job: str):
        self._protocol, self._expected = protocol, dict(expected)
        self._max_future_ms = int(max_future * 1000)
        self._read, self._rejected = JobCounter(job, "messages_read"), JobCounter(job, "messages_rejected")
        self._valid, self._dead = JobCounter(job, "messages_valid"), DeadLetterOutput(job)

    def process(self, message, timestamp=beam.DoFn.TimestampParam):
        self._read.inc()
        attrs = message.attributes or {}
        try:
            batch, message_id = self._check(message, attrs, timestamp)
        except _Reject as err:
            self._rejected.inc()
            yield self._dead(dead_letter(err.reason, message, err.detail))
            return
        self._valid.inc()
        yield message_id, batch

    def _check(self, message, attrs, timestamp):
        missing = [name for name in REQUIRED_ATTRIBUTES if not attrs.get(name)]
        if missing:
            raise _Reject("malformed attributes", f"no {', '.join(missing)} attribute: not a report message of "
                                                  "kvldp publish (or of a publisher older than the run nonce)")
        fingerprint = attrs[envelope.FINGERPRINT]
        if fingerprint not in self._expected:
            known = "; ".join(f"round {r + 1}: {json.dumps(envelope.without_layout(c), sort_keys=True)}"
                              for r, c in self._expected.values())
            raise _Reject("config fingerprint", f"{fingerprint} is not this collector's ({known})")
        round_index, config = self._expected[fingerprint]
        round_number, batch, event_ms = (_integer(attrs, name) for name in (envelope.ROUND, envelope.BATCH,
                                                                          envelope.EVENT_MS))
        if round_number != round_index + 1:
            raise _Reject("round", f"round attribute {round_number}, but the fingerprint is round {round_index + 1}'s")
        broadcast = attrs.get(envelope.BROADCAST, "")
        if round_index > 0 and not broadcast:
            raise _Reject("malformed attributes", f"round {round_number} names no {envelope.BROADCAST}")
        if timestamp.micros // 1000 != event_ms:
            # the windows use the element's timestamp (Kafka: the record's): it must be the stated event time
            raise _Reject("malformed attributes", f"{envelope.EVENT_MS} is {event_ms} but the message's timestamp "
                                                  f"is {timestamp.micros // 1000} ms")
        if event_ms > time.time() * 1000 + self._max_future_ms:
            raise _Reject("future event time", f"event time {event_ms} ms is more than "
                                                f"{self._max_future_ms} ms ahead of the collector's clock")
        try:
            check_expansion(message.data)        # before fastavro inflates a block whole
            container = envelope.ReportContainer(io.BytesIO(message.data))
            container.check(config, self._protocol.round_report_type(round_index), "message body", layout=False)
            parts = list(container.batches(self._protocol, round_index, batch))
            kind = self._protocol.round_report_type(round_index)
            reports = parts[0] if len(parts) == 1 else kind.from_columns(
                kind.concat_columns([p.columns() for p in parts]), batch, **self._protocol.report_shape(round_index))
        except Exception as err:  # any undecodable body is a dead letter, never a crash in a worker
            raise _Reject("undecodable body", f"{type(err).__name__}: {err}") from None
        try:   # in the combine a report no honest client makes would fail the job, and every retry of it
            self._protocol.check_reports(round_index, reports)
        except ValueError as err:
            raise _Reject("invalid reports", str(err)) from None
        if reports.batch_id != batch:
            reports = dataclasses.replace(reports, batch_id=batch)
        layout = (container.config or {}).get(envelope.LAYOUT, "")
        return RoundBatch(round_index, broadcast, layout, reports), \
            envelope.message_id(fingerprint, round_number, batch, attrs[envelope.RUN])


def _integer(attrs, name: str) -> int:
    try:
        return int(attrs[name])
    except ValueError:
        raise _Reject("malformed attributes", f"{name} is {attrs[name][:40]!r}, not an integer") from None


class _Reject(Exception):
    def __init__(self, reason: str, detail: str):
        super().__init__(reason)
        self.reason, self.detail = reason, detail


class CheckReports(beam.PTransform):
    """``PubsubMessage``s -> ``{"reports": (id, RoundBatch), "dead_letter": dict}``."""

    def __init__(self, protocol, expected: dict, max_future: float, job: str, label: str | None = None):
        super().__init__(label)
        self._fn = CheckMessageFn(protocol, expected, max_future, job)

    def expand(self, messages):
        out = messages | "Check" >> beam.ParDo(self._fn).with_outputs(DEAD_LETTER, main="reports")
        return {"reports": out.reports, DEAD_LETTER: out[DEAD_LETTER]}


class _CountFn(beam.DoFn):
    def __init__(self, job: str, name: str):
        self._counter = JobCounter(job, name)

    def process(self, element):
        self._counter.inc()
        yield element


class DeduplicateBatches(beam.PTransform):
    """``(message id, RoundBatch) -> RoundBatch``, each id once until the
    watermark is ``horizon`` seconds past its event time (Beam's
    ``DeduplicatePerKey``: a redelivered batch is counted once on every
    runner, also where ``id_label`` is not honoured). Counts the unique
    batches; duplicates = valid - unique.

    Event time, not processing time: a processing-time timer holds the
    output watermark at its element's timestamp (Beam's Python SDK sets that
    hold; Flink honours it), so with a horizon of an hour no window
    downstream would close for an hour. An event-time timer holds only at
    its own firing time, ``horizon`` after the batch's event time.
    ``StreamConfig`` keeps ``horizon`` above a window plus its lateness, so a
    redelivery the windows would still take is always recognised."""

    def __init__(self, horizon: float, job: str, label: str | None = None):
        super().__init__(label)
        self._horizon, self._job = horizon, job

    def expand(self, keyed):
        return (keyed
                # a str key coder is deterministic, as the stateful dedupe needs
                | "Typed" >> beam.Map(lambda kv: kv).with_output_types(tuple[str, typing.Any])
                | "Dedupe" >> DeduplicatePerKey(event_time_duration=Duration(seconds=self._horizon))
                | "Unique" >> beam.ParDo(_CountFn(self._job, "batches_unique"))
                | "Values" >> beam.Values())


@dataclasses.dataclass(frozen=True)
class GatedBatch:
    """A batch that passed the lateness gate, with the starts (µs) of the
    windows still open for it when it did."""

    batch: RoundBatch
    open_window_starts: tuple[int, ...]


class LatenessGateFn(beam.DoFn):
    """``RoundBatch`` (global window, event timestamp) -> ``GatedBatch``
    naming those of its windows still open on the collector's clock (end +
    ``allowed_lateness`` not passed); a batch with no open window is a dead
    letter, and each window it misses is counted. Decided once per batch, on
    one reading of the clock, so the counts are per batch."""

    def __init__(self, spec: WindowSpec, job: str):
        self._spec, self._windowfn = spec, spec.windowfn()
        self._accepted, self._reports = JobCounter(job, "batches_accepted"), JobCounter(job, "reports_accepted")
        self._late, self._late_windows = JobCounter(job, "batches_late"), JobCounter(job, "late_window_assignments")
        self._dead = DeadLetterOutput(job)

    def process(self, reports, timestamp=beam.DoFn.TimestampParam):
        windows = self._windowfn.assign(window.WindowFn.AssignContext(timestamp, reports))
        now = Timestamp.of(time.time())
        open_ = [w for w in windows if w.end + Duration(seconds=self._spec.allowed_lateness) >= now]
        if len(open_) < len(windows):
            self._late_windows.inc(len(windows) - len(open_))
        if not open_:
            self._late.inc()
            ends = ", ".join(str(w.end) for w in windows)
            yield self._dead({
                "reason": "late", "detail": f"event time {timestamp}: its windows ended at {ends}, more than "
                                            f"{self._spec.allowed_lateness:g} s before {now}",
                "attributes": {envelope.BATCH: str(reports.reports.batch_id),
                               envelope.ROUND: str(reports.round_index + 1)}, "data_base64": "",
                "processing_time_ms": int(time.time() * 1000)})
            return
        self._accepted.inc()
        self._reports.inc(reports.n_reports)
        yield GatedBatch(reports, tuple(int(w.start.micros) for w in open_))


def keep_open_windows(gated: GatedBatch, w=beam.DoFn.WindowParam):
    """The batch in window ``w`` if the gate found ``w`` open, else nothing."""
    if int(w.start.micros) in gated.open_window_starts:
        yield gated.batch


class WindowReports(beam.PTransform):
    """``RoundBatch``es -> ``{"reports": in their event-time windows with the
    triggers of ``spec`` (accumulating panes), "dead_letter": late ones}``.

    The windows are Beam's own ``FixedWindows``/``SlidingWindows`` (a
    portable runner such as Flink assigns and merges windows itself and
    knows only Beam's), and each batch stays only in the windows the gate
    found open."""

    def __init__(self, spec: WindowSpec, job: str, label: str | None = None):
        super().__init__(label)
        self._spec, self._job = spec, job

    def expand(self, reports):
        gated = reports | "LatenessGate" >> beam.ParDo(LatenessGateFn(self._spec, self._job)).with_outputs(
            DEAD_LETTER, main="reports")
        windowed = (gated.reports
                    | "Panes" >> beam.WindowInto(self._spec.windowfn(), trigger=self._spec.trigger(),
                                                 accumulation_mode=trigger.AccumulationMode.ACCUMULATING,
                                                 allowed_lateness=Duration(seconds=self._spec.beam_lateness))
                    | "OpenWindows" >> beam.FlatMap(keep_open_windows))
        return {"reports": windowed, DEAD_LETTER: gated[DEAD_LETTER]}


@dataclasses.dataclass(frozen=True)
class Pane:
    """One firing of one window: its bounds (ms since the epoch), the pane's
    timing (EARLY, ON_TIME, LATE), index and whether it is the window's
    last, and the calibrated estimates of every report the window holds so
    far (panes accumulate)."""

    window_start_ms: int
    window_end_ms: int
    timing: str
    index: int
    is_last: bool
    estimates: typing.Any
    round: int = 1

    @property
    def n_reports(self) -> int:
        return int(self.estimates.n_reports)

    @property
    def name(self) -> str:
        """``{start}-{end}-pane{index:03d}-{timing}`` (ms): one file per pane."""
        return f"{self.window_start_ms}-{self.window_end_ms}-pane{self.index:03d}-{self.timing}"

    @classmethod
    def of(cls, w, pane, estimates, round_number: int = 1) -> Pane:
        return cls(int(w.start.micros // 1000), int(w.end.micros // 1000), PaneInfoTiming.to_string(pane.timing),
                   int(pane.index), bool(pane.is_last), estimates, round_number)


class PaneCounters:
    """The pane counters of a job: panes emitted, on time and late, and
    the windows opened (a window's first pane before it closed) and closed
    (its on-time pane): the stop waits until each opened window closed, so
    none is left half-counted. Windows are counted once each, by window and
    round, since a restore replays panes (``tally.DistinctCounter``)."""

    def __init__(self, job: str):
        self._panes, self._on_time = JobCounter(job, "panes_emitted"), JobCounter(job, "panes_on_time")
        self._late = JobCounter(job, "panes_late")
        self._opened, self._closed = DistinctCounter(job, WINDOWS_OPENED), DistinctCounter(job, WINDOWS_CLOSED)

    def count(self, pane: Pane):
        self._panes.inc()
        window = (pane.window_start_ms, pane.window_end_ms, pane.round)
        if pane.timing != "LATE":
            self._opened.add(window)
        if pane.timing == "ON_TIME":
            self._on_time.inc()
            self._closed.add(window)
        elif pane.timing == "LATE":
            self._late.inc()


class _PaneFn(beam.DoFn):
    def __init__(self, job: str):
        self._counters = PaneCounters(job)

    def process(self, estimates, w=beam.DoFn.WindowParam, pane=beam.DoFn.PaneInfoParam):
        out = Pane.of(w, pane, estimates)
        self._counters.count(out)
        yield out


class CalibratePanes(beam.PTransform):
    """Windowed ``RoundBatch``es of a single-round mechanism -> one ``Pane``
    per window firing: the collector's step (``collector.CollectStep``) per
    window pane, from ``previous``, and the state's estimates."""

    def __init__(self, protocol, job: str, round_index: int = 0, previous=None, label: str | None = None):
        super().__init__(label)
        self._protocol, self._round, self._previous, self._job = protocol, round_index, previous, job

    def expand(self, batches):
        reports = batches | "Reports" >> beam.Map(lambda b: b.reports)
        collected = reports | "Collect" >> CollectStep(self._protocol, self._round, self._previous, per_window=True)
        return (collected["state"]
                | "Estimates" >> beam.Map(self._protocol.estimates).with_output_types(Estimates)
                | "Pane" >> beam.ParDo(_PaneFn(self._job)))
