"""The data types every mechanism speaks: user batches, report batches, estimates.

The interface that produces and consumes them is ``protocol.Protocol``
(``protocol.Mechanism`` for one round). Every report batch type derives from
``Reports`` and says itself which Avro schema it is written with and how it
becomes records and back, so no other module dispatches on report types.

This module never imports Beam: a device-side or server-side client can use
the mechanisms without it.
"""
from __future__ import annotations

import abc
import dataclasses
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from kvldp.mechanisms.params import checked_kept_share

if TYPE_CHECKING:
    from kvldp.mechanisms.estimation.countmodel import CountModel

# Users per batch: large enough that per-batch overhead vanishes in NumPy, small
# enough that a batch of reports fits a worker's memory many times over.
DEFAULT_BATCH_SIZE = 50_000


@dataclasses.dataclass(frozen=True)
class UserBatch:
    """A batch of users in CSR form.

    User ``i`` holds the pairs ``keys[offsets[i]:offsets[i+1]]`` with values
    ``values[...]`` in ``[-1, 1]``; keys of one user are distinct. ``batch_id``
    identifies the batch for seeding (never element order, DESIGN.md).
    ``user_ids`` (``uint64``, optional): a stable id per user, the same in
    every collection (a dataset's index, or a hash of a ratings file's user
    id); memoised reports derive each device's secret from it (memo.py).
    """

    offsets: np.ndarray
    keys: np.ndarray
    values: np.ndarray
    batch_id: int = 0
    user_ids: np.ndarray | None = None

    def __post_init__(self):
        object.__setattr__(self, "offsets", np.asarray(self.offsets, dtype=np.int64))
        object.__setattr__(self, "keys", np.asarray(self.keys, dtype=np.int64))
        object.__setattr__(self, "values", np.asarray(self.values, dtype=np.float64))
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or self.offsets[0] != 0:
            raise ValueError("offsets must be a 1-D array starting at 0")
        if self.offsets[-1] != len(self.keys) or len(self.keys) != len(self.values):
            raise ValueError("offsets[-1], len(keys) and len(values) must agree")
        if self.user_ids is not None:
            object.__setattr__(self, "user_ids", np.asarray(self.user_ids, dtype=np.uint64))
            if self.user_ids.shape != (self.n_users,):
                raise ValueError("user_ids needs one id per user")

    @property
    def n_users(self) -> int:
        return len(self.offsets) - 1

    @property
    def sizes(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def owners(self) -> np.ndarray:
        """Index of the user holding each pair (``owners_of``)."""
        return owners_of(self.offsets)

    def subset(self, mask: np.ndarray) -> UserBatch:
        """The users where ``mask`` is true, in order (same batch id)."""
        mask = np.asarray(mask, dtype=bool)
        sizes = self.sizes[mask]
        pairs = np.repeat(mask, self.sizes)
        return UserBatch(np.concatenate([[0], np.cumsum(sizes)]), self.keys[pairs], self.values[pairs],
                         self.batch_id, None if self.user_ids is None else self.user_ids[mask])

    def take(self, index: np.ndarray) -> UserBatch:
        """Users ``index[0], index[1], …`` (repeats allowed), in that order."""
        index = np.asarray(index, dtype=np.int64)
        sizes = self.sizes[index]
        starts = np.repeat(self.offsets[:-1][index], sizes)
        pairs = starts + np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        return UserBatch(np.concatenate([[0], np.cumsum(sizes)]), self.keys[pairs], self.values[pairs],
                         self.batch_id, None if self.user_ids is None else self.user_ids[index])

    def rows(self, start: int, stop: int, batch_id: int | None = None) -> UserBatch:
        """Users ``start … stop-1`` (views of this batch's arrays), as batch
        ``batch_id`` (by default this one's)."""
        lo, hi = self.offsets[start], self.offsets[stop]
        return UserBatch(self.offsets[start:stop + 1] - lo, self.keys[lo:hi], self.values[lo:hi],
                         self.batch_id if batch_id is None else batch_id,
                         None if self.user_ids is None else self.user_ids[start:stop])

    def with_ids(self, user_ids) -> UserBatch:
        """The same users with stable ids ``user_ids``."""
        return dataclasses.replace(self, user_ids=user_ids)

    @classmethod
    def single_pair(cls, keys, values, batch_id: int = 0) -> UserBatch:
        """One pair per user."""
        keys = np.asarray(keys)
        return cls(np.arange(len(keys) + 1), keys, values, batch_id)

    @classmethod
    def concat(cls, batches: Sequence[UserBatch], batch_id: int = 0) -> UserBatch:
        sizes = np.concatenate([b.sizes for b in batches]) if batches else np.zeros(0, np.int64)
        ids = None
        if batches and all(b.user_ids is not None for b in batches):
            ids = np.concatenate([b.user_ids for b in batches])
        return cls(
            np.concatenate([[0], np.cumsum(sizes)]),
            np.concatenate([b.keys for b in batches]) if batches else np.zeros(0),
            np.concatenate([b.values for b in batches]) if batches else np.zeros(0),
            batch_id, ids,
        )


class Reports(abc.ABC):
    """A batch of randomised reports, one per user, self-describing.

    ``schema`` names the ``kvldp/schemas/*.avsc`` a batch is written with;
    ``records``/``from_records`` convert to and from its records (``shape``:
    what the records alone do not say, e.g. IOH's cell count, from
    ``Protocol.report_shape``). ``batch_id`` is the user batch the reports
    came from (report files are named by it)."""

    schema: ClassVar[str]
    batch_id: int

    @property
    @abc.abstractmethod
    def n_reports(self) -> int:
        """Number of reports (users) in the batch."""

    @abc.abstractmethod
    def records(self) -> Iterator[dict]:
        """One record per report, in the schema ``schema``."""

    @classmethod
    @abc.abstractmethod
    def from_records(cls, records: Sequence[dict], batch_id: int = 0, **shape) -> Reports:
        """Inverse of :meth:`records`."""

    @classmethod
    @abc.abstractmethod
    def empty(cls, batch_id: int = 0, **shape) -> Reports:
        """A batch of no reports."""

    def check_entries(self) -> None:
        """Raise ``ValueError`` on a structure no honest client sends (the
        value checks are the count's own, ``Protocol.check_reports``). A
        batch of fixed-width fields (OLH's, IOH's packed bits) has none."""
        return

    def columns(self) -> dict[str, np.ndarray]:
        """The batch as named arrays (``report_columns.avsc``): every array
        field, in declaration order. Types whose arrays hold redundancy
        (CSR offsets) override it with a denser form."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                if isinstance(getattr(self, f.name), np.ndarray)}

    @classmethod
    def from_columns(cls, columns: dict[str, np.ndarray], batch_id: int = 0, **shape) -> Reports:
        """Inverse of :meth:`columns` (``shape`` as for :meth:`from_records`)."""
        return cls(**columns, batch_id=batch_id, **shape)

    @classmethod
    def concat_columns(cls, parts: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        """Columns of several chunks as the columns of one (row-wise arrays
        are concatenated; :meth:`columns` must keep them row-aligned)."""
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    def rows(self, start: int, stop: int) -> Reports:
        """Reports ``start:stop`` of the batch (for writing in chunks)."""
        columns = self.columns()
        return self.from_columns({k: v[start:stop] for k, v in columns.items()}, self.batch_id,
                                 **self.shape())

    def shape(self) -> dict:
        """What the arrays alone do not say (``Protocol.report_shape``): none by default."""
        return {}

    def equals(self, other: Reports) -> bool:
        """Same type and the same arrays, bit for bit."""
        if type(self) is not type(other):
            return False
        return all(np.array_equal(getattr(self, f.name), getattr(other, f.name))
                   for f in dataclasses.fields(self) if f.name != "batch_id")


@dataclasses.dataclass(frozen=True)
class ReportBatch(Reports):
    """A batch of sparse reports (``report.avsc``).

    Each report is a list of ``(position, symbol)`` entries:
    ``positions[offsets[i]:offsets[i+1]]`` with a small ``int8`` symbol per
    entry in ``symbols`` whose meaning is the mechanism's (PCKV: the value's
    sign; PrivKV/KVUE: state - 1; F2M: ±(1 + key bit); KVOH: a 3-bit mask). PCKV-UE
    sends the non-zero entries of its ternary vector (positions sorted, so
    the list order says nothing about which key was sampled); PCKV-GRR sends
    exactly one entry.
    """

    schema: ClassVar[str] = "report"

    offsets: np.ndarray
    positions: np.ndarray
    symbols: np.ndarray
    batch_id: int = 0

    def __post_init__(self):
        object.__setattr__(self, "offsets", np.asarray(self.offsets, dtype=np.int64))
        object.__setattr__(self, "positions", np.asarray(self.positions, dtype=np.int32))
        object.__setattr__(self, "symbols", np.asarray(self.symbols, dtype=np.int8))
        if self.offsets[-1] != len(self.positions) or len(self.positions) != len(self.symbols):
            raise ValueError("offsets[-1], len(positions) and len(symbols) must agree")

    @property
    def n_reports(self) -> int:
        return len(self.offsets) - 1

    def check_entries(self) -> None:
        """Refuse entries no honest client sends: every client lists a
        position at most once, in increasing order (one entry for the GRR
        kinds). A crafted report that lists key ``k`` 10,000 times would add
        10,000 to ``k``'s count -- one device moving ``f_k`` as 10,000 users
        could; with this check one report adds at most 1 to any count, the
        bound ``docs/reliability.md`` states. O(entries), vectorised."""
        sizes = np.diff(self.offsets)
        if self.offsets[0] != 0 or np.any(sizes < 0):
            raise ValueError("report offsets must start at 0 and never decrease")
        steps = np.diff(self.positions)
        within = np.ones(len(steps), dtype=bool)
        ends = self.offsets[1:-1] - 1                 # a report's last entry: the step after it starts the next
        within[ends[(ends >= 0) & (ends < len(steps))]] = False
        if np.any(steps[within] <= 0):
            raise ValueError("a report lists a position twice or out of order: no client sends that")

    @classmethod
    def concat(cls, batches: Sequence[ReportBatch], batch_id: int = 0) -> ReportBatch:
        sizes = np.concatenate([np.diff(b.offsets) for b in batches])
        return cls(
            np.concatenate([[0], np.cumsum(sizes)]),
            np.concatenate([b.positions for b in batches]),
            np.concatenate([b.symbols for b in batches]),
            batch_id,
        )

    @classmethod
    def empty(cls, batch_id: int = 0, **shape) -> ReportBatch:
        return cls(np.zeros(1, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int8), batch_id)

    def columns(self) -> dict[str, np.ndarray]:
        """``sizes`` (entries per report) instead of the offsets: one small
        number per report, and row-aligned; positions and symbols as they are."""
        return {"sizes": np.diff(self.offsets), "positions": self.positions, "symbols": self.symbols}

    @classmethod
    def from_columns(cls, columns: dict[str, np.ndarray], batch_id: int = 0, **shape) -> ReportBatch:
        sizes = np.asarray(columns["sizes"], dtype=np.int64)
        if len(sizes) and sizes.min() < 0:
            raise ValueError("a report with a negative number of entries")
        return cls(np.concatenate([[0], np.cumsum(sizes)]), columns["positions"], columns["symbols"], batch_id)

    @classmethod
    def concat_columns(cls, parts: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
        return {name: np.concatenate([p[name] for p in parts]) for name in ("sizes", "positions", "symbols")}

    def rows(self, start: int, stop: int) -> ReportBatch:
        lo, hi = self.offsets[start], self.offsets[stop]
        return ReportBatch(self.offsets[start:stop + 1] - lo, self.positions[lo:hi], self.symbols[lo:hi],
                           self.batch_id)

    def records(self) -> Iterator[dict]:
        offsets = self.offsets.tolist()
        positions = self.positions.tolist()
        symbols = self.symbols.tobytes()
        for i in range(self.n_reports):
            lo, hi = offsets[i], offsets[i + 1]
            yield {"positions": positions[lo:hi], "symbols": symbols[lo:hi]}

    @classmethod
    def from_records(cls, records: Iterable[dict], batch_id: int = 0, **shape) -> ReportBatch:
        """Validates entry counts; symbols are checked by the mechanism's
        ``accumulate`` (their meaning is its own)."""
        sizes, positions, symbols = [], [], []
        for r in records:
            pos, sym = r["positions"], r["symbols"]
            if len(pos) != len(sym):
                raise ValueError("report with different numbers of positions and symbols")
            sizes.append(len(pos))
            positions.extend(pos)
            symbols.append(sym)
        return cls(np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]), np.asarray(positions, dtype=np.int32),
                   np.frombuffer(b"".join(symbols), dtype=np.int8), batch_id)


# Why a key's estimate or standard error is null (``Estimates.*_status``).
STATUS_OK = "ok"                       # estimate and standard error given
STATUS_NO_REPORTS = "no_reports"       # no report carried the key: estimate and s.e. null
STATUS_FREQUENCY_NOT_POSITIVE = "frequency_not_positive"   # mean only: estimated holders <= 0
STATUS_NOT_CANDIDATE = "not_candidate"  # KS-GRR/KS-Adap: key outside the candidate set
STATUS_LATER_ROUND = "later_round"     # a multi-round protocol estimates it in a later round
STATUS_BIASED = "biased"               # mean only: estimate given (biased), s.e. null
# post-processed output only: estimate given, interval null -- the key's reports do not
# bound its value more tightly than its whole range (a printed interval would be vacuous)
STATUS_UNINFORMATIVE = "uninformative"
# post-processed output only, frequency: estimate, s.e. and interval given, divided by the share of
# the pairs' mass that padding-and-sampling kept (``Estimates.kept_share``, truncation.py)
STATUS_TRUNCATED = "truncated"
STATUSES = (STATUS_OK, STATUS_NO_REPORTS, STATUS_FREQUENCY_NOT_POSITIVE, STATUS_NOT_CANDIDATE,
            STATUS_LATER_ROUND, STATUS_BIASED, STATUS_UNINFORMATIVE, STATUS_TRUNCATED)


def owners_of(offsets: np.ndarray) -> np.ndarray:
    """Row of each entry of a CSR layout (``offsets``: ``n + 1`` row starts):
    ``np.repeat(np.arange(n), np.diff(offsets))``, the same ``int64`` array.

    ``np.repeat`` with a count per row holds the GIL in a per-row loop:
    0.57 ms for 50,000 single-pair users, while the local runner's two
    workers perturb batches side by side in threads. Rows of one entry each
    (every synthetic single-pair batch) are ``arange(n)``, 36 us; otherwise a
    row boundary at each offset, counted and summed up (a zero-size row adds
    its boundary twice), 0.11 ms for 50,000 rows of 0-4 entries."""
    offsets = np.asarray(offsets, dtype=np.int64)
    n, total = len(offsets) - 1, int(offsets[-1])
    if one_entry_each(offsets):
        return np.arange(n, dtype=np.int64)
    return np.cumsum(np.bincount(offsets[1:-1], minlength=total + 1)[:total], dtype=np.int64)


def one_entry_each(offsets: np.ndarray) -> bool:
    """Whether a CSR layout (``n + 1`` row starts) has exactly one entry in
    every row, as every synthetic single-pair batch has: entry ``i`` is then
    row ``i``'s (an O(n) check; the lookups it spares are sorts and searches)."""
    n = len(offsets) - 1
    return int(offsets[-1]) == n and np.array_equal(offsets, np.arange(n + 1))


def status_array(d: int, fill: str = STATUS_OK) -> np.ndarray:
    return np.full(d, fill, dtype=object)


@dataclasses.dataclass(frozen=True)
class Estimates:
    """Calibrated per-key estimates (arrays of length d).

    ``frequency``/``mean``: the main estimates. As a mechanism's
    ``estimate`` returns them (``postprocess`` None, written as ``raw``)
    they are the paper's estimator with its counts/ratios clipped into the
    valid range; ``postprocess.postprocess`` replaces them by a
    post-processed estimate and names it in ``postprocess`` (``raw``
    changes no array). ``frequency_raw``/``mean_raw`` always hold the
    paper's unclipped estimates (NaN only where its formula is 0/0 or the key
    is not estimated at all) and ``*_se`` their standard errors: the s.d. of
    the paper's raw estimator, evaluated where it is positive (the estimates
    clipped into the model's range, never at an empty cell), so an estimate
    computed from noisy counts never has s.e. 0 -- not the error of a
    post-processed main estimate, which borrows from the other keys.
    ``frequency_lo/hi``, ``mean_lo/hi``: the 95 % intervals for the truth
    that go with the main estimates (set by ``postprocess``: the paper's
    ``raw ± 1.96 s.e.`` for ``raw``, else the likelihood-ratio intervals of
    ``intervals.py``); None until then.

    NaN marks "null": a key whose frequency or mean cannot be estimated
    (``*_status`` says why, one of ``STATUSES``; ``ok`` where the estimate
    and its s.e. / interval are given). ``mean_status == "biased"`` (the
    PrivKV family's paper estimator): the mean is given but its s.e. is NaN
    -- the estimator is biased towards the fake values by several of its own
    s.d., so no s.e. would make an interval that covers the truth.
    ``"uninformative"`` (post-processed only): the mean is given, its
    interval null -- the key's reports bound it no better than ``[-1, 1]``.

    ``count_model``: the mechanism's model of the counts behind the
    estimates (``countmodel.py``), what post-processing needs; None for the
    mechanisms without one (multi-round protocols, IOH).

    ``padding``/``kept_share``: a mechanism that samples one pair per user
    (padding-and-sampling at ``l = padding``; KS-GRR's one pair, ``l = 1``)
    reports a share ``kept_share`` of the pairs' frequency mass when users
    hold more than ``l`` pairs; the arrays here are the paper's estimates of
    that kept mass, and ``postprocess`` divides the frequencies by it as
    its last step (``truncation.py``; frequency status ``truncated``).

    ``frequency_total``/``_se``: an unbiased estimate of the keys' frequencies'
    sum from reports their own estimates do not use, and its s.e. (PCKV's
    and KS-UE's dummy keys; KS-GRR's round 1), else None
    (``consistency.measured_total``).
    """

    frequency: np.ndarray
    mean: np.ndarray
    frequency_raw: np.ndarray
    mean_raw: np.ndarray
    frequency_se: np.ndarray
    mean_se: np.ndarray
    n_reports: int
    mechanism: str
    epsilon: float
    frequency_status: np.ndarray | None = None
    mean_status: np.ndarray | None = None
    count_model: CountModel | None = dataclasses.field(default=None, repr=False, compare=False)
    frequency_lo: np.ndarray | None = None
    frequency_hi: np.ndarray | None = None
    mean_lo: np.ndarray | None = None
    mean_hi: np.ndarray | None = None
    postprocess: str | None = None
    padding: int | None = None
    kept_share: float = 1.0
    frequency_total: float | None = None
    frequency_total_se: float | None = None

    def __post_init__(self):
        checked_kept_share(self.kept_share)
        total, se = self.frequency_total, self.frequency_total_se
        if (total is None) != (se is None) or not np.isfinite((total or 0) + (se or 0)):
            raise ValueError(f"frequency_total and its s.e. go together, finite (got {total}, {se})")
        for name in ("frequency_status", "mean_status"):
            value = getattr(self, name)
            if value is None:
                value = status_array(len(self.frequency))
            value = np.asarray(value, dtype=object)
            if value.shape != (len(self.frequency),):
                raise ValueError(f"{name} needs one status per key")
            object.__setattr__(self, name, value)

    @property
    def d(self) -> int:
        return len(self.frequency)


def null_where(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """``values`` as float with NaN (null) where ``mask``."""
    return np.where(mask, np.nan, np.asarray(values, dtype=np.float64))


def with_statuses(frequency, mean, frequency_raw, mean_raw, frequency_se, mean_se, *, n_reports, mechanism,
                  epsilon, no_reports=None, mean_not_estimable=None, mean_biased: bool = False,
                  frequency_status=None, mean_status=None, count_model: CountModel | None = None,
                  padding: int | None = None, kept_share: float = 1.0, frequency_total: float | None = None,
                  frequency_total_se: float | None = None) -> Estimates:
    """An ``Estimates`` with the nulls and statuses of the common cases.

    ``no_reports``: keys no report carried (frequency and mean null);
    ``mean_not_estimable``: keys whose estimated frequency is <= 0 (mean
    null); ``mean_biased``: the mechanism's mean estimator is biased (mean s.e.
    null everywhere). ``frequency_status``/``mean_status``: statuses set
    before (kept where not ``ok``), e.g. ``not_candidate``. ``count_model``:
    the mechanism's model of the counts behind the estimates, for
    post-processing (``countmodel.py``). ``padding``/``kept_share``: the
    sampling's ``l`` and the share of the pairs' mass it kept; ``frequency_total``/``_se``
    (``Estimates``; default: a count model's ``independent_total``)."""
    d = len(frequency)
    fs = status_array(d) if frequency_status is None else np.array(frequency_status, dtype=object)
    ms = status_array(d) if mean_status is None else np.array(mean_status, dtype=object)
    none = np.zeros(d, dtype=bool)
    no_reports = none if no_reports is None else np.asarray(no_reports, dtype=bool)
    not_est = none if mean_not_estimable is None else np.asarray(mean_not_estimable, dtype=bool)
    ok_f, ok_m = fs == STATUS_OK, ms == STATUS_OK
    fs[ok_f & no_reports] = STATUS_NO_REPORTS
    ms[ok_m & no_reports] = STATUS_NO_REPORTS
    ms[(ms == STATUS_OK) & not_est] = STATUS_FREQUENCY_NOT_POSITIVE
    f_null = fs != STATUS_OK
    m_null = (ms != STATUS_OK) & (ms != STATUS_BIASED)
    if mean_biased:
        ms[ms == STATUS_OK] = STATUS_BIASED
    se_m_null = ms != STATUS_OK
    model = count_model
    if frequency_total is None and model is not None and model.independent_total and model.total_variance:
        frequency_total, frequency_total_se = float(model.total), float(np.sqrt(model.total_variance))
    return Estimates(
        frequency=null_where(frequency, f_null), mean=null_where(mean, m_null),
        frequency_raw=np.asarray(frequency_raw, dtype=np.float64), mean_raw=np.asarray(mean_raw, dtype=np.float64),
        frequency_se=null_where(frequency_se, f_null), mean_se=null_where(mean_se, se_m_null),
        n_reports=int(n_reports), mechanism=mechanism, epsilon=float(epsilon),
        frequency_status=fs, mean_status=ms, count_model=count_model, padding=padding, kept_share=float(kept_share),
        frequency_total=frequency_total, frequency_total_se=frequency_total_se)


MAX_EPSILON = 30.0


def validated_domain(d: int, epsilon: float) -> tuple[int, float]:
    """``(d, epsilon)`` checked: at least one key, ``0 < epsilon <= MAX_EPSILON``."""
    if int(d) < 1:
        raise ValueError(f"the key domain needs at least one key, got d={d}")
    if not np.isfinite(epsilon) or epsilon <= 0:
        raise ValueError(f"epsilon must be a positive finite number, got {epsilon}")
    if epsilon > MAX_EPSILON:
        # e^eps overflows float64 near 709, and well before that every
        # perturbation probability rounds to 0 or 1 (no privacy at all).
        raise ValueError(f"epsilon {epsilon} is beyond {MAX_EPSILON}: the perturbation would be deterministic")
    return int(d), float(epsilon)
