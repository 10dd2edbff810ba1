"""IOH's cells: a user's states over the chosen keys as one base-3 index.

A user's state for key ``j`` is 0 (lacks it), 1 (holds it, value -1) or 2
(holds it, value +1) after discretisation; the ``k`` states of the chosen
keys, most significant first, make the cell index ``I`` in ``[0, 3^k)``.
"""
from __future__ import annotations

import numpy as np


def state_index(states: np.ndarray) -> np.ndarray:
    """``I = sum_j 3^(k-1-j) s_j`` for rows of states ``(n, k)``."""
    states = np.asarray(states, dtype=np.int64)
    k = states.shape[1]
    return states @ (3 ** np.arange(k - 1, -1, -1, dtype=np.int64))


def index_states(index, k: int) -> np.ndarray:
    """Inverse of :func:`state_index`: base-3 digits, shape ``(…, k)``."""
    index = np.asarray(index, dtype=np.int64)
    return (index[..., None] // 3 ** np.arange(k - 1, -1, -1)) % 3
