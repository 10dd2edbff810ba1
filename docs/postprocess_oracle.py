"""The smallest MSE any post-processing that treats the keys alike can reach
(docs/postprocess.md, "Where the target is out of reach").

The oracle knows the exact empirical distribution of the true ``(f, m)``
pairs over the keys and uses it as the prior, with each key's exact count
likelihood (``CountModel``: ``S_k | f`` and the value split ``| S_k, f,
m``); its posterior means are the best separable estimates (Robbins;
Greenshtein & Ritov 2009: also the limit of permutation-invariant ones).
No estimator that does not know the truth can do better on average.

    python docs/postprocess_oracle.py synthetic-gg 11,12,13
    python docs/postprocess_oracle.py clothing 11,12,13
"""
from __future__ import annotations

import sys

import numpy as np

from kvldp.datasets import SyntheticDataset
from kvldp.datasets.files import load_clothing
from kvldp.mechanisms import registry
from kvldp.mechanisms.estimation import metrics
from kvldp.mechanisms.estimation.countmodel import binomial_loglik, mixture
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.estimation.postprocess import postprocess_all
from kvldp.mechanisms.sizing import batch_size_for

MECHANISMS = ("pckv-ue", "pckv-grr", "ks-ue", "kvue", "privkv")
EPSILONS = (0.5, 1.0, 2.0, 4.0)


def oracle(est, tf, tm):
    """Posterior means of ``(f, m)`` under the true empirical prior."""
    cm = est.count_model
    pool = np.flatnonzero(np.isfinite(tm))
    fj, mj = tf[pool], tm[pool]
    hp, hm, h0 = (x[:, :1] for x in (cm.holder_plus, cm.holder_minus, cm.non_holder))
    pi = mixture(hp, hm, h0, fj[None, :], mj[None, :], cm.padding)
    present = pi[list(cm.present)].sum(axis=0)
    rho = pi[cm.plus] / present
    S, C, M = cm.present_counts, cm.plus_counts, cm.totals
    keys = np.flatnonzero(M > 0)
    f_hat, m_hat = np.full(est.d, np.nan), np.full(est.d, np.nan)
    for start in range(0, len(keys), 400):
        k = keys[start:start + 400]
        ll = (binomial_loglik(S[k, None], M[k, None], present[None, :], constant=False)
              + binomial_loglik(C[k, None], S[k, None], rho[None, :], constant=False))
        w = np.exp(ll - ll.max(axis=1, keepdims=True))
        w /= w.sum(axis=1, keepdims=True)
        f_hat[k], m_hat[k] = w @ fj, w @ mj
    return f_hat, m_hat


def main(dataset: str, seeds):
    for name in MECHANISMS:
        for eps in EPSILONS:
            acc: dict = {}
            for seed in seeds:
                data = (SyntheticDataset("gg", n_users=1_000_000, d=100, seed=seed) if dataset == "synthetic-gg"
                        else load_clothing())
                mech = registry.make(name, data.d, eps, **({"padding": data.default_padding}
                                                            if "padding" in registry.options_of(name) else {}))
                res = run_local(mech, data, seed, batch_size_for(mech, data.d))     # within 1 GiB
                tf, tm = res.true_values(data.d)
                raw, done = postprocess_all(res.estimates, ["raw", "eb+shrink"])
                held = np.flatnonzero(np.isfinite(raw.mean) & np.isfinite(tm))
                of, om = oracle(res.estimates, tf, tm)
                for label, f, m in (("raw", raw.frequency, raw.mean), ("default", done.frequency, done.mean),
                                    ("oracle", of, om)):
                    acc.setdefault(f"{label} f", []).append(metrics.mse(f, tf))
                    acc.setdefault(f"{label} m", []).append(metrics.mse(m, tm, held))
            a = {k: float(np.mean(v)) for k, v in acc.items()}
            print(f"| {name} | {eps:g} | " + " | ".join(
                f"{a[f'raw {q}']:.2g} / {a[f'default {q}']:.2g} ({a[f'default {q}'] / a[f'raw {q}']:.2f}x) / "
                f"{a[f'oracle {q}']:.2g} ({a[f'oracle {q}'] / a[f'raw {q}']:.2f}x)" for q in ("f", "m")) + " |",
                flush=True)


if __name__ == "__main__":
    main(sys.argv[1], [int(s) for s in sys.argv[2].split(",")])
