"""Rating data as batches of users: synthetic generators and the Clothing set.

A dataset is a recipe for ``UserBatch``es: ``batch(batch_id, start, stop)``
builds users ``start … stop-1`` as a pure function of the dataset's seed
and the batch, so a pipeline can generate batches on its workers and a
local run produces exactly the same users.

Synthetic settings of the PCKV authors' ``GenData.m`` (PCKV §6, PCKV.md):
one pair per user (``l = 1``), ``d`` keys,

* ``uu``: the key of each user uniform over ``K``; each key's mean uniform
  on ``[-1, 1]``; every holder of key ``k`` holds the value ``m_k``;
* ``gg``: the key from ``N(0, sigma_key = 50)`` discretised onto ``1 … d``
  (samples outside discarded, i.e. a half-normal over the keys); means from
  ``N(0, sigma_mean = 1)`` with samples outside ``[-1, 1]`` discarded.

``multi``: users with ``1 + Poisson(lam)`` distinct keys drawn without
replacement from a Zipf(s) popularity, values ``m_k + N(0, spread)`` clipped
to ``[-1, 1]`` -- the multi-pair setting of padding-and-sampling.

``corr``: a latent-class model with correlated keys and values, for
conditional analysis: each user belongs to one of ``classes`` classes
(weights ``Dirichlet(2)``); in class ``c`` key ``k`` is held independently
w.p. ``pi[c, k] ~ Beta(0.7, 2)`` with value ``mu[c, k] + N(0, spread)``
(``mu ~ U[-1, 1]``), clipped. Holding one key then changes the chances of
holding another, and the values of both, so conditional answers differ
from unconditional ones.
"""
from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Sequence

import numpy as np

from .base import UserBatch
from .randomness import STREAM_DATA, STREAM_DATA_SETUP, batch_rng

SYNTHETIC_KINDS = ("uu", "gg", "multi", "corr")
DEFAULT_BATCH_SIZE = 50_000


def batch_specs(n_users: int, batch_size: int = DEFAULT_BATCH_SIZE):
    """``[(batch_id, start, stop), …]`` covering ``n_users``."""
    if batch_size < 1:
        raise ValueError("batch_size must be >= 1")
    return [(i, s, min(s + batch_size, n_users)) for i, s in enumerate(range(0, n_users, batch_size))]


TRUTH_QUANTUM = 2.0 ** -20


def exact_sums(sums: np.ndarray) -> np.ndarray:
    """``sums`` rounded to multiples of ``2^-20``, so that adding them up is
    exact in float64 (every partial sum below ``2^33`` is representable) and
    the total does not depend on the order a runner merges batches in (two
    Beam workers merge in a different grouping each run). The rounding moves
    a batch's sum by at most ``2^-21``."""
    return np.rint(np.asarray(sums, dtype=np.float64) / TRUTH_QUANTUM) * TRUTH_QUANTUM


def truth_counts(users: UserBatch, d: int) -> np.ndarray:
    """Sufficient statistics of the truth: ``[n, holders[d], value sums[d]]``
    (value sums made order-independent by :func:`exact_sums`)."""
    return np.concatenate([
        [users.n_users],
        np.bincount(users.keys, minlength=d)[:d],
        exact_sums(np.bincount(users.keys, weights=users.values, minlength=d)[:d]),
    ]).astype(np.float64)


def truth_from_counts(counts: np.ndarray, d: int):
    """``(true frequency, true mean)``; the mean is NaN for keys nobody holds."""
    n, holders, sums = counts[0], counts[1:1 + d], counts[1 + d:1 + 2 * d]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.where(holders > 0, sums / holders, np.nan)
    return holders / max(n, 1), mean


class Dataset:
    """Base: ``d`` keys named ``key_names``, ``n_users`` users in batches."""

    name: str = "dataset"
    d: int
    n_users: int
    default_padding: int = 1

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


@dataclasses.dataclass
class SyntheticDataset(Dataset):
    kind: str = "uu"
    n_users: int = 1_000_000
    d: int = 100
    seed: int = 0
    sigma_key: float = 50.0
    sigma_mean: float = 1.0
    lam: float = 1.0
    zipf: float = 1.0
    spread: float = 0.3
    classes: int = 3

    def __post_init__(self):
        if self.kind not in SYNTHETIC_KINDS:
            raise ValueError(f"unknown synthetic kind {self.kind!r}; known: {SYNTHETIC_KINDS}")
        if self.n_users < 1 or self.d < 1:
            raise ValueError("need at least one user and one key")
        self.name = f"synthetic-{self.kind}"
        rng = batch_rng(self.seed, 0, STREAM_DATA_SETUP)
        if self.kind == "gg":
            edges = np.arange(self.d + 1) / self.sigma_key
            cdf = np.array([math.erf(e / math.sqrt(2)) for e in edges])
            self.key_probs = np.diff(cdf) / (cdf[-1] - cdf[0])
            self.key_means = _truncated_normal(rng, self.sigma_mean, self.d)
        elif self.kind == "uu":
            self.key_probs = np.full(self.d, 1.0 / self.d)
            self.key_means = rng.uniform(-1.0, 1.0, self.d)
        elif self.kind == "multi":
            w = 1.0 / np.arange(1, self.d + 1) ** self.zipf
            self.key_probs = w / w.sum()
            self.key_means = rng.uniform(-1.0, 1.0, self.d)
        else:
            self.class_weights = rng.dirichlet(np.full(self.classes, 2.0))
            self.class_hold = rng.beta(0.7, 2.0, size=(self.classes, self.d))
            self.class_means = rng.uniform(-1.0, 1.0, size=(self.classes, self.d))
            self.key_probs = self.class_weights @ self.class_hold
            self.key_means = (self.class_weights[:, None] * self.class_hold * self.class_means).sum(0) / self.key_probs
        self.default_padding = 1 if self.kind in ("uu", "gg") else 2

    def batch(self, batch_id: int, start: int, stop: int) -> UserBatch:
        rng = batch_rng(self.seed, batch_id, STREAM_DATA)
        n = stop - start
        if self.kind == "uu":
            keys = rng.integers(0, self.d, size=n)
            return UserBatch.single_pair(keys, self.key_means[keys], batch_id)
        if self.kind == "gg":
            keys = rng.choice(self.d, size=n, p=self.key_probs)
            return UserBatch.single_pair(keys, self.key_means[keys], batch_id)
        if self.kind == "multi":
            return self._multi(rng, n, batch_id)
        return self._latent_classes(rng, n, batch_id)

    def _latent_classes(self, rng, n, batch_id) -> UserBatch:
        cls = rng.choice(self.classes, size=n, p=self.class_weights)
        held = rng.random((n, self.d)) < self.class_hold[cls]
        owner, keys = np.nonzero(held)                 # row-major: grouped by user, keys sorted
        values = np.clip(self.class_means[cls[owner], keys] + rng.normal(0.0, self.spread, len(keys)), -1.0, 1.0)
        sizes = np.bincount(owner, minlength=n)
        return UserBatch(np.concatenate([[0], np.cumsum(sizes)]), keys, values, batch_id)

    def _multi(self, rng, n, batch_id) -> UserBatch:
        sizes = np.minimum(1 + rng.poisson(self.lam, size=n), self.d)
        logw = np.log(self.key_probs)
        keys = []
        # Gumbel top-k = weighted sampling without replacement, in row chunks
        # so that the (users x d) score matrix stays around 2M entries.
        rows = max(1, 2_000_000 // self.d)
        for s in range(0, n, rows):
            size = sizes[s:s + rows]
            scores = logw[None, :] + rng.gumbel(size=(len(size), self.d))
            top = np.argsort(-scores, axis=1)[:, :size.max()]
            keys.append(top[np.arange(top.shape[1])[None, :] < size[:, None]])
        keys = np.concatenate(keys)
        values = np.clip(self.key_means[keys] + rng.normal(0.0, self.spread, len(keys)), -1.0, 1.0)
        return UserBatch(np.concatenate([[0], np.cumsum(sizes)]), keys, values, batch_id)


def _truncated_normal(rng, sigma, size):
    out = np.empty(0)
    while len(out) < size:
        draw = rng.normal(0.0, sigma, size * 4)
        out = np.concatenate([out, draw[np.abs(draw) <= 1.0]])
    return out[:size]


class InMemoryDataset(Dataset):
    """Users already loaded (a real dataset); batches are slices."""

    def __init__(self, name: str, users: UserBatch, key_names: Sequence[str], default_padding: int = 1):
        self.name = name
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

    def resampled(self, n_users: int, seed: int) -> "InMemoryDataset":
        """A bootstrap of ``n_users`` users drawn with replacement: large-n
        behaviour with the real data's key/value correlations (labelled)."""
        if n_users < 1:
            raise ValueError("resample to at least one user")
        pick = batch_rng(seed, 0, STREAM_DATA_SETUP).integers(0, self.n_users, size=n_users)
        sizes = self.users.sizes[pick]
        pairs = _gather_pairs(self.users.offsets, pick, sizes)
        users = UserBatch(np.concatenate([[0], np.cumsum(sizes)]), self.users.keys[pairs], self.users.values[pairs])
        return InMemoryDataset(f"{self.name} (bootstrap of {n_users:,} users)", users, self._key_names,
                               self.default_padding)

    def batch(self, batch_id: int, start: int, stop: int) -> UserBatch:
        lo, hi = self.users.offsets[start], self.users.offsets[stop]
        return UserBatch(self.users.offsets[start:stop + 1] - lo, self.users.keys[lo:hi],
                         self.users.values[lo:hi], batch_id)


def _gather_pairs(offsets: np.ndarray, pick: np.ndarray, sizes: np.ndarray) -> np.ndarray:
    """Pair indices of users ``pick`` in order, without a Python loop."""
    starts = np.repeat(offsets[pick], sizes)
    within = np.arange(sizes.sum()) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return starts + within


def shared_data_dir() -> Path:
    """``$KVLDP_DATA_DIR``, else ``../shared/data`` beside the checkout or the CWD."""
    env = os.environ.get("KVLDP_DATA_DIR")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parents[2] / "shared" / "data", Path.cwd().parent / "shared" / "data",
                   Path.cwd() / "shared" / "data"]
    for c in candidates:
        if c.is_dir():
            return c
    return candidates[0]


def load_clothing(path: str | os.PathLike | None = None) -> InMemoryDataset:
    """The PCKV paper's Clothing ratings (105,508 users, 5,850 keys; values
    already in ``{-1, -0.5, 0, 0.5, 1}``; default padding ``l = 2``)."""
    from scipy.io import loadmat

    path = Path(path) if path else shared_data_dir() / "clothing_rating.mat"
    if not path.exists():
        raise FileNotFoundError(
            f"Clothing data not found at {path}; pass --dataset-path or set KVLDP_DATA_DIR "
            "to the folder holding clothing_rating.mat")
    mat = loadmat(str(path))
    entries = mat["data"][:, 0]
    d = int(np.asarray(mat["N_key"]).ravel()[0])
    sizes = np.fromiter((e.shape[0] for e in entries), dtype=np.int64, count=len(entries))
    pairs = np.concatenate([np.asarray(e, dtype=np.float64).reshape(-1, 2) for e in entries])
    users = UserBatch(np.concatenate([[0], np.cumsum(sizes)]), pairs[:, 0].astype(np.int64) - 1, pairs[:, 1])
    return InMemoryDataset("clothing", users, [str(k + 1) for k in range(d)], default_padding=2)


def load_movielens_100k() -> InMemoryDataset:
    """MovieLens 100k (943 users, 1,682 movies, 100,000 ratings, 1-5 stars
    mapped linearly onto ``[-1, 1]``), from the file the ``recbole==1.2.1``
    wheel ships (GroupLens's terms: research use, acknowledge, do not
    redistribute). Keys are movie ids in ascending order."""
    import importlib.util

    spec = importlib.util.find_spec("recbole")
    path = None if spec is None else Path(spec.submodule_search_locations[0]) / "dataset_example" / "ml-100k" / "ml-100k.inter"
    if path is None or not path.exists():
        raise FileNotFoundError("MovieLens-100k is not installed; install it with "
                                "`pip install --no-deps recbole==1.2.1` (see shared/data/README.md)")
    table = np.loadtxt(path, delimiter="\t", skiprows=1, usecols=(0, 1, 2))
    users, items, ratings = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2]
    movie_ids, keys = np.unique(items, return_inverse=True)
    order = np.lexsort((keys, users))
    sizes = np.bincount(np.unique(users[order], return_inverse=True)[1])
    batch = UserBatch(np.concatenate([[0], np.cumsum(sizes)]), keys[order], (ratings[order] - 3.0) / 2.0)
    return InMemoryDataset("movielens-100k", batch, [str(m) for m in movie_ids])
