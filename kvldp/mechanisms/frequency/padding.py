"""The padding length ``l`` of padding-and-sampling: what a too-small ``l``
costs, and the rule that chooses it from the users' set sizes.

Padding-and-sampling (PCKV, Gu et al. 2020, §4.1 Alg. 1 and PCKV.md; KSKV,
Zhao et al. 2024, §4.3) makes every user report one pair: a user with set
``S`` reports each of its pairs w.p. ``eta/|S| = 1/max(|S|, l)`` and a dummy
otherwise. The estimator scales the sampled-pair frequency back by ``l``
(PCKV Alg. 4: ``f = ((n1+n2)/n - b) l/(a-b)``; KS-UE and KS-Adap the same),
so a holder ``i`` of key ``k`` contributes ``l/max(|S_i|, l)`` in
expectation:

    E[f_hat_k] = (1/n) sum over holders i of k of  l / max(|S_i|, l).

That is ``f_k`` exactly when no holder has more than ``l`` pairs (the
assumption of PCKV Theorem 4), but a *truncated* user (``|S_i| > l``) counts
only ``l/|S_i|``: on a file where every user rates ``s > l`` items every
frequency comes out scaled by ``l/s`` (half the truth at ``s = 2, l = 1``),
and the mean estimator's denominator ``N = n f/l`` is then off as well.
The variance grows with ``l`` (Theorem 4: the frequency's roughly as
``l^2``), so ``l`` is a trade-off, settled as KSKV §4.3 settles it for
KS-Adap (SPEC.md §4): the smallest ``l >= 1`` that covers a share
``coverage = 0.9`` of the users, i.e.

    l = min{ l >= 1 : #{i : |S_i| <= l} / n >= coverage },

users with no pairs counted (they are never truncated), capped at
``MAX_PADDING`` like KS-Adap's sizes. (**choice**: ">= coverage", so that
``coverage = 1`` means "nobody truncated" on exact counts; KS-Adap's "> 0.9"
is applied to noisy estimates, where a tie has probability zero.)

A set-size histogram is a 1-D ``int64`` array ``h`` with ``h[s]`` = number of
users holding ``s`` pairs; histograms of batches add up (``merge_histograms``),
so any runner can combine them. Everything here is pure NumPy.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterable

import numpy as np

from kvldp.mechanisms.base import UserBatch

DEFAULT_COVERAGE = 0.9
MAX_PADDING = 16          # here and in KS-Adap's choice: beyond, dummies drown every pair


def size_histogram(users: UserBatch | np.ndarray) -> np.ndarray:
    """``h[s]`` = number of users of ``users`` (a batch, or an array of set
    sizes) that hold ``s`` pairs."""
    sizes = users.sizes if isinstance(users, UserBatch) else np.asarray(users, dtype=np.int64)
    if len(sizes) and sizes.min() < 0:
        raise ValueError("set sizes must be >= 0")
    return np.bincount(sizes, minlength=1).astype(np.int64)


def merge_histograms(histograms: Iterable[np.ndarray]) -> np.ndarray:
    """The sum of set-size histograms of any lengths (associative and
    commutative, so usable as a ``CombineGlobally`` function; no input gives
    the empty histogram ``[0]``)."""
    hists = [np.asarray(h, dtype=np.int64) for h in histograms]
    out = np.zeros(max([len(h) for h in hists] + [1]), dtype=np.int64)
    for h in hists:
        out[:len(h)] += h
    return out


def _checked(hist) -> np.ndarray:
    h = np.asarray(hist, dtype=np.int64)
    if h.ndim != 1 or len(h) < 1 or (h < 0).any():
        raise ValueError("a set-size histogram is a non-empty 1-D array of counts >= 0")
    return h


def _checked_l(l: int) -> int:
    if int(l) != l or l < 1:
        raise ValueError(f"padding length l must be a whole number >= 1, got {l}")
    return int(l)


def truncated_users(hist, l: int) -> int:
    """Number of users with ``|S| > l``: their pairs are under-counted."""
    h, l = _checked(hist), _checked_l(l)
    return int(h[l + 1:].sum())


def truncated_fraction(hist, l: int) -> float:
    """Share of users with ``|S| > l`` (0 for an empty histogram)."""
    n = int(_checked(hist).sum())
    return truncated_users(hist, l) / n if n else 0.0


def lost_pair_fraction(hist, l: int) -> float:
    """Expected share of all pairs whose frequency mass is lost at ``l``:
    ``sum_{s > l} h[s] (s - l) / sum_s h[s] s``.

    A truncated user's ``s`` pairs contribute ``s l/s = l`` in expectation
    instead of ``s``, so this is also the relative downward bias of
    ``sum_k f_hat_k`` (0 when nobody holds a pair): ``1 - kept_share``."""
    return 1.0 - kept_share(_checked(hist), l)


def kept_share(hist, l: int) -> float:
    """Share of all pairs' frequency mass that padding-and-sampling at ``l``
    keeps in expectation: ``sum_s h[s] min(s, l) / sum_s h[s] s`` (1 when
    nobody holds a pair), i.e. ``1 - lost_pair_fraction``.

    The truncation correction (``truncation.py``) divides frequencies by it:
    exact when every holder of a key holds as many pairs as the average
    pair's holder (e.g. all users ``s`` pairs: ``E[f_hat] = f l/s``); a key
    held mostly by heavy users stays under-counted, one held by light users
    over-counted."""
    h, l = np.asarray(hist, dtype=np.float64), _checked_l(l)     # counts, or estimated shares (KS-Adap)
    if h.ndim != 1 or len(h) < 1 or (h < 0).any():
        raise ValueError("a set-size histogram is a non-empty 1-D array of counts (or shares) >= 0")
    s = np.arange(len(h))
    pairs = float((h * s).sum())
    return float((h * np.minimum(s, l)).sum() / pairs) if pairs > 0 else 1.0


def covered_fraction(hist, l: int) -> float:
    """Share of users with ``|S| <= l`` (1 for an empty histogram)."""
    h, l = _checked(hist), _checked_l(l)
    n = int(h.sum())
    return int(h[:l + 1].sum()) / n if n else 1.0


def choose_padding(hist, coverage: float = DEFAULT_COVERAGE, max_padding: int = MAX_PADDING) -> int:
    """The smallest ``l >= 1`` with ``#{|S| <= l}/n >= coverage`` (KSKV §4.3's
    rule on exact counts, see the module docstring), at most ``max_padding``;
    1 for an empty histogram (no user to cover)."""
    if not 0 < coverage <= 1:
        raise ValueError(f"coverage must be in (0, 1], got {coverage}")
    h, max_padding = _checked(hist), _checked_l(max_padding)
    n = int(h.sum())
    if n == 0:
        return 1
    share = np.cumsum(h) / n
    # the tolerance absorbs the rounding of shares like 9/10 against 0.9
    first = int(np.argmax(share >= coverage - 1e-12))
    return int(np.clip(first, 1, max_padding))


def expected_frequency(users: UserBatch, d: int, l: int, n: int | None = None) -> np.ndarray:
    """``E[f_hat_k]`` of a padding-and-sampling estimator at ``l`` over the
    users of ``users``: ``(1/n) sum over holders of k of l/max(|S_i|, l)``
    (the module docstring). Equals the true frequency iff no holder is
    truncated. ``n``: the number of users to divide by (default: the batch's)."""
    l = _checked_l(l)
    weight = l / np.maximum(users.sizes, l)
    per_pair = np.repeat(weight, users.sizes)
    n = users.n_users if n is None else n
    return np.bincount(users.keys, weights=per_pair, minlength=d)[:d] / max(n, 1)


@dataclasses.dataclass(frozen=True)
class PaddingCheck:
    """What padding length ``l`` does to users with the set sizes ``hist``,
    and the ``l`` the coverage rule would choose."""

    l: int
    n_users: int
    truncated_users: int
    truncated_fraction: float
    lost_pair_fraction: float
    coverage: float
    suggested: int
    suggested_covers: float
    largest_size: int

    @property
    def too_small(self) -> bool:
        """``l`` truncates more than ``1 - coverage`` of the users (the rule
        would choose a larger ``l``, unless it is capped)."""
        return self.truncated_fraction > 1.0 - self.coverage + 1e-12


def check_padding(hist, l: int, coverage: float = DEFAULT_COVERAGE,
                  max_padding: int = MAX_PADDING) -> PaddingCheck:
    """``PaddingCheck`` of ``l`` on the set-size histogram ``hist``."""
    h = _checked(hist)
    suggested = choose_padding(h, coverage, max_padding)
    nonzero = np.flatnonzero(h)
    return PaddingCheck(
        l=_checked_l(l), n_users=int(h.sum()), truncated_users=truncated_users(h, l),
        truncated_fraction=truncated_fraction(h, l), lost_pair_fraction=lost_pair_fraction(h, l),
        coverage=float(coverage), suggested=suggested, suggested_covers=covered_fraction(h, suggested),
        largest_size=int(nonzero[-1]) if len(nonzero) else 0)
