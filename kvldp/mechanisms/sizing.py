"""How many users a batch may hold: a memory budget over the report width.

A batch's memory is dominated by its reports and the perturbation's
temporaries, which grow with the report's width: a UE report has ``~b d``
set entries (PCKV-UE on Clothing at eps 0.5: ~2,300 per user), an IOH
report ``3^k`` bits, a GRR report one entry. A fixed batch of 50,000 users
is 10.5 GB for PCKV-UE on Clothing and 0.2 GB at d = 100. So the batch size
follows the report's width:

    batch = clamp((budget - BASELINE) / (PARALLEL_BATCHES * WORKING_SET_FACTOR * bytes_per_report),
                  MIN_BATCH, DEFAULT_BATCH_SIZE)

``budget`` is the whole process's: ``BASELINE`` is what the interpreter and
Beam take before any batch (~0.2 GB measured), and the local runner's two
workers each perturb a batch at once (``PARALLEL_BATCHES``).

``bytes_per_report`` is measured by perturbing a small probe batch of
*synthetic* users (random keys and values, a fixed seed): the batch size
then depends only on the mechanism, its parameters and d -- never on anyone's
data (it is part of the public layout of a collection) -- and is the same
in every round and invocation of a split collection.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from kvldp.mechanisms.base import DEFAULT_BATCH_SIZE, UserBatch
from kvldp.mechanisms.kv.longitudinal import Longitudinal
from kvldp.mechanisms.privacy.memo import DeviceKeys
from kvldp.mechanisms.protocol import Collection

DEFAULT_MEMORY_BUDGET = 1 << 30          # bytes: the whole job's peak RSS
BASELINE = 256 << 20                     # the interpreter, NumPy and Beam, before any batch
PARALLEL_BATCHES = 2                     # batches perturbed at once (the local runner's two workers)
# Peak bytes of one batch's perturb + encode per byte of its reports, measured
# on PCKV-UE (Clothing, eps 0.5, 50k users: reports 0.58 GB, peak 10.5 GB).
WORKING_SET_FACTOR = 20
MIN_BATCH = 100
PROBE_USERS = 256
PROBE_SEED = 0x6B766C6470          # fixed: the probe's users are synthetic, its reports thrown away


def report_bytes(reports) -> int:
    """The bytes of a report batch's arrays."""
    return sum(np.asarray(getattr(reports, f.name)).nbytes
               for f in dataclasses.fields(reports) if isinstance(getattr(reports, f.name), np.ndarray))


def probe_users(d: int, pairs_per_user: int, n: int = PROBE_USERS) -> UserBatch:
    """``n`` synthetic users each holding ``min(pairs_per_user, d)`` random keys."""
    rng = np.random.default_rng(PROBE_SEED)
    size = max(1, min(pairs_per_user, d))
    keys = np.argsort(rng.random((n, d)), axis=1)[:, :size] if d <= 4096 else \
        np.stack([rng.choice(d, size, replace=False) for _ in range(n)])
    values = rng.uniform(-1, 1, n * size)
    return UserBatch(np.arange(n + 1) * size, keys.ravel(), values, 0, np.arange(n))


def bytes_per_report(protocol, d: int) -> float:
    """Mean report bytes per user of round 1, over a synthetic probe batch."""
    pairs = int(getattr(protocol, "l", None) or getattr(getattr(protocol, "permanent", None), "l", None) or 2)
    users = probe_users(d, pairs)
    if isinstance(protocol, Longitudinal):     # probe devices: keys of their own, never the run's
        protocol = protocol.with_keys(DeviceKeys.from_seed(PROBE_SEED), "probe")
    state = protocol.initial_state(Collection.from_seed(PROBE_SEED))
    reports = protocol.perturb_round(0, protocol.participants(0, users, state),
                                     np.random.default_rng(PROBE_SEED), state)
    return report_bytes(reports) / max(1, users.n_users)


def batch_size_for(protocol, d: int, budget: int = DEFAULT_MEMORY_BUDGET) -> int:
    """Users per batch so that the job's batches in flight, on top of the
    baseline, stay within ``budget`` bytes."""
    per_user = WORKING_SET_FACTOR * max(bytes_per_report(protocol, d), 1.0)
    share = max(budget - BASELINE, budget // 4) / PARALLEL_BATCHES
    return int(np.clip(share // per_user, MIN_BATCH, DEFAULT_BATCH_SIZE))
