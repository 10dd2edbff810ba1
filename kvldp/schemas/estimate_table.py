"""A run's estimates as one value that becomes ``estimate.avsc`` records lazily.

The estimates of a run are d numbers per field; their records are d dicts of
16 fields (~1.5 kB each). Emitting the records as d pipeline elements made
the runner hold them, group them for the single output shard and hand them
back: 4.4 GB and ~50 s at d = 10^6 even for 2,000 users (issue 17). An
``EstimateTable`` is a single element -- the arrays and the key names --
that the writer turns into records a chunk of keys at a time, so the output
costs memory proportional to the arrays, not to the records.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence

import numpy as np

from kvldp.mechanisms.base import Estimates
from kvldp.schemas.records import estimate_lines, estimate_records

CHUNK_KEYS = 8192      # records built at a time: ~12 MB of dicts


def slice_estimates(est: Estimates, start: int, stop: int) -> Estimates:
    """``est`` restricted to keys ``start:stop`` (every per-key array sliced,
    scalars kept)."""
    d = est.d
    changes = {}
    for field in dataclasses.fields(est):
        value = getattr(est, field.name)
        if isinstance(value, np.ndarray) and value.shape[:1] == (d,):
            changes[field.name] = value[start:stop]
    return dataclasses.replace(est, **changes)


@dataclasses.dataclass(frozen=True)
class EstimateTable:
    """Estimates of the keys named ``key_names`` (in order), with the true
    values in simulations and the ratings' scale when known."""

    estimates: Estimates
    key_names: Sequence[str]
    true_frequency: np.ndarray | None = None
    true_mean: np.ndarray | None = None
    rating_range: tuple[float, float] | None = None

    def __post_init__(self):
        if len(self.key_names) != self.estimates.d:
            raise ValueError(f"{len(self.key_names)} key names for {self.estimates.d} estimates")

    def __len__(self) -> int:
        return self.estimates.d

    def records(self, chunk: int | None = None) -> Iterator[dict]:
        """The ``estimate.avsc`` records, key by key, built ``chunk`` keys at a time."""
        for part in self._chunks(chunk):
            yield from estimate_records(*part, rating_range=self.rating_range)

    def lines(self, fmt: str, chunk: int | None = None) -> Iterator[list[str]]:
        """The records as text lines of ``fmt`` (``records.estimate_lines``), a list per ``chunk`` keys."""
        for est, names, true_f, true_m in self._chunks(chunk):
            yield estimate_lines(est, names, fmt, true_f, true_m, rating_range=self.rating_range)

    def _chunks(self, chunk: int | None):
        chunk = chunk or CHUNK_KEYS
        for start in range(0, len(self), chunk):
            stop = min(start + chunk, len(self))
            yield (slice_estimates(self.estimates, start, stop), self.key_names[start:stop],
                   None if self.true_frequency is None else self.true_frequency[start:stop],
                   None if self.true_mean is None else self.true_mean[start:stop])
