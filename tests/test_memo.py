"""Memoisation's PRF (kvldp/mechanisms/privacy/memo.py): the documented derivation,
computed one user at a time with an independent AES and BLAKE2b, equals the
vectorised one; it depends on exactly (device, state, configuration)."""
from __future__ import annotations

import hashlib
import pickle

import numpy as np
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
from scipy import stats

from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.privacy.memo import DeviceKeys, config_digest, master_from_seed, user_uid

SEED, CFG = 20261124, config_digest({"mechanism": "pckv-ue", "d": 5, "epsilon": 2.0, "padding": 1})


def _aes(key: bytes, block: bytes) -> bytes:
    enc = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return enc.update(block) + enc.finalize()


def _xor(a: bytes, b: bytes) -> bytes:
    return bytes(x ^ y for x, y in zip(a, b, strict=True))


def _block(w0: int, w1: int) -> bytes:
    return w0.to_bytes(8, "little") + w1.to_bytes(8, "little")


def reference_stream(seed: int, uid: int, pairs, cfg: int, blocks: int):
    """The module docstring's derivation for one user, written out."""
    secret = (seed & ((1 << 128) - 1)).to_bytes(16, "big")
    kdf = lambda k, m: hashlib.blake2b(m, digest_size=16, key=k, person=b"kvldp-memo-v1").digest()  # noqa: E731
    master = kdf(secret, b"kvldp-memo-v1")
    k_pi, k_dev = kdf(master, b"permutation"), kdf(master, b"device")
    s = _aes(k_dev, _block(0x31564544, uid))

    def E(x):
        return _xor(_aes(k_pi, _xor(x, s)), s)

    words = []
    for k, v in sorted(pairs):
        q = round(v * (1 << 24)) & 0xFFFFFFFF
        words.append(k | (q << 32))
    if len(words) % 2:
        words.append((1 << 32) - 1)
    h = E(_block(0x314D564B | (len(pairs) << 32), cfg))
    for i in range(0, len(words), 2):
        h = E(_xor(h, _block(words[i], words[i + 1])))
    out = []
    for j in range(blocks):
        r = E(_xor(h, _block(0x31525443, j)))
        out += [(int.from_bytes(r[:8], "little") >> 11) / 2 ** 53, (int.from_bytes(r[8:], "little") >> 11) / 2 ** 53]
    fp = int.from_bytes(E(_xor(h, _block(0x31525046, 0)))[:8], "little")
    return out, fp


USERS = [[(3, 0.5)], [], [(0, -1.0), (4, 1.0), (2, 0.25)], [(1, 1.0), (0, 0.0)]]


def _batch(users, ids, batch_id=0):
    sizes = [len(u) for u in users]
    keys = [k for u in users for k, _ in u]
    values = [v for u in users for _, v in u]
    return UserBatch(np.concatenate([[0], np.cumsum(sizes)]), keys, values, batch_id, ids)


def test_vectorised_streams_equal_the_documented_derivation():
    keys = DeviceKeys.from_seed(SEED)
    ids = np.array([7, 2**63 + 5, 0, 123456789])
    streams = keys.streams(_batch(USERS, ids), CFG)
    got = streams.columns(6)
    fps = streams.fingerprints()
    for i, user in enumerate(USERS):
        expect, fp = reference_stream(SEED, int(ids[i]), user, CFG, 3)
        np.testing.assert_array_equal(got[i], expect)
        assert int(fps[i]) == fp


def test_streams_depend_on_device_state_and_configuration_only():
    keys = DeviceKeys.from_seed(SEED)
    ids = np.arange(10, 14)
    base = keys.streams(_batch(USERS, ids), CFG).columns(4)
    # alone, in another batch, pairs listed in another order: the same
    shuffled = [list(reversed(u)) for u in USERS]
    np.testing.assert_array_equal(keys.streams(_batch(shuffled[::-1], ids[::-1], 9), CFG).columns(4), base[::-1])
    np.testing.assert_array_equal(keys.streams(_batch(USERS[2:3], ids[2:3]), CFG).columns(4), base[2:3])
    # a changed value, key, device, configuration or master secret: different
    changed = [[(3, 0.0)], [(1, 1.0)], USERS[2], USERS[3]]
    other = keys.streams(_batch(changed, ids), CFG).columns(4)
    assert np.all(other[:2] != base[:2]) and np.array_equal(other[2:], base[2:])
    assert np.all(keys.streams(_batch(USERS, ids + 100), CFG).columns(4) != base)
    assert np.all(keys.streams(_batch(USERS, ids), CFG ^ 1).columns(4) != base)
    assert np.all(DeviceKeys.from_seed(SEED + 1).streams(_batch(USERS, ids), CFG).columns(4) != base)


def test_uniforms_are_uniform_and_keys_pickle_without_showing():
    keys = pickle.loads(pickle.dumps(DeviceKeys.from_seed(SEED)))
    n = 20_000
    users = UserBatch(np.arange(n + 1), np.zeros(n, np.int64), np.zeros(n), 0, np.arange(n))
    u = keys.streams(users, CFG).columns(5)
    for c in range(5):
        assert stats.kstest(u[:, c], "uniform").pvalue > 1e-3
    assert "secret" in repr(keys) and str(SEED) not in repr(keys)
    assert master_from_seed(SEED) != master_from_seed(SEED + 1)


def test_string_user_ids_hash_stably():
    a = user_uid(["alice", "bob", "alice"])
    assert a.dtype == np.uint64 and a[0] == a[2] != a[1]
