"""Memoisation without client storage: a device's permanent randomness is a
keyed PRF of its own secret and of the state it reports.

A user whose ratings do not change must send the same permanent report in
every collection (RAPPOR's memoised permanent randomised response, Erlingsson,
Pihur and Korolova, CCS 2014 §3; Arcolezi et al. 2021, "Improving the Utility
of Locally Differentially Private Protocols for Longitudinal and
Multidimensional Frequency Estimates", §3), or the collector averages the
reports and the guarantee degrades to ``T eps`` after ``T`` collections.
Instead of storing the report, the device recomputes its randomness from a
secret it keeps and the canonical form of what it reports, so an unchanged
state gives bit-identical uniforms (hence the identical permanent report) and
a changed state fresh, independent ones.

Construction (all blocks 128 bits, two little-endian 64-bit words ``<w0, w1>``)::

    M                 deployment master secret, perturbing side only; a simulation
                      (or an ingest job with --seed-file) uses M = KDF(seed, "kvldp-memo-v1")
    KDF(k, m, tag)    BLAKE2b-128 keyed with k over m, personalised tag (libsodium crypto_kdf)
    K_pi  = KDF(M, "permutation", "kvldp-memo-v1"),  pi(x) = AES-128_{K_pi}(x)
    K_dev = KDF(M, "device",      "kvldp-memo-v1")
    s_u   = AES-128_{K_dev}(<DEV, uid_u>)         the device secret of user u
                                                  (a real device: 128 random bits it keeps)
    E_u(x) = pi(x XOR s_u) XOR s_u                the device's block cipher: single-key
                                                  Even-Mansour over pi (Dunkelman, Keller
                                                  and Shamir, EUROCRYPT 2012)
    c(S)  = B_0 || B_1 || ... || B_m              canonical state of S = {<k_i, v_i>}:
        B_0 = <STATE | |S| << 32, cfg>            cfg: 64-bit digest of the permanent layer's
                                                  public configuration (mechanism, d, l, eps_inf)
        B_i = <k | q(v) << 32, k' | q(v') << 32>  two pairs per block, sorted by key,
                                                  q(v) = round(v 2^24) (two's complement,
                                                  32 bits); an odd last pair is padded
                                                  with <2^32 - 1, 0>
    h_0 = E_u(B_0),  h_i = E_u(h_{i-1} XOR B_i)   CBC-MAC of c(S) under E_u
    mu_u(S) = h_m                                 the memo key
    R_u(S)[j] = E_u(mu_u(S) XOR <CTR, j>)         the permanent stream, block j
    U_u(S)[2j + h] = (word h of R_u(S)[j] >> 11) 2^-53     uniforms in [0, 1)
    fp_u(S) = word 0 of E_u(mu_u(S) XOR <FPR, 0>)          the ledger's state fingerprint

``B_0`` carries ``|S|``, so the messages ``c(S) || <CTR, j>`` and
``c(S) || <FPR, 0>`` form a prefix-free set, on which CBC-MAC over a PRP is a
PRF (Bellare, Kilian and Rogaway, JCSS 2000; Petrank and Rackoff 2000). With
``K_pi`` secret that is the standard-model guarantee of AES; were ``K_pi``
public (a device SDK that hard-codes it), ``E_u`` is still a PRP keyed by
``s_u`` in the random-permutation model, the usual model of fixed-key AES.
The collector never sees a PRF output: it sees reports drawn with the
uniforms, as it sees functions of the AES-CTR noise stream (randomness.py).
``cfg`` keeps two different mechanisms (or budgets) from sharing randomness:
two reports of one state drawn with the *same* uniforms by different
randomisers can leak more than either.

Everything is vectorised over a batch: one ECB call per chain step encrypts
that step's block of every user (10^6 users: a few ECB calls of 10^6 blocks,
~0.3 s measured here, against ~1 s for a per-user keyed BLAKE2b and ~50 s for
a per-user ``randomgen.AESCounter`` generator).
"""
from __future__ import annotations

import hashlib
import json

import numpy as np

from kvldp.mechanisms.base import UserBatch

MEMO_PERSON = b"kvldp-memo-v1"
TAG_DEV = 0x31564544          # "DEV1"
TAG_STATE = 0x314D564B        # "KVM1"
TAG_CTR = 0x31525443          # "CTR1"
TAG_FPR = 0x31525046          # "FPR1"
VALUE_SCALE = 1 << 24
PAD_KEY = (1 << 32) - 1
_LE = np.dtype("<u8")


def kdf(key: bytes, message: bytes) -> bytes:
    """BLAKE2b-128 keyed with ``key`` (at most 64 bytes) over ``message``."""
    return hashlib.blake2b(message, digest_size=16, key=key, person=MEMO_PERSON).digest()


def master_from_seed(seed: int) -> bytes:
    """``M = KDF(seed, "kvldp-memo-v1")``: a simulation's (or a seeded ingest
    job's) master secret; the same seed gives the same device secrets in
    every collection, which is what memoisation needs."""
    secret = (int(seed) & ((1 << 128) - 1)).to_bytes(16, "big")
    return kdf(secret, b"kvldp-memo-v1")


def user_uid(user_ids) -> np.ndarray:
    """Stable 64-bit ids of string user ids (a ratings file's): the first 8
    bytes of BLAKE2b(id), personalised ``kvldp-uid-v1``."""
    return np.array([int.from_bytes(hashlib.blake2b(str(u).encode("utf-8"), digest_size=8,
                                                    person=b"kvldp-uid-v1").digest(), "little")
                     for u in user_ids], dtype=np.uint64)


def config_digest(config: dict) -> int:
    """``cfg``: 64 bits of SHA-256 over the canonical JSON of a public configuration."""
    text = json.dumps(config, sort_keys=True, separators=(",", ":"), default=float)
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


def quantise(values: np.ndarray) -> np.ndarray:
    """``q(v) = round(v 2^24)`` as the low 32 bits of its two's complement."""
    q = np.rint(np.asarray(values, dtype=np.float64) * VALUE_SCALE).astype(np.int64)
    return (q & 0xFFFFFFFF).astype(np.uint64)


def to_uniform(words: np.ndarray) -> np.ndarray:
    """The top 53 bits of 64-bit words as doubles in ``[0, 1)``."""
    return (words >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class _ECB:
    """AES-128-ECB over (n, 2) arrays of 64-bit words (the ``cryptography``
    package, i.e. OpenSSL with AES-NI). Built lazily so that a mechanism
    holding one pickles (Beam ships it to workers) without the cipher."""

    def __init__(self, key: bytes):
        self._key = bytes(key)
        self._enc = None

    def __getstate__(self):
        return {"_key": self._key, "_enc": None}

    def __call__(self, blocks: np.ndarray) -> np.ndarray:
        if self._enc is None:
            from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
            self._enc = Cipher(algorithms.AES(self._key), modes.ECB()).encryptor()
        if not len(blocks):
            return np.zeros((0, 2), dtype=_LE)
        data = np.ascontiguousarray(blocks, dtype=_LE).tobytes()
        return np.frombuffer(self._enc.update(data), dtype=_LE).reshape(-1, 2)


class DeviceKeys:
    """The perturbing side's memoisation keys under one master secret ``M``.

    Never part of a mechanism's public ``config`` and never written anywhere:
    it lives in the perturbing process only (the collector builds the same
    mechanism without it and cannot perturb)."""

    def __init__(self, master: bytes):
        if len(master) != 16:
            raise ValueError("the memoisation master secret is 16 bytes")
        self._pi = _ECB(kdf(master, b"permutation"))
        self._dev = _ECB(kdf(master, b"device"))

    def __repr__(self) -> str:          # never show the keys
        return "DeviceKeys(<secret>)"

    @classmethod
    def from_seed(cls, seed: int) -> DeviceKeys:
        return cls(master_from_seed(seed))

    def device_secrets(self, uids: np.ndarray) -> np.ndarray:
        """``s_u = AES_{K_dev}(<DEV, uid_u>)``, shape ``(n, 2)``."""
        uids = np.asarray(uids, dtype=np.uint64)
        blocks = np.empty((len(uids), 2), dtype=_LE)
        blocks[:, 0] = TAG_DEV
        blocks[:, 1] = uids
        return self._dev(blocks)

    def cipher(self, blocks: np.ndarray, secrets: np.ndarray) -> np.ndarray:
        """``E_u(x) = pi(x XOR s_u) XOR s_u`` row by row."""
        return self._pi(blocks ^ secrets) ^ secrets

    def streams(self, users: UserBatch, cfg: int) -> MemoStreams:
        """The permanent streams ``R_u(S_u)`` of every user of the batch."""
        if users.user_ids is None:
            raise ValueError("memoised reports need stable user ids (UserBatch.user_ids): the device secret "
                             "of a user is derived from its id")
        secrets = self.device_secrets(users.user_ids)
        return MemoStreams(self, secrets, self._memo_keys(users, secrets, cfg))

    def _memo_keys(self, users: UserBatch, secrets: np.ndarray, cfg: int) -> np.ndarray:
        """CBC-MAC of ``c(S_u)`` under ``E_u``: one ECB call per chain step."""
        n, sizes = users.n_users, users.sizes
        head = np.empty((n, 2), dtype=_LE)
        head[:, 0] = np.uint64(TAG_STATE) | (sizes.astype(np.uint64) << np.uint64(32))
        head[:, 1] = np.uint64(cfg)
        h = self.cipher(head, secrets)
        if not len(users.keys):
            return h
        # pairs sorted by key within each user, as 64-bit words k | q(v) << 32
        owners = users.owners
        order = np.lexsort((users.keys, owners))
        words = (users.keys[order].astype(np.uint64) | (quantise(users.values[order]) << np.uint64(32)))
        blocks_per_user = (sizes + 1) // 2
        padded = np.full((int(blocks_per_user.sum()) * 2,), PAD_KEY, dtype=_LE)
        block_start = np.concatenate([[0], np.cumsum(blocks_per_user)[:-1]])
        within = np.arange(len(words)) - np.repeat(users.offsets[:-1], sizes)
        padded[2 * np.repeat(block_start, sizes) + within] = words
        blocks = padded.reshape(-1, 2)
        for step in range(int(blocks_per_user.max())):
            who = np.flatnonzero(blocks_per_user > step)
            h[who] = self.cipher(h[who] ^ blocks[block_start[who] + step], secrets[who])
        return h


class MemoStreams:
    """Every user's permanent uniforms, computed on demand: block ``j`` of
    user ``u``'s stream holds the two uniforms ``U_u[2j]`` and ``U_u[2j+1]``."""

    def __init__(self, keys: DeviceKeys, secrets: np.ndarray, memo: np.ndarray):
        self._keys, self._secrets, self._memo = keys, secrets, memo

    @property
    def n_users(self) -> int:
        return len(self._memo)

    def _words(self, owners: np.ndarray, index: np.ndarray, tag: int) -> np.ndarray:
        ctr = np.empty((len(owners), 2), dtype=_LE)
        ctr[:, 0] = tag
        ctr[:, 1] = np.asarray(index).astype(np.uint64)
        return self._keys.cipher(self._memo[owners] ^ ctr, self._secrets[owners])

    def blocks_at(self, owners: np.ndarray, blocks: np.ndarray) -> np.ndarray:
        """``(U_o[2j], U_o[2j+1])`` for every ``(o, j)`` of ``zip(owners,
        blocks)``, shape ``(m, 2)`` (ragged requests)."""
        return to_uniform(self._words(np.asarray(owners, dtype=np.int64), blocks, TAG_CTR))

    def columns(self, count: int) -> np.ndarray:
        """The first ``count`` uniforms of every user, shape ``(n, count)``."""
        n, nblocks = self.n_users, (count + 1) // 2
        u = self.blocks_at(np.repeat(np.arange(n), nblocks), np.tile(np.arange(nblocks), n))
        return u.reshape(n, 2 * nblocks)[:, :count]

    def fingerprints(self) -> np.ndarray:
        """``fp_u(S_u)``: 64 bits naming the (device, state, configuration)
        without revealing it (the ledger's record of what was reported)."""
        n = self.n_users
        return self._words(np.arange(n), np.zeros(n, np.int64), TAG_FPR)[:, 0].copy()
