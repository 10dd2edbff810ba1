"""Shared pieces of the KSKV tests (``test_kskv_*.py``): KS-UE, KS-GRR and
KS-Adap (SPEC.md §4; Zhao et al. 2024, §4 Algorithms 1-2, formulas (5)-(7),
Theorem 4.2; §5 NCR).

Expectations are written out from the paper / SPEC.md, here and in the test
files, never read back from the code under test:

* KS-UE (Alg. 1): ``p = (e^eps+1)/(2(e^eps+2))``, ``a = 2/(e^eps+2)``; the
  user's position keeps ``x`` w.p. p, flips w.p. 1-2p, is 0 w.p. p (formula
  (4)); every other position is ±1 w.p. a/2 each (formula (3)).
  ``Var f_hat`` = Theorem 4.2 Eq. (9), exact.
* KS-GRR (formula (7)): GRR over the ``2|K'| = 4t+2`` pairs of
  ``K' = TKS ∪ {⊥}``, ``p = e^eps/(e^eps+4t+1)``, ``q = 1/(e^eps+4t+1)``;
  ``f = ((n+ + n-)/n - 2q)/(p-q)``, ``m = (n+ - n-)/((p-q) f n)`` (the
  paper's ``p+q`` is the erratum).
* KS-Adap (SPEC.md choice): GRR over ``TKS ∪ {l dummies}`` after
  padding-and-sampling with the adaptively chosen l, frequencies times l.

Statistical bands (tolerances.py): ``Z_POOLED`` = 4 s.e. for pooled
statistics, ``Z`` = 4.5 s.e. per key (Bonferroni over <= 100 keys). Where
the s.e. is the empirical s.d. over R repeats, R >= 24 (t on 23 d.o.f.:
P(|t| > 4.5) ~ 1.6e-4 per key, over <= 10 keys < 2e-3).
"""
import math

import numpy as np

from kvldp.mechanisms.protocol import Collection, assign_groups


def ks_ue_p_a(eps):
    """Algorithm 1's (p, a)."""
    e = math.exp(eps)
    return (e + 1) / (2 * (e + 2)), 2 / (e + 2)


def formula7(t, eps):
    """KS-GRR's (p, q) of formula (7), |K'| = 2t + 1."""
    e = math.exp(eps)
    return e / (e + 4 * t + 1), 1 / (e + 4 * t + 1)


def olh_written_out(eps, support, n):
    """OLH (Wang et al. 2017): g = round(e^eps) + 1, p = e^eps/(e^eps+g-1),
    q = 1/g; unbiased frequency and its variance."""
    e = math.exp(eps)
    g = max(2, round(e) + 1)
    p, q = e / (e + g - 1), 1 / g
    f = (np.asarray(support, dtype=np.float64) - n * q) / (p - q) / n
    fc = np.clip(f, 0, 1)
    var = (q * (1 - q) + fc * (p * (1 - p) - q * (1 - q))) / (n * (p - q) ** 2)
    return f, var


def group_sizes(dataset, seed, shares):
    """Users per group, from assign_groups over the dataset's batches, under
    the collection a run with ``seed`` uses."""
    key = Collection.from_seed(seed).key
    out = np.zeros(len(shares), dtype=np.int64)
    for b, start, stop in dataset.specs():
        out += np.bincount(assign_groups(key, b, stop - start, shares), minlength=len(shares))
    return out
