"""What every dataset is: a recipe for ``UserBatch``es.

A dataset is a recipe for ``UserBatch``es: ``batch(batch_id, start, stop)``
builds users ``start … stop-1`` as a pure function of the dataset's seed
and the batch, so a pipeline can generate batches on its workers and a
local run produces exactly the same users.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from kvldp.mechanisms.base import DEFAULT_BATCH_SIZE, UserBatch
from kvldp.mechanisms.randomness import STREAM_DATA_SETUP, batch_rng


def batch_specs(n_users: int, batch_size: int = DEFAULT_BATCH_SIZE):
    """``[(batch_id, start, stop), …]`` covering ``n_users``."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    return [(i, s, min(s + batch_size, n_users)) for i, s in enumerate(range(0, n_users, batch_size))]


class Dataset:
    """Base: ``d`` keys named ``key_names``, ``n_users`` users in batches."""

    name: str = "dataset"
    d: int
    n_users: int
    default_padding: int = 1
    rating_range: tuple[float, float] | None = None     # the ratings' own scale, mapped onto [-1, 1]

    @property
    def key_names(self) -> list[str]:
        return [str(k) for k in range(self.d)]

    def batch(self, batch_id: int, start: int, stop: int) -> UserBatch:
        raise NotImplementedError

    def specs(self, batch_size: int = DEFAULT_BATCH_SIZE):
        return batch_specs(self.n_users, batch_size)

    def batches(self, batch_size: int = DEFAULT_BATCH_SIZE):
        for spec in self.specs(batch_size):
            yield self.batch(*spec)



class InMemoryDataset(Dataset):
    """Users already loaded (a real dataset); batches are slices."""

    def __init__(self, name: str, users: UserBatch, key_names: Sequence[str], default_padding: int = 1,
                 rating_range: tuple[float, float] | None = None):
        self.name = name
        self.rating_range = rating_range
        self.users = users
        self._key_names = list(key_names)
        self.d = len(self._key_names)
        self.n_users = users.n_users
        self.default_padding = default_padding
        if len(users.keys) and (users.keys.min() < 0 or users.keys.max() >= self.d):
            raise ValueError("user keys outside the key dictionary")

    @property
    def key_names(self) -> list[str]:
        return self._key_names

    def resampled(self, n_users: int, seed: int) -> InMemoryDataset:
        """A bootstrap of ``n_users`` users drawn with replacement: large-n
        behaviour with the real data's key/value correlations (labelled)."""
        if n_users < 1:
            raise ValueError("resample to at least one user")
        pick = batch_rng(seed, 0, STREAM_DATA_SETUP).integers(0, self.n_users, size=n_users)
        sizes = self.users.sizes[pick]
        pairs = _gather_pairs(self.users.offsets, pick, sizes)
        users = UserBatch(np.concatenate([[0], np.cumsum(sizes)]), self.users.keys[pairs], self.users.values[pairs])
        return InMemoryDataset(f"{self.name} (bootstrap of {n_users:,} users)", users, self._key_names,
                               self.default_padding, self.rating_range)

    def batch(self, batch_id: int, start: int, stop: int) -> UserBatch:
        lo, hi = self.users.offsets[start], self.users.offsets[stop]
        return UserBatch(self.users.offsets[start:stop + 1] - lo, self.users.keys[lo:hi],
                         self.users.values[lo:hi], batch_id)


def _gather_pairs(offsets: np.ndarray, pick: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Pair indices of users ``pick`` in order, without a Python loop."""
    starts = np.repeat(offsets[pick], sizes)
    within = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return starts + within


