"""Real rating data: the PCKV paper's Clothing set and MovieLens-100k."""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from kvldp.mechanisms.base import UserBatch

from .base import InMemoryDataset


def shared_data_dir() -> Path:
    """``$KVLDP_DATA_DIR``, else ``../shared/data`` beside the checkout or the CWD."""
    env = os.environ.get("KVLDP_DATA_DIR")
    candidates = [Path(env)] if env else []
    candidates += [Path(__file__).resolve().parents[3] / "shared" / "data", Path.cwd().parent / "shared" / "data",
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
    return InMemoryDataset("clothing", users, [str(k + 1) for k in range(d)], default_padding=2,
                           rating_range=(1.0, 5.0))


def load_movielens_100k() -> InMemoryDataset:
    """MovieLens 100k (943 users, 1,682 movies, 100,000 ratings, 1-5 stars
    mapped linearly onto ``[-1, 1]``), from the file the ``recbole==1.2.1``
    wheel ships (GroupLens's terms: research use, acknowledge, do not
    redistribute). Keys are movie ids in ascending order."""
    import importlib.util

    spec = importlib.util.find_spec("recbole")
    path = None
    if spec is not None:
        path = Path(spec.submodule_search_locations[0]) / "dataset_example" / "ml-100k" / "ml-100k.inter"
    if path is None or not path.exists():
        raise FileNotFoundError("MovieLens-100k is not installed; install it with "
                                "`pip install --no-deps recbole==1.2.1` (see shared/data/README.md)")
    table = np.loadtxt(path, delimiter="\t", skiprows=1, usecols=(0, 1, 2))
    users, items, ratings = table[:, 0].astype(np.int64), table[:, 1].astype(np.int64), table[:, 2]
    movie_ids, keys = np.unique(items, return_inverse=True)
    order = np.lexsort((keys, users))
    sizes = np.bincount(np.unique(users[order], return_inverse=True)[1])
    batch = UserBatch(np.concatenate([[0], np.cumsum(sizes)]), keys[order], (ratings[order] - 3.0) / 2.0)
    return InMemoryDataset("movielens-100k", batch, [str(m) for m in movie_ids], rating_range=(1.0, 5.0))
