"""The frequency-oracle kernels against the plain NumPy floor and the peers.

*Floor*: the shortest correct vectorised NumPy of each oracle (GRR: keep
or draw another item; OUE: an n x d Bernoulli matrix; OLH: hash, GRR over
g values, and support by testing every item against every report), run on
the same cryptographic ``Generator`` as kvldp's kernel, so the ratio is the
cost of kvldp's code and not of its noise. kvldp's kernels are
``mechanisms.oracles``'s ``perturb`` + ``support``.

*Peers* (``pip install 'kvldp[bench]'``: pure-LDP 1.2.0, multi-freq-ldpy
0.2.5): each oracle's client over n users and its server's estimate, as a
whole command in a process of its own (imports included), next to kvldp's
whole ``simulate`` command of the mechanism built on that oracle
(PCKV-GRR on GRR, PCKV-UE on OUE: key-value work, strictly more than a
frequency oracle's), once with the paper's raw estimator (what the peers
output) and once with the default post-processing.
"""
from __future__ import annotations

import importlib.util
import math
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

from kvldp.mechanisms.frequency.oracles import GRR, OLH, OUE
from kvldp.mechanisms.privacy.randomness import batch_rng

ORACLES = ("grr", "oue", "olh")
PEER_PACKAGES = {"pure-ldp": "pure_ldp", "multi-freq-ldpy": "multi_freq_ldpy"}
ON_ORACLE = {"grr": "pckv-grr", "oue": "pckv-ue"}


def floor_grr(x, d, eps, rng):
    p = math.exp(eps) / (math.exp(eps) + d - 1)
    keep = rng.random(len(x)) < p
    other = rng.integers(0, d - 1, size=len(x))
    return np.bincount(np.where(keep, x, other + (other >= x)), minlength=d)


def floor_oue(x, d, eps, rng, chunk=20_000):
    q = 1.0 / (math.exp(eps) + 1)
    support = np.zeros(d, dtype=np.int64)
    for s in range(0, len(x), chunk):
        part = x[s:s + chunk]
        bits = rng.random((len(part), d)) < q
        bits[np.arange(len(part)), part] = rng.random(len(part)) < 0.5
        support += bits.sum(axis=0)
    return support


def floor_olh(x, d, eps, rng, chunk=20_000):
    g = round(math.exp(eps)) + 1
    prime = (1 << 31) - 1
    a = rng.integers(1, prime, size=len(x))
    b = rng.integers(0, prime, size=len(x))
    h = ((a * x + b) % prime) % g
    p = math.exp(eps) / (math.exp(eps) + g - 1)
    keep = rng.random(len(x)) < p
    other = rng.integers(0, g - 1, size=len(x))
    y = np.where(keep, h, other + (other >= h))
    support = np.zeros(d, dtype=np.int64)
    items = np.arange(d)
    for s in range(0, len(x), chunk):
        hashed = ((a[s:s + chunk, None] * items + b[s:s + chunk, None]) % prime) % g
        support += (hashed == y[s:s + chunk, None]).sum(axis=0)
    return support


FLOORS = {"grr": floor_grr, "oue": floor_oue, "olh": floor_olh}


def kvldp_kernel(name, x, d, eps, rng):
    oracle = {"grr": GRR, "oue": OUE, "olh": OLH}[name](d, eps)
    reports = oracle.perturb(x, rng)
    if name == "oue":
        return oracle.support(reports[1])
    if name == "olh":
        return oracle.support(*reports)
    return oracle.support(reports)


def kernels(n: int = 1_000_000, d: int = 100, eps: float = 4.0, seed: int = 1) -> list[dict]:
    """Users/s of kvldp's kernel and of the floor, per oracle (best of 3)."""
    x = np.random.default_rng(seed).integers(0, d, size=n)
    rows = []
    for name in ORACLES:
        times = {}
        for who, run in (("kvldp", lambda r, name=name: kvldp_kernel(name, x, d, eps, r)),
                         ("floor", lambda r, name=name: FLOORS[name](x, d, eps, r))):
            best = math.inf
            for repeat in range(3):
                rng = batch_rng(seed, repeat)          # the same cryptographic generator for both
                start = time.perf_counter()
                run(rng)
                best = min(best, time.perf_counter() - start)
            times[who] = best
        rows.append({"oracle": name, "users": n, "d": d, "epsilon": eps,
                     "kvldp_users_per_s": round(n / times["kvldp"]), "floor_users_per_s": round(n / times["floor"]),
                     "floor_over_kvldp": round(times["kvldp"] / times["floor"], 3)})
    return rows


PEER_SCRIPTS = {
    ("pure-ldp", "grr"): """
from pure_ldp.frequency_oracles.direct_encoding import DEClient, DEServer
client, server = DEClient(epsilon={eps}, d={d}), DEServer(epsilon={eps}, d={d})
for item in data:
    server.aggregate(client.privatise(int(item) + 1))
estimates = [server.estimate(i + 1) for i in range({d})]
""",
    ("pure-ldp", "oue"): """
from pure_ldp.frequency_oracles.unary_encoding import UEClient, UEServer
client = UEClient(epsilon={eps}, d={d}, use_oue=True)
server = UEServer(epsilon={eps}, d={d}, use_oue=True)
for item in data:
    server.aggregate(client.privatise(int(item) + 1))
estimates = [server.estimate(i + 1) for i in range({d})]
""",
    ("multi-freq-ldpy", "grr"): """
from multi_freq_ldpy.pure_frequency_oracles.GRR import GRR_Client, GRR_Aggregator_MI
reports = [GRR_Client(int(item), {d}, {eps}) for item in data]
estimates = GRR_Aggregator_MI(reports, {d}, {eps})
""",
    ("multi-freq-ldpy", "oue"): """
from multi_freq_ldpy.pure_frequency_oracles.UE import UE_Client, UE_Aggregator_MI
reports = [UE_Client(int(item), {d}, {eps}, True) for item in data]
estimates = UE_Aggregator_MI(reports, {eps}, True)
""",
}


def installed_peers() -> list[str]:
    return [name for name, module in PEER_PACKAGES.items() if importlib.util.find_spec(module) is not None]


def timed_command(argv: list[str], timeout: float = 3600, repeats: int = 1) -> tuple[float, str]:
    """The fastest of ``repeats`` runs of a command, or its first failure."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if proc.returncode:
            return time.perf_counter() - start, (proc.stderr.strip().splitlines() or ["?"])[-1][:200]
        best = min(best, time.perf_counter() - start)
    return best, ""


def peers(sizes=(100_000, 1_000_000), d: int = 100, eps: float = 4.0, seed: int = 1, repeats: int = 1) -> list[dict]:
    """Whole-command wall times (the fastest of ``repeats``): each installed
    peer's oracle and kvldp's Beam ``simulate`` of the mechanism built on it."""
    rows = []
    scratch = tempfile.mkdtemp(prefix="kvldp-peers-")
    for oracle, mechanism in ON_ORACLE.items():
        for n in sizes:
            # raw: the paper's estimator, what the peers output; the default adds empirical-Bayes post-processing
            for method in ("raw", "eb+shrink"):
                seconds, error = timed_command([sys.executable, "-m", "kvldp", "simulate",
                                                "--mechanism", mechanism, "--epsilon", f"{eps:g}", "--users", str(n),
                                                "--keys", str(d), "--seed", str(seed), "--postprocess", method,
                                                "--output", f"{scratch}/e.jsonl"], repeats=repeats)
                rows.append({"who": f"kvldp {mechanism} (beam, {method})", "oracle": oracle, "users": n,
                             "seconds": seconds, "error": error})
            for peer in installed_peers():
                body = PEER_SCRIPTS[(peer, oracle)].format(eps=eps, d=d)
                script = (f"import numpy as np\ndata = np.random.default_rng({seed}).integers(0, {d}, size={n})\n"
                          + body)
                seconds, error = timed_command([sys.executable, "-c", script], repeats=repeats)
                rows.append({"who": peer, "oracle": oracle, "users": n, "seconds": seconds, "error": error})
    shutil.rmtree(scratch, ignore_errors=True)
    return rows
