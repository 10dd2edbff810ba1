"""Where client randomness comes from.

Every perturbation takes an explicit ``numpy.random.Generator``. In a
pipeline the generator of a batch derives from a run seed and the batch's
identity only, so a retried bundle reproduces exactly the same reports (a
retry must never hand the collector a second independent draw of a user).
Without a run seed, the seed is drawn from the OS's CSPRNG (``secrets``).
Whoever knows the seed can undo the noise: it is a secret of the perturbing
side and never written into reports, estimates or logs.

The noise (``STREAM_PERTURB``: every perturbation, padding-and-sampling
draw and key sample) comes from a cryptographic generator: AES-128 in
counter mode (``randomgen.AESCounter``, AES-NI) or, on a CPU without AES
instructions, ChaCha20 (``randomgen.ChaCha(rounds=20)``), plugged into
``numpy.random.Generator``. Its 128-bit key is derived from the run seed and
(stream, batch, round) by libsodium's ``crypto_kdf`` construction: BLAKE2b
keyed with the seed, personalised ``kvldp-noise-v1``, over the three numbers
(``noise_key``). A collector that sees a batch's reports sees functions of
AES/ChaCha output under a key it cannot recover, so unlike PCG64 (whose
state has been recovered from its output: Bouillaguet, Martinez and Sauvage,
ToSC 2020) nothing it learns from one batch undoes another user's noise.
Measured here through ``Generator`` (10^7 floats + 10^7 bounded ints):
AES-CTR 216 M/s, PCG64DXSM 127 M/s, ChaCha20 72 M/s.

``SimulationSeed`` marks a seed whose noise may come from the fast,
non-cryptographic PCG64DXSM (``--fast-rng`` of simulate, evaluate, bench; the
golden fingerprints): simulations only, and the output says so. The data
generators of simulations and the users' group assignment (keyed by the
public collection id: the collector learns the groups anyway from who
reports when) are not noise and keep PCG64DXSM.
"""
from __future__ import annotations

import functools
import hashlib
import math
import secrets
import struct
from collections.abc import Iterator

import numpy as np

# Stream tags keep the data generator and the perturbation independent even
# when a simulation uses one --seed for both.
STREAM_PERTURB = 0x5045
STREAM_DATA = 0x4441
STREAM_DATA_SETUP = 0x4453
STREAM_GROUP = 0x4752


NOISE_STREAMS = frozenset({STREAM_PERTURB})
KDF_PERSON = b"kvldp-noise-v1"


class SimulationSeed(int):
    """A run seed whose noise comes from the fast, non-cryptographic
    PCG64DXSM: for simulations and tests only (``--fast-rng``)."""

    def __repr__(self):
        return f"SimulationSeed({int(self)})"


def fresh_seed() -> int:
    """A 128-bit seed from the operating system's CSPRNG."""
    return secrets.randbits(128)


def noise_key(seed: int, stream: int, batch_id: int, round_index: int) -> int:
    """The 128-bit key of one batch's noise generator: BLAKE2b keyed with the
    128-bit seed over (stream, batch, round) (libsodium's ``crypto_kdf``)."""
    secret = (int(seed) & ((1 << 128) - 1)).to_bytes(16, "big")
    message = struct.pack(">QQQ", int(stream), int(batch_id), int(round_index))
    return int.from_bytes(hashlib.blake2b(message, digest_size=16, key=secret, person=KDF_PERSON).digest(), "big")


@functools.cache
def has_aes_instructions() -> bool:
    from randomgen import AESCounter
    return bool(AESCounter(key=1).use_aesni)


def noise_generator_name(seed) -> str:
    """Which generator a run's noise comes from (printed with its output)."""
    if isinstance(seed, SimulationSeed):
        return "PCG64DXSM (fast, not cryptographic: simulation only, --fast-rng)"
    return "AES-128-CTR (AES-NI)" if has_aes_instructions() else "ChaCha20"


def batch_rng(seed: int, batch_id: int, stream: int = STREAM_PERTURB, round_index: int = 0) -> np.random.Generator:
    """Generator for one batch: a pure function of (seed, stream, batch_id,
    round); each round of a multi-round protocol draws fresh noise. Noise
    streams are cryptographic unless ``seed`` is a ``SimulationSeed``."""
    if seed is None:
        raise ValueError("a run seed is required (draw one with fresh_seed())")
    if min(int(batch_id), int(round_index), int(stream)) < 0:
        raise ValueError(f"batch, round and stream are >= 0, got {batch_id}, {round_index}, {stream}")
    if stream in NOISE_STREAMS and not isinstance(seed, SimulationSeed):
        from randomgen import AESCounter, ChaCha
        key = noise_key(seed, stream, batch_id, round_index)
        bits = AESCounter(key=key) if has_aes_instructions() else ChaCha(key=key, rounds=20)
        return np.random.Generator(bits)
    ss = np.random.SeedSequence([int(seed) & ((1 << 128) - 1), int(stream), int(batch_id), int(round_index)])
    return np.random.Generator(np.random.PCG64DXSM(ss))


INSTANT_PERSON = b"kvldp-irr-v1"


def collection_generator(rng: np.random.Generator, collection: str) -> np.random.Generator:
    """A cryptographic generator for one collection's instantaneous layer
    (longitudinal.py): 128 bits drawn from the batch's generator (a function
    of the run seed, batch and round), BLAKE2b-keyed with them over the
    public collection id, key an AES-CTR (ChaCha20) generator. So every
    collection draws fresh instantaneous noise, and a retried bundle of one
    collection the same."""
    material = rng.bytes(16)
    digest = hashlib.blake2b(str(collection).encode("utf-8"), digest_size=16, key=material, person=INSTANT_PERSON)
    key = int.from_bytes(digest.digest(), "big")
    from randomgen import AESCounter, ChaCha
    bits = AESCounter(key=key) if has_aes_instructions() else ChaCha(key=key, rounds=20)
    return np.random.Generator(bits)


GAP_STEP = 1 << 20      # gaps drawn per step: a run of successes is at most this long
INVERSION_BELOW = 1 / 3  # NumPy's geometric inverts an exponential below this p, searches at and above it
# From this p a byte per slot (1.7-2.3 ns a slot, positions included) beats
# a gap per success (~8 ns a success below INVERSION_BELOW, 20-24 above):
# measured on AES-CTR, equal at 0.2 (1.7 ns a slot), 4x apart at 0.35.
DENSE_FROM = 0.2


def bernoulli_positions(total: int, prob: float, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices in ``[0, total)`` of i.i.d. Bernoulli(prob) successes.

    Exact. Below ``DENSE_FROM`` in O(total * prob) work: the gaps between
    successes are Geometric(prob), so we draw gaps and take their cumulative
    sum instead of one uniform per slot; from it one random byte per slot
    (``byte_runs``). Both are ``bernoulli_runs``, joined.
    """
    if prob >= 1.0:
        return np.arange(max(total, 0), dtype=np.int64)
    runs = list(bernoulli_runs(total, prob, rng))
    if len(runs) == 1:
        return runs[0]
    return np.concatenate(runs) if runs else np.zeros(0, dtype=np.int64)


def bernoulli_runs(total: int, prob: float, rng: np.random.Generator, step: int | None = None) -> Iterator[np.ndarray]:
    """``bernoulli_positions(total, prob, rng)`` in consecutive sorted runs of
    at most ``step`` (default ``GAP_STEP``; some empty), from the same draws
    in the same order -- all of them, the gaps past ``total`` too, so ``rng``
    ends in the same state: a caller may consume the successes a run at a time without
    holding them all (IOH-SUE at 3^10 cells: ~20M a batch, 160 MB, which the
    kernel maps and zero-fills afresh for every batch).

    The gaps come in chunks sized for the expected count plus 6 s.d., then
    a quarter of that, and so on, until one passes the end."""
    if total <= 0 or prob <= 0.0:
        return
    if prob >= 1.0:
        raise ValueError("bernoulli_runs needs prob < 1 (bernoulli_positions takes every index)")
    if prob >= DENSE_FROM:
        yield from byte_runs(total, prob, rng, step)
        return
    expected = total * prob
    chunk = int(expected + 6.0 * np.sqrt(expected * (1.0 - prob)) + 16)
    last = -1
    while last < total - 1:
        for gaps in geometric_gaps(chunk, prob, total, rng, step):
            pos = np.cumsum(gaps, out=gaps)
            pos += last
            last = int(pos[-1])
            yield pos[:np.searchsorted(pos, total)]      # sorted: cut, do not mask
        chunk = max(16, chunk // 4)


def geometric_gaps(size: int, prob: float, total: int, rng: np.random.Generator,
                   step: int | None = None) -> Iterator[np.ndarray]:
    """``rng.geometric(prob, size)``, ``step`` gaps at a time (the same
    draws: NumPy draws them one after another), every gap past ``total``
    set to ``total + 1`` ("no more successes": a tiny ``prob``'s gaps would
    overflow int64, and their sum too).

    Below ``INVERSION_BELOW`` NumPy draws a gap as ``ceil(E / -ln(1 - prob))``,
    ``E`` from its ziggurat exponential, one element at a time (~10 ns a gap
    from AES-CTR); here the same exponentials, in the same order, are drawn
    into a buffer and divided and rounded as arrays (~6 ns): the same gaps,
    where they are most of a dense unary encoding's time (IOH-SUE at 3^10
    cells and eps = 4: ~7,000 a user)."""
    step = step or GAP_STEP
    rate = -math.log1p(-prob)
    buffer = np.empty(min(size, step)) if prob < INVERSION_BELOW else None     # the exponentials' only
    for s in range(0, size, step):
        m = min(step, size - s)
        if prob >= INVERSION_BELOW:
            gaps = rng.geometric(prob, size=m)
            yield np.minimum(gaps, total + 1, out=gaps)
        else:
            draw = buffer[:m]
            rng.standard_exponential(out=draw)
            draw /= rate
            np.minimum(draw, total + 1, out=draw)
            yield np.ceil(draw, out=draw).astype(np.int64)


def byte_runs(total: int, prob: float, rng: np.random.Generator, step: int | None = None) -> Iterator[np.ndarray]:
    """``bernoulli_runs`` by one random byte per slot, ``step`` slots at a
    time: with ``Q = floor(256 p)`` a slot succeeds when its byte ``B < Q``,
    and when ``B == Q`` (1/256 of the slots) when a uniform double is below
    ``256 p - Q``: ``P = Q/256 + (256 p - Q)/256 = p`` exactly, the same
    precision as ``random() < p``, for one byte of the generator's output
    where ``random()`` takes eight.

    At a dense unary encoding's ``p`` (PCKV-UE at eps = 1: 0.35 of 340,542
    slots a user) NumPy's geometric gaps cost ~23 ns each (8.2 ns a slot),
    one double a slot 7 ns; the byte ~0.8 ns and the comparisons and
    positions ~0.7. A run has at most ``step`` successes (it has ``step`` slots)."""
    step = step or GAP_STEP
    scaled = prob * 256.0                # exact: a power of two
    below = math.floor(scaled)
    rest = scaled - below
    for s in range(0, total, step):
        m = min(step, total - s)
        byte = rng.integers(0, 256, size=m, dtype=np.uint8)
        hit = byte < below
        tie = np.flatnonzero(byte == below)
        if len(tie):
            hit[tie[rng.random(len(tie)) < rest]] = True
        run = np.flatnonzero(hit)
        run += s
        yield run


def fair_signs(size: int, rng: np.random.Generator) -> np.ndarray:
    """``size`` independent fair ``±1`` (int8), one random bit each (a
    double each was a third of PCKV-UE's time at eps = 1 and 340,542 keys)."""
    bits = np.unpackbits(rng.integers(0, 256, size=(size + 7) // 8, dtype=np.uint8), count=size)
    signs = bits.view(np.int8)
    signs *= 2
    signs -= 1
    return signs
