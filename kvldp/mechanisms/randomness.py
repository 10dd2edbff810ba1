"""Where client randomness comes from.

Every perturbation takes an explicit ``numpy.random.Generator``. In a
pipeline the generator of a batch derives from a run seed and the batch's
identity only, so a retried bundle reproduces exactly the same reports (a
retry must never hand the collector a second independent draw of a user).
Without a run seed, the seed is drawn from the OS's CSPRNG (``secrets``).
Whoever knows the seed can undo the noise: it is a secret of the perturbing
side and never written into reports, estimates or logs.
"""
from __future__ import annotations

import secrets

import numpy as np

# Stream tags keep the data generator and the perturbation independent even
# when a simulation uses one --seed for both.
STREAM_PERTURB = 0x5045
STREAM_DATA = 0x4441
STREAM_DATA_SETUP = 0x4453
STREAM_GROUP = 0x4752


def fresh_seed() -> int:
    """A 128-bit seed from the operating system's CSPRNG."""
    return secrets.randbits(128)


def batch_rng(seed: int, batch_id: int, stream: int = STREAM_PERTURB, round_index: int = 0) -> np.random.Generator:
    """Generator for one batch: a pure function of (seed, stream, batch_id,
    round); each round of a multi-round protocol draws fresh noise."""
    if seed is None:
        raise ValueError("a run seed is required (draw one with fresh_seed())")
    ss = np.random.SeedSequence([int(seed) & ((1 << 128) - 1), int(stream), int(batch_id), int(round_index)])
    return np.random.Generator(np.random.PCG64DXSM(ss))


def bernoulli_positions(total: int, prob: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices in ``[0, total)`` of i.i.d. Bernoulli(prob) successes.

    Exact, in O(total * prob) work: the gaps between successes are
    Geometric(prob), so we draw gaps and take their cumulative sum instead
    of one uniform per slot.
    """
    if total <= 0 or prob <= 0.0:
        return np.zeros(0, dtype=np.int64)
    if prob >= 1.0:
        return np.arange(total, dtype=np.int64)
    expected = total * prob
    chunk = int(expected + 6.0 * np.sqrt(expected * (1.0 - prob)) + 16)
    pieces = []
    last = -1
    while last < total - 1:
        gaps = rng.geometric(prob, size=chunk)
        if prob < 1e-12:
            # Gaps can then exceed int64 (wrapping negative) or overflow the
            # cumulative sum; any gap past the end means "no more successes".
            gaps = np.where((gaps <= 0) | (gaps > total), total + 1, gaps)
        pos = last + np.cumsum(gaps, dtype=np.int64)
        pieces.append(pos)
        last = int(pos[-1])
        chunk = max(16, chunk // 4)
    out = pieces[0] if len(pieces) == 1 else np.concatenate(pieces)
    return out[:np.searchsorted(out, total)]      # sorted: cut, do not mask
