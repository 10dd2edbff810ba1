"""Shared pieces of the IOH tests (``test_ioh_*.py``): IOH and the L-way
conditional queries (SPEC.md §2; Sun et al. 2019 §V, Alg. 6, Definitions
2-6, Table III; Sun et al. 2021 §3, 表 1, 算法 1).

Notation: state ``<1,-1> -> 0``, ``<0,0> -> 1``, ``<1,+1> -> 2``; with k
chosen keys the cell of a user is ``I = sum_j 3^(k-1-j) s_j`` (key 0 most
significant); the report is the one-hot of I over 3^k bits perturbed by
unary encoding (p, q): SUE p = e^(eps/2)/(e^(eps/2)+1), q = 1 - p; OUE
p = 1/2, q = 1/(e^eps+1). ``A_s[i] = (C[i] - n q)/(p - q)``.

Statistical checks use fixed seeds; bands are ``Z`` = 4.5 s.e.
(tolerances.py; P(|z| > 4.5) = 7e-6 each: Bonferroni over 27 cells, and
over the 216 estimates of the k = 4 queries a family-wise rate < 0.2%).
Expectations and variances are written out in the tests from the papers,
never read back from the code under test.
"""
import itertools
import math


def ue_params(variant, eps):
    """(p, q) of SUE / OUE (Wang et al. 2017), written out."""
    if variant == "sue":
        e = math.exp(eps / 2)
        return e / (e + 1), 1 / (e + 1)
    return 0.5, 1 / (math.exp(eps) + 1)


def all_queries(k):
    """Every target with every condition on the other keys (held / not)."""
    out = []
    for t in range(k):
        others = [j for j in range(k) if j != t]
        for r in range(k):
            for keys in itertools.combinations(others, r):
                out.extend((t, dict(zip(keys, vals, strict=True)))
                           for vals in itertools.product((True, False), repeat=r))
    return out
