"""The clients' noise generator (mechanisms/privacy/randomness.py): AES-128-CTR (or
ChaCha20) keyed per batch by BLAKE2b from the run seed; PCG64DXSM only for a
``SimulationSeed`` and for the streams that are not noise."""
from __future__ import annotations

import hashlib
import pickle
import struct

import numpy as np
import pytest

from kvldp.mechanisms.privacy.randomness import (
    KDF_PERSON,
    STREAM_DATA,
    STREAM_GROUP,
    STREAM_PERTURB,
    SimulationSeed,
    batch_rng,
    has_aes_instructions,
    noise_generator_name,
    noise_key,
)

SEED = (1 << 127) + 987654321


def test_the_key_is_blake2b_of_the_seed_over_stream_batch_round():
    want = hashlib.blake2b(struct.pack(">QQQ", STREAM_PERTURB, 7, 2), digest_size=16,
                           key=SEED.to_bytes(16, "big"), person=KDF_PERSON).digest()
    assert noise_key(SEED, STREAM_PERTURB, 7, 2) == int.from_bytes(want, "big")
    keys = {noise_key(SEED, STREAM_PERTURB, b, r) for b in range(50) for r in range(3)}
    assert len(keys) == 150                                   # every (batch, round) its own key
    assert noise_key(SEED + 1, STREAM_PERTURB, 7, 2) != noise_key(SEED, STREAM_PERTURB, 7, 2)


@pytest.mark.skipif(not has_aes_instructions(), reason="the CPU has no AES instructions: ChaCha20 is used")
def test_the_noise_is_aes_128_in_counter_mode_under_that_key():
    """Known answer: the generator's raw output is AES-128(key, counter) for
    counters 0, 1, … (little-endian), computed independently by `cryptography`."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    rng = batch_rng(SEED, 7, round_index=2)
    raw = rng.bit_generator.random_raw(8)
    key = noise_key(SEED, STREAM_PERTURB, 7, 2).to_bytes(16, "little")
    aes = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    blocks = b"".join(aes.update(c.to_bytes(16, "little")) for c in range(4))
    assert raw.tolist() == list(struct.unpack("<8Q", blocks))
    assert noise_generator_name(SEED) == "AES-128-CTR (AES-NI)"


def test_only_simulation_seeds_and_non_noise_streams_use_pcg64():
    assert type(batch_rng(SEED, 0).bit_generator).__name__ in ("AESCounter", "ChaCha")
    assert type(batch_rng(SimulationSeed(SEED), 0).bit_generator).__name__ == "PCG64DXSM"
    for stream in (STREAM_DATA, STREAM_GROUP):                 # simulated data, public group assignment
        assert type(batch_rng(SEED, 0, stream).bit_generator).__name__ == "PCG64DXSM"
    assert "simulation only" in noise_generator_name(SimulationSeed(1))
    assert pickle.loads(pickle.dumps(SimulationSeed(5))).__class__ is SimulationSeed   # travels to workers


def test_the_noise_is_reproducible_per_batch_and_uniform():
    """A retried batch draws the same noise; the draws are uniform (chi-square
    over 20 bins of 10^6 floats, p > 1e-6: fails on a broken stream)."""
    from scipy import stats
    a = batch_rng(SEED, 3).random(1_000_000)
    np.testing.assert_array_equal(a, batch_rng(SEED, 3).random(1_000_000))
    assert not np.array_equal(a[:100], batch_rng(SEED, 3, round_index=1).random(100))
    counts = np.bincount((a * 20).astype(int), minlength=20)
    assert stats.chisquare(counts).pvalue > 1e-6
    ints = batch_rng(SEED, 4).integers(0, 7, 700_000)
    assert stats.chisquare(np.bincount(ints, minlength=7)).pvalue > 1e-6


def test_batch_and_round_must_be_whole_and_non_negative():
    with pytest.raises(ValueError):
        batch_rng(SEED, -1)
