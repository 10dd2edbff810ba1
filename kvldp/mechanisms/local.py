"""The pure local runner: any registered mechanism over in-memory batches.

The same per-batch steps the Beam pipeline runs (generate -> perturb with the
batch's generator -> accumulate), in a plain loop. Counts are integers added
in any order, so for the same seed its estimates equal the pipeline's
exactly; it is also the NumPy baseline of ``kvldp bench``.
"""
from __future__ import annotations

import dataclasses
from typing import Iterable

import numpy as np

from .base import Estimates, Mechanism, UserBatch
from .base import DEFAULT_BATCH_SIZE
from .truth import truth_counts, truth_from_counts
from .randomness import batch_rng


@dataclasses.dataclass
class LocalResult:
    counts: np.ndarray
    estimates: Estimates
    truth: np.ndarray

    def true_values(self, d: int):
        return truth_from_counts(self.truth, d)


def perturb_and_count(mechanism: Mechanism, batches: Iterable[UserBatch], seed: int):
    """Counts of the mechanism's reports and truth counts over ``batches``."""
    counts = mechanism.new_counts()
    truth = np.zeros(1 + 2 * mechanism.d)
    for users in batches:
        reports = mechanism.perturb(users, batch_rng(seed, users.batch_id))
        mechanism.accumulate(counts, reports)
        truth += truth_counts(users, mechanism.d)
    return counts, truth


def run_local(mechanism: Mechanism, dataset, seed: int,
              batch_size: int = DEFAULT_BATCH_SIZE) -> LocalResult:
    """Run ``mechanism`` end to end over ``dataset`` in this process."""
    if dataset.d != mechanism.d:
        raise ValueError(f"dataset has d={dataset.d} keys but the mechanism expects d={mechanism.d}")
    counts, truth = perturb_and_count(mechanism, dataset.batches(batch_size), seed)
    return LocalResult(counts, mechanism.estimate(counts), truth)
