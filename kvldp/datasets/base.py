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
from kvldp.mechanisms.privacy.randomness import STREAM_DATA_SETUP, batch_rng


def batch_specs(n_users: int, batch_size: int = DEFAULT_BATCH_SIZE):
    """``[(batch_id, start, stop), …]`` covering ``n_users``."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    return [(i, s, min(s + batch_size, n_users)) for i, s in enumerate(range(0, n_users, batch_size))]


class NumberedKeys(Sequence):
    """The key names ``"0" … "d-1"``, made on access: a synthetic domain's
    dictionary without a list of d strings (69 MB at d = 10^6, and one per
    caller and per pipeline stage before). Compares equal to any sequence of
    the same names; a slice is a list."""

    def __init__(self, d: int):
        self._d = int(d)

    def __len__(self) -> int:
        return self._d

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [str(k) for k in range(self._d)[i]]
        return str(range(self._d)[i])

    def __iter__(self):
        return map(str, range(self._d))

    def __contains__(self, name) -> bool:
        return isinstance(name, str) and name.isdigit() and str(int(name)) == name and int(name) < self._d

    def index(self, name, start: int = 0, stop: int | None = None) -> int:
        stop = self._d if stop is None else stop
        if name in self and start <= int(name) < stop:
            return int(name)
        raise ValueError(f"{name!r} is not a key name")

    def __eq__(self, other):
        if isinstance(other, NumberedKeys):
            return len(other) == self._d
        return isinstance(other, Sequence) and not isinstance(other, str) and len(other) == self._d \
            and all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self):
        return hash((NumberedKeys, self._d))

    def __repr__(self) -> str:
        return f"NumberedKeys({self._d})"

    def __reduce__(self):
        return NumberedKeys, (self._d,)


class Dataset:
    """Base: ``d`` keys named ``key_names``, ``n_users`` users in batches."""

    name: str = "dataset"
    d: int
    n_users: int
    default_padding: int = 1
    rating_range: tuple[float, float] | None = None     # the ratings' own scale, mapped onto [-1, 1]
    # batches computed from the dataset's parameters, which is all it pickles as (so a job may make
    # them again where it needs them rather than keep them)
    generated = False

    @property
    def key_names(self) -> Sequence[str]:
        return NumberedKeys(self.d)

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
        """Users ``start … stop-1``; their ids are the loaded users' own, or
        their index in the dataset."""
        users = self.users.rows(start, stop, batch_id)
        return users if users.user_ids is not None else users.with_ids(np.arange(start, stop))


def _gather_pairs(offsets: np.ndarray, pick: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Pair indices of users ``pick`` in order, without a Python loop."""
    starts = np.repeat(offsets[pick], sizes)
    within = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return starts + within


