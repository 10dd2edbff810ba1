"""Synthetic rating data.

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
import functools
import math

import numpy as np

from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.privacy.randomness import STREAM_DATA, STREAM_DATA_SETUP, batch_rng

from .base import Dataset
from .pilot import zipf_weights

SYNTHETIC_KINDS = ("uu", "gg", "multi", "corr")


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
    generated = True            # not a field: batches from (seed, spec); pickled as the parameters

    def __post_init__(self):
        if self.kind not in SYNTHETIC_KINDS:
            raise ValueError(f"unknown synthetic kind {self.kind!r}; known: {SYNTHETIC_KINDS}")
        if self.n_users < 1 or self.d < 1:
            raise ValueError("need at least one user and one key")
        self.name = f"synthetic-{self.kind}"
        self.__dict__.update(_key_parameters(**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)
                                                if f.name != "n_users"}))
        self.default_padding = 1 if self.kind in ("uu", "gg") else 2

    # Pickled as its parameters: the per-key arrays are a pure function of
    # them and are rebuilt where the dataset is unpickled. Pickled whole, a
    # d = 10^6 dataset was 16 MB of random floats that Beam bz2-compresses
    # into every worker's DoFn, ~3-7 s each time (issue 17).
    def __getstate__(self):
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self.__post_init__()

    def batch(self, batch_id: int, start: int, stop: int) -> UserBatch:
        """Users ``start … stop-1`` (their ids: these indices)."""
        return self._generate(batch_id, start, stop).with_ids(np.arange(start, stop))

    def _generate(self, batch_id: int, start: int, stop: int) -> UserBatch:
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


@functools.lru_cache(maxsize=4)
def _key_parameters(kind, d, seed, sigma_key, sigma_mean, lam, zipf, spread, classes) -> dict[str, np.ndarray]:
    """The per-key arrays of a dataset (``key_probs``, ``key_means``; ``corr``:
    the class model), read-only and shared by every copy of it in a process:
    Beam unpickles one copy per stage, which held ~9 copies of 16 MB at d = 10^6."""
    rng = batch_rng(seed, 0, STREAM_DATA_SETUP)
    out = {}
    if kind == "gg":
        edges = np.arange(d + 1) / sigma_key
        cdf = np.array([math.erf(e / math.sqrt(2)) for e in edges])
        out["key_probs"] = np.diff(cdf) / (cdf[-1] - cdf[0])
        out["key_means"] = _truncated_normal(rng, sigma_mean, d)
    elif kind == "uu":
        out["key_probs"] = np.full(d, 1.0 / d)
        out["key_means"] = rng.uniform(-1.0, 1.0, d)
    elif kind == "multi":
        out["key_probs"] = zipf_weights(d, zipf)
        out["key_means"] = rng.uniform(-1.0, 1.0, d)
    else:
        weights = rng.dirichlet(np.full(classes, 2.0))
        hold = rng.beta(0.7, 2.0, size=(classes, d))
        means = rng.uniform(-1.0, 1.0, size=(classes, d))
        out.update(class_weights=weights, class_hold=hold, class_means=means, key_probs=weights @ hold,
                   key_means=(weights[:, None] * hold * means).sum(0) / (weights @ hold))
    for array in out.values():
        array.flags.writeable = False
    return out
