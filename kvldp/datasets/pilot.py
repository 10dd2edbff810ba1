"""A pilot population: users shaped like the ones a collector expects.

``kvldp advise`` measures each candidate mechanism on users with the
operator's domain ``d`` and set-size histogram, before any real data
exists. Keys follow a Zipf(s) popularity (``w_k ∝ 1/k^s``, the
``synthetic-multi`` model; s = 1 is the usual rating-data fit) and each
user's set is a weighted sample without replacement: successive draws
from ``w``, a key already held drawn again, which is the same law as
``synthetic-multi``'s Gumbel top-k but costs O(|S| log d) a user instead
of O(d) (a 340,542-key domain). A key's values are ``m_k + N(0, spread)``
clipped to [-1, 1], ``m_k`` uniform.
"""
from __future__ import annotations

import numpy as np

from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.privacy.randomness import STREAM_DATA, STREAM_DATA_SETUP, batch_rng

from .base import InMemoryDataset


def zipf_weights(d: int, s: float) -> np.ndarray:
    """Zipf(s) popularity over ``d`` keys, ``w_k ∝ 1/k^s`` (also ``synthetic-multi``'s)."""
    w = 1.0 / np.arange(1, d + 1, dtype=np.float64) ** s
    return w / w.sum()


def weighted_sets(sizes: np.ndarray, weights: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(owner, key)`` of distinct keys, ``sizes[u]`` of them for user ``u``
    (each at most ``len(weights)``), drawn by successive sampling without
    replacement from ``weights``; sorted by owner, then key."""
    d = len(weights)
    sizes = np.minimum(np.asarray(sizes, dtype=np.int64), d)
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    held = np.zeros(0, dtype=np.int64)          # owner * d + key, unique and sorted
    need = sizes.copy()
    while need.any():
        owner = np.repeat(np.arange(len(sizes)), need)
        key = np.minimum(np.searchsorted(cdf, rng.random(len(owner)), side="right"), d - 1)
        held = np.union1d(held, owner * d + key)
        need = sizes - np.bincount(held // d, minlength=len(sizes))
    return held // d, held % d


def pilot_population(n: int, d: int, set_sizes: np.ndarray | None, zipf: float = 1.0, spread: float = 0.3,
                     seed: int = 0) -> InMemoryDataset:
    """``n`` users over ``d`` keys; set sizes drawn from the histogram
    ``set_sizes`` (``set_sizes[k]`` users hold ``k`` pairs; ``None``: one
    pair each)."""
    if n < 1 or d < 1:
        raise ValueError("a pilot needs at least one user and one key")
    rng = batch_rng(seed, 0, STREAM_DATA)
    if set_sizes is None:
        sizes = np.ones(n, dtype=np.int64)
    else:
        hist = np.asarray(set_sizes, dtype=np.float64)
        if hist.sum() <= 0:
            raise ValueError("the set-size histogram has no users")
        sizes = rng.choice(len(hist), size=n, p=hist / hist.sum())
    means = batch_rng(seed, 0, STREAM_DATA_SETUP).uniform(-1.0, 1.0, d)
    owner, keys = weighted_sets(sizes, zipf_weights(d, zipf), rng)
    values = np.clip(means[keys] + rng.normal(0.0, spread, len(keys)), -1.0, 1.0)
    counts = np.bincount(owner, minlength=n)
    users = UserBatch(np.concatenate([[0], np.cumsum(counts)]), keys, values)
    return InMemoryDataset(f"pilot (Zipf {zipf:g}, {n:,} users)", users, [str(k) for k in range(d)],
                           default_padding=1)
