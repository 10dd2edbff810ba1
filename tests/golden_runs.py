"""Fingerprints of every registered mechanism's reports, counts and estimates
for fixed seeds (the golden-file test, ``test_golden.py``).

A fingerprint is a SHA-256 over the exact bytes of each array, so "equal"
means bit-identical. ``python tests/golden_runs.py`` rewrites
``tests/golden/fingerprints.json``; only do that for a change that is meant
to alter what a seed produces, and say so in the commit.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import sys

import numpy as np

from kvldp.mechanisms.privacy.randomness import SimulationSeed

ROOT = pathlib.Path(__file__).resolve().parent
GOLDEN = ROOT / "golden" / "fingerprints.json"
SEED = 20261123
D = 8
USERS = 3000
BATCH = 700
OPTIONS = {"ioh-oue": {"ioh_keys": (0, 1, 2)}, "ioh-sue": {"ioh_keys": (0, 3)},
           "pckv-ue": {"padding": 2}, "pckv-grr": {"padding": 2}, "ks-ue": {"padding": 2},
           "ks-grr": {"top": 2}, "ks-adap": {"top": 2}}
EPSILON = 2.0


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.ascontiguousarray(a)
        if a.dtype == object:
            h.update("\x00".join(map(str, a.tolist())).encode())
        else:
            h.update(str(a.dtype).encode())
            h.update(a.tobytes())
    return h.hexdigest()[:24]


def _batch_arrays(batch) -> list:
    return [getattr(batch, f.name) for f in dataclasses.fields(batch)
            if isinstance(getattr(batch, f.name), np.ndarray)]


def _estimates(est) -> dict:
    return {name: _digest(getattr(est, name)) for name in (
        "frequency", "mean", "frequency_raw", "mean_raw", "frequency_se", "mean_se",
        "frequency_status", "mean_status")} | {"n_reports": int(est.n_reports)}


def fingerprints(api) -> dict:
    """``api``: the few entry points this file needs, so the test can follow
    renames without touching the golden data."""
    out = {}
    data = api.dataset("multi", USERS, D, SEED)
    for name in api.names():
        mech = api.make(name, D, EPSILON, **OPTIONS.get(name, {}))
        # the fingerprints predate the cryptographic noise generator: PCG64DXSM, as then
        rounds = api.run(mech, data, SimulationSeed(SEED), BATCH)
        out[name] = {
            "rounds": [{"reports": _digest(*[a for b in reports for a in _batch_arrays(b)]),
                        "counts": _digest(counts)} for reports, counts in rounds["rounds"]],
            "estimates": _estimates(rounds["estimates"]),
        }
    return out


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT.parent))
    sys.path.insert(0, str(ROOT))
    from golden_api import API
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(fingerprints(API), indent=1, sort_keys=True) + "\n")
    print(f"wrote {GOLDEN}")
