"""The two layers' draws: memoised permanent reports from each device's
permanent uniforms (memo.py), instantaneous re-randomisation from a fresh
per-collection generator (layers.py gives the parameters).

Every permanent draw of a user reads that user's stream only, at fixed
positions, so it is a function of (device secret, state, configuration)
alone -- not of the batch it sits in, the other users, the runner or the
collection. Stream layout (uniform index: use):

* ``U[0]``: padding-and-sampling's slot (PCKV, KS-UE; PCKV Alg. 1) or the
  uniformly sampled key ``j = floor(U[0] d)`` (KVUE; SPEC.md §2) -- memoised,
  so repeated reports never reveal more of the key set than one does;
* ``U[1]``: which dummy key; ``U[2]``: ``Disc(v)`` (``+1`` iff ``U[2] < (1+v)/2``);
* ``U[3] … U[7]``: the randomiser's fixed draws (below);
* ``U[8 + 2i]``, ``U[9 + 2i]``: UE's ``i``-th gap between non-zero
  "other" positions (``Geometric(b)``, inverse CDF) and that position's sign.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

from kvldp.mechanisms.base import ReportBatch, UserBatch, owners_of
from kvldp.mechanisms.frequency.sampling import canonical_pairs, pick_padded_pair
from kvldp.mechanisms.kv.pckv import PCKVParams
from kvldp.mechanisms.privacy.memo import MemoStreams
from kvldp.mechanisms.privacy.randomness import bernoulli_positions

FIXED_COLUMNS = 8
FIRST_GAP_BLOCK = FIXED_COLUMNS // 2


def _sign(u: np.ndarray) -> np.ndarray:
    return np.where(u < 0.5, 1, -1).astype(np.int8)


def by_key(users: UserBatch) -> UserBatch:
    """The same users with each one's pairs sorted by key: the canonical
    order of ``c(S)`` (memo.py)."""
    order = np.lexsort((users.keys, users.owners))
    if np.array_equal(order, np.arange(len(order))):
        return users
    return dataclasses.replace(users, keys=users.keys[order], values=users.values[order])


def memo_padded_pair(users: UserBatch, d: int, l: int, U: np.ndarray):
    """Memoised padding-and-sampling: ``(keys, x)`` from ``U[:, 0:3]``.
    Slot ``r`` names the ``r``-th pair *by key* (``by_key``), so the choice is a
    function of the state, not of the order a source lists the pairs in: the
    memo key ``mu_u(S)`` is order-free, and the same uniforms over another
    order would pick another pair -- a second key of an unchanged state."""
    keys, values = pick_padded_pair(by_key(users), d, l, U[:, 0], np.floor(U[:, 1] * l).astype(np.int64))
    return keys, np.where(U[:, 2] < (1.0 + values) / 2.0, 1, -1).astype(np.int8)


def permanent_grr_pairs(users: UserBatch, P: PCKVParams, streams: MemoStreams) -> ReportBatch:
    """PCKV-GRR's randomiser (PCKV §4.3) on the memoised pair: keep the key
    iff ``U[3] < a`` (value ``x`` iff ``U[4] < p``), else the ``U[5]``-th of
    the ``d'-1`` other keys with sign by ``U[6]``."""
    n, dp = users.n_users, P.d_prime
    U = streams.columns(FIXED_COLUMNS)
    keys, x = memo_padded_pair(users, P.d, P.l, U)
    keep = U[:, 3] < P.a
    other = np.floor(U[:, 5] * (dp - 1)).astype(np.int64)
    other += other >= keys
    kept_sign = np.where(U[:, 4] < P.p, x, -x)
    return ReportBatch(np.arange(n + 1), np.where(keep, keys, other),
                       np.where(keep, kept_sign, _sign(U[:, 6])).astype(np.int8), users.batch_id)


def memo_bernoulli(streams: MemoStreams, total: int, prob: float):
    """Per user, the sorted slots in ``[0, total)`` of i.i.d. Bernoulli(prob)
    successes and a fair sign each, from the user's own stream: gap ``i`` is
    ``floor(ln(1 - U[8+2i]) / ln(1 - prob)) + 1`` (``Geometric(prob)`` by the
    inverse CDF), its sign by ``U[9+2i]``. Returns ``(owners, slots, signs)``
    sorted by ``(owner, slot)``; the work is ``O(total prob)`` per user."""
    n = streams.n_users
    empty = (np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int8))
    if total <= 0 or prob <= 0 or n == 0:
        return empty
    log_q = math.log1p(-prob) if prob < 1 else -np.inf
    mean = total * prob
    chunk = int(mean + 6.0 * math.sqrt(mean * (1.0 - prob)) + 8)
    active = np.arange(n)
    last = np.full(n, -1.0)
    drawn = 0
    owners, slots, signs = [], [], []
    while len(active):
        m = len(active)
        blocks = FIRST_GAP_BLOCK + drawn + np.arange(chunk)
        u = streams.blocks_at(np.repeat(active, chunk), np.tile(blocks, m)).reshape(m, chunk, 2)
        gaps = np.floor(np.log1p(-u[:, :, 0]) / log_q) + 1.0 if prob < 1 else np.ones((m, chunk))
        pos = last[active][:, None] + np.cumsum(gaps, axis=1)
        inside = pos < total
        owners.append(np.repeat(active, chunk).reshape(m, chunk)[inside])
        slots.append(pos[inside].astype(np.int64))
        signs.append(_sign(u[:, :, 1][inside]))
        last[active] = np.minimum(pos[:, -1], float(total))
        active = active[pos[:, -1] < total - 1]
        drawn += chunk
    if len(owners) == 1:               # one pass: already in (owner, slot) order
        return owners[0], slots[0], signs[0]
    owners, slots, signs = (np.concatenate(a) for a in (owners, slots, signs))
    order = np.lexsort((slots, owners))
    return owners[order], slots[order], signs[order]


def permanent_ue(users: UserBatch, P: PCKVParams, streams: MemoStreams) -> ReportBatch:
    """PCKV-UE's / KS-UE's randomiser (PCKV §4.2) on the memoised pair: the
    sampled position is ``x`` iff ``U[3] < a p``, ``-x`` iff ``a p <= U[3] < a``,
    else 0; each of the ``d'-1`` other positions is non-zero w.p. ``b`` with a
    fair sign (``memo_bernoulli``)."""
    n, dp = users.n_users, P.d_prime
    U = streams.columns(FIXED_COLUMNS)
    keys, x = memo_padded_pair(users, P.d, P.l, U)
    own = np.where(U[:, 3] < P.a * P.p, x, np.where(U[:, 3] < P.a, -x, 0)).astype(np.int8)
    owners, slots, signs = memo_bernoulli(streams, dp - 1, P.b)
    positions = slots + (slots >= keys[owners])
    nz = np.flatnonzero(own)
    flat = np.concatenate([owners * dp + positions, nz * dp + keys[nz]])
    symbols = np.concatenate([signs, own[nz]])
    return _sparse_reports(flat, symbols, n, dp, users.batch_id)


def permanent_states(users: UserBatch, d: int, p: float, streams: MemoStreams) -> ReportBatch:
    """KVUE's randomiser (SPEC.md §2) on the memoised key ``j = floor(U[0] d)``:
    the state ``key_bit Disc(v) + 1`` (``Disc`` by ``U[2]``) kept iff
    ``U[3] < p``, else the other state ``state + 1 + floor(2 U[4])`` (mod 3).
    Symbol ``state - 1``."""
    n = users.n_users
    U = streams.columns(FIXED_COLUMNS)
    j = np.minimum(np.floor(U[:, 0] * d).astype(np.int64), d - 1)
    held, values = canonical_pairs(users, d, j)
    s = np.where(held, np.where(U[:, 2] < (1.0 + values) / 2.0, 2, 0), 1)
    shift = 1 + np.floor(U[:, 4] * 2).astype(np.int64)
    out = np.where(U[:, 3] < p, s, (s + shift) % 3)
    return ReportBatch(np.arange(n + 1), j, (out - 1).astype(np.int8), users.batch_id)


def _sparse_reports(flat: np.ndarray, symbols: np.ndarray, n: int, width: int, batch_id: int) -> ReportBatch:
    order = np.argsort(flat, kind="stable")
    flat, symbols = flat[order], symbols[order]
    offsets = np.concatenate([[0], np.cumsum(np.bincount(flat // width, minlength=n))])
    return ReportBatch(offsets, flat % width, symbols, batch_id)


# -- the instantaneous layer: fresh per report ---------------------------------

def instant_grr_pairs(reports: ReportBatch, d_prime: int, t: float, rng: np.random.Generator) -> ReportBatch:
    """Keep the permanent pair w.p. ``t``, else a uniformly random pair of
    the ``2 d'`` (L-GRR's second layer over pairs)."""
    n = reports.n_reports
    keep = rng.random(n) < t
    key = rng.integers(0, d_prime, size=n)
    sign = _sign(rng.random(n))
    return ReportBatch(reports.offsets, np.where(keep, reports.positions, key),
                       np.where(keep, reports.symbols, sign).astype(np.int8), reports.batch_id)


def instant_states(reports: ReportBatch, t: float, rng: np.random.Generator) -> ReportBatch:
    """Keep the permanent state w.p. ``t``, else a uniform one of the 3 (L-GRR)."""
    n = reports.n_reports
    keep = rng.random(n) < t
    fresh = rng.integers(-1, 2, size=n)
    return ReportBatch(reports.offsets, reports.positions, np.where(keep, reports.symbols, fresh).astype(np.int8),
                       reports.batch_id)


def instant_ue(reports: ReportBatch, d_prime: int, t: float, rho: float, rng: np.random.Generator) -> ReportBatch:
    """Position by position: keep the permanent symbol w.p. ``t``, else redraw
    it (0 w.p. ``1-rho``, ``±1`` w.p. ``rho/2``). Sparse: a non-zero permanent
    entry stays w.p. ``t + (1-t) rho/2``, flips w.p. ``(1-t) rho/2``, else
    vanishes; a zero one turns ``±1`` w.p. ``(1-t) rho`` (exact Bernoulli
    positions, ``randomness.bernoulli_positions``)."""
    n = reports.n_reports
    owner = owners_of(reports.offsets)
    flat = owner * d_prime + reports.positions.astype(np.int64)
    u = rng.random(len(flat))
    stay, vanish = t + (1 - t) * rho / 2, t + (1 - t) * rho
    alive = u < vanish
    symbols = np.where(u < stay, reports.symbols, -reports.symbols).astype(np.int8)[alive]
    fresh = bernoulli_positions(n * d_prime, (1 - t) * rho, rng)
    at = np.searchsorted(flat, fresh)
    hit = (at < len(flat)) & (flat[np.minimum(at, max(len(flat) - 1, 0))] == fresh) if len(flat) else \
        np.zeros(len(fresh), bool)
    fresh = fresh[~hit]
    fresh_symbols = _sign(rng.random(len(fresh)))
    # two sorted runs: the stable sort (timsort) merges them in linear time
    return _sparse_reports(np.concatenate([flat[alive], fresh]), np.concatenate([symbols, fresh_symbols]),
                           n, d_prime, reports.batch_id)
