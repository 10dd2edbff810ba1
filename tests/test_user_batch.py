"""``owners_of``: the row of each entry of a CSR layout, as ``np.repeat`` gives it."""
from __future__ import annotations

import numpy as np
import pytest

from kvldp.mechanisms.base import UserBatch, owners_of


def _repeat(offsets):
    return np.repeat(np.arange(len(offsets) - 1), np.diff(offsets))


@pytest.mark.parametrize("sizes", [[], [0], [0, 0], [1], [3], [1, 1, 1], [0, 2, 0], [1, 0, 0, 2], [2, 0], [0, 1]])
def test_owners_of_small_layouts(sizes):
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    got = owners_of(offsets)
    assert got.dtype == np.int64 and np.array_equal(got, _repeat(offsets))


@pytest.mark.parametrize("high", [1, 2, 5, 40])
def test_owners_of_random_layouts(high):
    rng = np.random.default_rng(high)
    for _ in range(20):
        sizes = rng.integers(0 if high > 1 else 1, high + 1, rng.integers(1, 3000))
        offsets = np.concatenate([[0], np.cumsum(sizes)])
        assert np.array_equal(owners_of(offsets), _repeat(offsets))


def test_a_batchs_owners_and_a_slice_of_its_rows():
    users = UserBatch(np.array([0, 2, 2, 5, 6]), np.arange(6), np.zeros(6))
    assert users.owners.tolist() == [0, 0, 2, 2, 2, 3]
    assert UserBatch.single_pair(np.arange(4), np.zeros(4)).owners.tolist() == [0, 1, 2, 3]
    rows = users.offsets[1:4] - users.offsets[1]          # rows 1-2 of the layout, re-based
    assert owners_of(rows).tolist() == [1, 1, 1]
