"""IOH: indexing one-hot encoding for conditional analysis (Sun et al. 2019
§V, Alg. 6; Sun et al. 2021 "state encoding" with SUE/OUE; SPEC.md §2).

The client encodes *all* ``k`` chosen keys at once: digit ``s_j`` is the state
of its canonical pair for key ``j`` (``<1,-1> -> 0``, ``<0,0> -> 1``,
``<1,+1> -> 2``, each value discretised independently), the index is
``I = sum_j 3^(k-1-j) s_j`` (key 0 is the most significant digit; states
``(2, 1, 0)`` give ``I = 21``), and the one-hot vector of length ``3^k`` is
perturbed by unary encoding: SUE ``p = e^(eps/2)/(e^(eps/2)+1)``, ``q = 1-p``,
or OUE ``p = 1/2``, ``q = 1/(e^eps+1)``. Privacy: ``eps`` (two bits differ).

The report is the perturbed vector, in whichever form is smaller for the
mechanism's ``q`` (a public choice, fixed by ``k`` and eps): **bit-packed**
(``ceil(3^k / 8)`` bytes, most significant bit first, as ``np.packbits``),
or **sparse**, the sorted list of set positions (``ReportBatch``: about
``2 (p + (3^k - 1) q)`` bytes), when ``q < 1/16`` -- OUE above eps = ln 15:
at k = 10, eps = 4 that is ~1,060 positions (2.1 kB) instead of 7.4 kB, and
the collector adds them with one ``bincount`` instead of unpacking 59,049
bits per user. The client draws only the set bits (``Binomial(3^k - 1, q)``
zero bits at uniform positions, as in PCKV-UE); the collector adds either
form into one count vector a batch at a time. Calibration: ``A_s[i] = (C[i] - n q)/(p - q)``,
unbiased for the number of users in cell ``i``, with exact variance
``[N_i p(1-p) + (n - N_i) q(1-q)]/(p-q)^2`` and independent cells.
"""
from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator, Mapping, Sequence
from typing import ClassVar

import numpy as np

from kvldp.mechanisms.base import Estimates, ReportBatch, Reports, UserBatch, owners_of, with_statuses
from kvldp.mechanisms.frequency.oracles import OUE, SUE, skip_items
from kvldp.mechanisms.frequency.sampling import discretise
from kvldp.mechanisms.kv.cells import state_index
from kvldp.mechanisms.kv.query import CellTable
from kvldp.mechanisms.params import Options, option
from kvldp.mechanisms.privacy.randomness import bernoulli_runs
from kvldp.mechanisms.protocol import Mechanism

VARIANTS = ("oue", "sue")
MAX_IOH_KEYS = 10
SPARSE_BELOW_Q = 1 / 16


@dataclasses.dataclass(frozen=True)
class PackedReportBatch(Reports):
    """Bit-packed unary-encoding reports (``ioh_report.avsc``): row ``i``
    holds user ``i``'s vector of ``n_cells`` bits (``np.packbits`` order)."""

    schema: ClassVar[str] = "ioh_report"

    bits: np.ndarray
    n_cells: int
    batch_id: int = 0

    def __post_init__(self):
        object.__setattr__(self, "bits", np.asarray(self.bits, dtype=np.uint8))
        if self.bits.ndim != 2 or self.bits.shape[1] != packed_width(self.n_cells):
            raise ValueError(f"packed reports need shape (n, {packed_width(self.n_cells)}), got {self.bits.shape}")

    @property
    def n_reports(self) -> int:
        return self.bits.shape[0]

    def records(self) -> Iterator[dict]:
        for row in self.bits:
            yield {"bits": row.tobytes()}

    @classmethod
    def from_records(cls, records: Sequence[dict], batch_id: int = 0, *, n_cells: int) -> PackedReportBatch:
        """Rows of equal width: ``ceil(n_cells / 8)`` bytes each."""
        width = packed_width(n_cells)
        raw = b"".join(r["bits"] for r in records)
        if len(raw) != width * len(records):
            raise ValueError(f"IOH reports must be {width} bytes each ({n_cells} cells)")
        return cls(np.frombuffer(raw, dtype=np.uint8).reshape(len(records), width), n_cells, batch_id)

    def shape(self) -> dict:
        return {"n_cells": self.n_cells}

    @classmethod
    def empty(cls, batch_id: int = 0, *, n_cells: int) -> PackedReportBatch:
        return cls(np.zeros((0, packed_width(n_cells)), np.uint8), n_cells, batch_id)


def packed_width(n_cells: int) -> int:
    return (n_cells + 7) // 8


# A dense block's cells (bools), whatever 3^k is: one that stays in the
# core's caches while it is zeroed, scattered into and packed (or unpacked
# and summed). Per user, one batch, 16 MiB blocks against these: packing
# 35.1 -> 19.7 us at k = 10 (4.3 -> 2.5 at k = 8), summing 11.5 -> 8.0 us
# (1.3 -> 0.9); a quarter of these sizes is slower again.
PACK_BLOCK_CELLS = 1 << 20
SUM_BLOCK_CELLS = 1 << 21


def pack_positions(offsets: np.ndarray, positions: np.ndarray, n_cells: int,
                   chunk_rows: int | None = None) -> np.ndarray:
    """Sparse set positions (CSR) -> packed rows, through a dense bool block
    of at most ``chunk_rows`` rows (``np.packbits`` is ~10x faster than
    scattering bit weights); by default as many rows as fit ``PACK_BLOCK_CELLS``
    (4,096 rows were 242 MB of block at k = 10, a fifth of IOH-SUE's batch)."""
    n, width = len(offsets) - 1, packed_width(n_cells) * 8
    out = np.empty((n, packed_width(n_cells)), dtype=np.uint8)
    chunk_rows = chunk_rows or max(1, PACK_BLOCK_CELLS // width)
    for s in range(0, n, chunk_rows):
        e = min(n, s + chunk_rows)
        block = np.zeros((e - s, width), dtype=bool)
        # flat indices: a 1-D scatter is 1.4x faster than numpy's 2-D one
        flat = owners_of(offsets[s:e + 1] - offsets[s])
        flat *= width
        flat += positions[offsets[s]:offsets[e]]
        block.reshape(-1)[flat] = True
        out[s:e] = np.packbits(block, axis=1)
    return out


SUM_ROWS = np.iinfo(np.uint16).max        # rows a block's column sums can count in uint16


def packed_unary_reports(oracle: SUE | OUE, items: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """``oracle.perturb(items, rng)``'s reports packed (``pack_positions``),
    from the same draws, packed a run of set zero-bits at a time
    (``bernoulli_runs``), the kept items' bits set last: never an array of
    every set position (IOH-SUE at k = 10: ~20M a batch, 160 MB that the
    kernel mapped and zero-filled afresh for every batch -- a fifth of the
    job's time -- and two more arrays of them for the positions and the
    kept items inserted among them)."""
    items = np.asarray(items, dtype=np.int64)
    n, width = len(items), oracle.d - 1
    bits = np.zeros((n, packed_width(oracle.d)), dtype=np.uint8)
    for slots in bernoulli_runs(n * width, oracle.q, rng):
        if not len(slots):
            continue
        first, last = int(slots[0]) // width, int(slots[-1]) // width      # the users the run reaches
        np.subtract(slots, first * width, out=slots)       # in place: the run is the slots of users first…last
        starts, _ = skip_items(slots, items[first:last + 1], width)
        bits[first:last + 1] |= pack_positions(starts, slots, oracle.d)     # rows two runs share: OR
    keep = rng.random(n) < oracle.p
    kept = items[keep]
    bits[np.flatnonzero(keep), kept >> 3] |= (0x80 >> (kept & 7)).astype(np.uint8)
    return bits


def bit_sums(bits: np.ndarray, n_cells: int, chunk_rows: int | None = None) -> np.ndarray:
    """Column sums of packed rows, unpacking at most ``chunk_rows`` at a
    time (by default as many as fit ``SUM_BLOCK_CELLS``, and at most
    ``SUM_ROWS``: a block's sums are taken in uint16, 3x faster than in
    int64, and added up in int64)."""
    out = np.zeros(packed_width(n_cells) * 8, dtype=np.int64)
    chunk_rows = min(chunk_rows or max(1, SUM_BLOCK_CELLS // (packed_width(n_cells) * 8)), SUM_ROWS)
    for s in range(0, bits.shape[0], chunk_rows):
        out += np.unpackbits(bits[s:s + chunk_rows], axis=1).sum(axis=0, dtype=np.uint16)
    return out[:n_cells]


def cell_variance(n: float, N_i, p: float, q: float) -> np.ndarray:
    """Exact ``Var A_s[i] = [N_i p(1-p) + (n - N_i) q(1-q)]/(p - q)^2``."""
    N_i = np.asarray(N_i, dtype=np.float64)
    return (N_i * p * (1 - p) + (n - N_i) * q * (1 - q)) / (p - q) ** 2


def calibrate_cells(support, n, p: float, q: float):
    """``A_s = (C - n q)/(p - q)`` and plug-in variances (``N_i`` clipped into ``[0, n]``)."""
    n = float(n)
    A = (np.asarray(support, dtype=np.float64) - n * q) / (p - q)
    return A, cell_variance(n, np.clip(A, 0.0, n), p, q)


@dataclasses.dataclass(frozen=True)
class IOHOptions(Options):
    ioh_keys: tuple | None = option(None, "IOH: the chosen keys, comma-separated names (most significant "
                                    "first); default: the --ioh-top most frequent", low=0, whole=True,
                                    parse=str, metavar="KEYS")


class IOH(Mechanism):
    """IOH over ``k = len(keys)`` chosen keys of a ``d``-key dictionary."""

    name = "ioh"
    report_type = PackedReportBatch

    def __init__(self, d: int, epsilon: float, variant: str = "oue", ioh_keys: Sequence[int] | None = None):
        super().__init__(d, epsilon)
        if variant not in VARIANTS:
            raise ValueError(f"IOH variant must be one of {VARIANTS}, got {variant!r}")
        keys = list(range(min(d, 3))) if ioh_keys is None else [int(k) for k in ioh_keys]
        if not 1 <= len(keys) <= MAX_IOH_KEYS:
            raise ValueError(f"IOH takes 1 … {MAX_IOH_KEYS} keys (3^k cells), got {len(keys)}")
        if len(set(keys)) != len(keys) or min(keys) < 0 or max(keys) >= d:
            raise ValueError(f"IOH keys must be distinct indices in [0, {d}), got {keys}")
        self.variant = variant
        self.ioh_keys = keys
        self.k = len(keys)
        self.n_cells = 3 ** self.k
        self.oracle = (OUE if variant == "oue" else SUE)(self.n_cells, self.epsilon)
        self.p, self.q = self.oracle.p, self.oracle.q
        self.name = f"ioh-{variant}"
        # sparse positions (2 bytes each) beat packed bits (1/8 byte per cell) when q < 1/16
        self.sparse = self.q < SPARSE_BELOW_Q
        self.report_type = ReportBatch if self.sparse else PackedReportBatch

    def report_shape(self, round_index: int = 0) -> dict:
        return {"n_cells": self.n_cells}

    def config(self, round_index: int | None = None) -> Mapping:
        return {**super().config(), "ioh_keys": list(self.ioh_keys)}

    @property
    def report_domain(self) -> int:
        return self.n_cells

    @property
    def estimate_keys(self) -> list[int]:
        return list(self.ioh_keys)

    # -- client -----------------------------------------------------------
    def states(self, users: UserBatch, rng: np.random.Generator) -> np.ndarray:
        """``(n, k)`` states of every user for the chosen keys."""
        column = np.full(self.d, -1, dtype=np.int64)
        column[self.ioh_keys] = np.arange(self.k)
        col = column[users.keys]
        mine = col >= 0
        states = np.ones((users.n_users, self.k), dtype=np.int64)
        states[users.owners[mine], col[mine]] = discretise(users.values[mine], rng) + 1
        return states

    def cells(self, users: UserBatch, rng: np.random.Generator) -> np.ndarray:
        """Each user's cell ``I`` (its states' base-3 index): what the report one-hot encodes."""
        return state_index(self.states(users, rng))

    def perturb(self, users: UserBatch, rng: np.random.Generator) -> Reports:
        cells = self.cells(users, rng)
        if self.sparse:     # symbols carry nothing here: a set position is a 1
            offsets, positions = self.oracle.perturb(cells, rng)
            return ReportBatch(offsets, positions, np.ones(len(positions), dtype=np.int8), users.batch_id)
        return PackedReportBatch(packed_unary_reports(self.oracle, cells, rng), self.n_cells, users.batch_id)

    can_draw_counts = True

    def draw_counts(self, users: UserBatch, rng: np.random.Generator) -> np.ndarray:
        """The batch's bit sums drawn per cell (``_UnaryEncoding.draw_support``)
        from the users' cells: O(3^k) draws where the reports take O(n 3^k q),
        ~7,000 a user for SUE at k = 10, eps = 4."""
        counts = self.new_counts()
        counts[0] = users.n_users
        counts[1:] = self.oracle.draw_support(self.cells(users, rng), rng)
        return counts

    # -- collector --------------------------------------------------------
    @property
    def counts_size(self) -> int:
        return 1 + self.n_cells

    def accumulate(self, counts: np.ndarray, reports) -> np.ndarray:
        """Packed rows, or sparse set positions (``ReportBatch``): either form."""
        if isinstance(reports, PackedReportBatch):
            if reports.n_cells != self.n_cells:
                raise ValueError(f"reports have {reports.n_cells} cells, {self!r} expects {self.n_cells}")
            counts[1:] += bit_sums(reports.bits, self.n_cells)
        elif isinstance(reports, ReportBatch):
            pos = reports.positions
            if len(pos) and (pos.min() < 0 or pos.max() >= self.n_cells):
                raise ValueError(f"report positions outside [0, {self.n_cells})")
            counts[1:] += np.bincount(pos, minlength=self.n_cells)
        else:
            raise TypeError(f"IOH cannot accumulate {type(reports).__name__}")
        counts[0] += reports.n_reports
        return counts

    def cell_counts(self, counts: np.ndarray):
        """``(A_s, Var A_s)``: unbiased cell counts and their plug-in variances."""
        return calibrate_cells(counts[1:], counts[0], self.p, self.q)

    def cell_variance(self, n: float, N_i) -> np.ndarray:
        return cell_variance(n, N_i, self.p, self.q)

    def estimate(self, counts: np.ndarray) -> Estimates:
        """Marginal frequency and mean of each chosen key (the unconditional
        query); conditional ones come from :mod:`mechanisms.query`."""

        table = CellTable.from_counts(self, counts)
        rows = [table.marginal(j) for j in range(self.k)]
        col = lambda i: np.array([r[i] for r in rows])  # noqa: E731
        f_raw = col(2)
        # a mean needs holders: null where the estimated number of holders
        # (the denominator F(k held)) is <= 0; no reports at all: all null
        return with_statuses(col(0), col(1), f_raw, col(3), col(4), col(5), n_reports=int(counts[0]),
                             mechanism=self.name, epsilon=self.epsilon,
                             no_reports=np.full(self.k, counts[0] == 0), mean_not_estimable=~(f_raw > 0))

    def output_probabilities(self, pairs, round_index: int = 0, state=None) -> np.ndarray:
        """Every report ``y in {0,1}^(3^k)`` (``itertools.product`` order) for
        a user holding ``pairs``: ``sum_c P(c) P(y | c)``, where each chosen
        key's state is 1 (lacks it) or, held with value ``v``, 0/2 w.p.
        ``(1 -/+ v)/2`` (cells most significant first, ``state_index``)."""
        held = dict(pairs)
        cell = np.ones(1)
        for key in self.ioh_keys:
            v = held.get(key)
            per_key = np.array([0.0, 1.0, 0.0]) if v is None else np.array([(1 - v) / 2, 0.0, (1 + v) / 2])
            cell = np.outer(cell, per_key).ravel()
        ys = np.array(list(itertools.product((False, True), repeat=self.n_cells)))
        p, q = self.oracle.p, self.oracle.q
        zero_cells = np.where(ys, q, 1 - q)                   # P(y_j | j is not the user's cell)
        return np.prod(zero_cells, axis=1) * ((np.where(ys, p, 1 - p) / zero_cells) @ cell)

    def output_probability(self, cell: int, report_bits: np.ndarray) -> float:
        """P(report | true cell) for one unpacked report (privacy audits)."""
        bits = np.asarray(report_bits, dtype=bool)
        probs = np.where(bits, self.q, 1 - self.q)
        probs[cell] = self.p if bits[cell] else 1 - self.p
        return float(np.prod(probs))


def ioh_factory(variant: str):
    def make(d: int, epsilon: float, ioh_keys: Sequence[int] | None = None) -> IOH:
        return IOH(d, epsilon, variant, ioh_keys)
    make.__name__ = f"ioh_{variant}"
    make.options_type = IOHOptions
    make.can_draw_counts = IOH.can_draw_counts
    return make

