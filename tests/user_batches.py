"""Hand-built ``UserBatch``es shared by the mechanism tests."""
from __future__ import annotations

import numpy as np

from kvldp.mechanisms.base import UserBatch


def identical_users(pairs, n, batch_id=0):
    """``n`` copies of one user holding ``pairs`` (a list of ``(key, value)``)."""
    keys = np.tile([k for k, _ in pairs], n).astype(np.int64)
    values = np.tile([v for _, v in pairs], n).astype(np.float64)
    return UserBatch(np.arange(n + 1) * len(pairs), keys, values, batch_id)


def users_from_pairs(rows):
    """``rows``: one list of (key, value) per user."""
    sizes = [len(r) for r in rows]
    keys = [k for r in rows for k, _ in r]
    values = [v for r in rows for _, v in r]
    return UserBatch(np.concatenate([[0], np.cumsum(sizes)]), np.array(keys, dtype=np.int64),
                     np.array(values, dtype=np.float64))


def users_from_states(states, keys=None):
    """Users whose discretisation is deterministic: state 2 -> holds the key
    with value +1, 0 -> value -1, 1 -> does not hold it (Disc(+-1) = +-1);
    column j of ``states`` is dictionary key ``keys[j]`` (default j; keys
    sorted per user when ``keys`` is increasing)."""
    states = np.asarray(states)
    keys = np.arange(states.shape[1]) if keys is None else np.asarray(keys)
    held = states != 1
    owner, col = np.nonzero(held)                  # row-major: columns sorted per user
    return UserBatch(np.concatenate([[0], np.cumsum(held.sum(axis=1))]), keys[col],
                     (states[owner, col] - 1).astype(np.float64))
