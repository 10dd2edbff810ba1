"""Shared pieces of the PrivKV-family tests (``test_privkv*.py``): SPEC.md §1;
Ye et al. 2019 Alg. 2-7, Theorems 5.1-6.1; Sun et al. 2019 §III for PrivKV-A.

Statistical checks run a mechanism R times on *fixed* data with fresh
perturbation seeds and compare the average of an estimator with its
expectation. Unless said otherwise the standard error is the empirical s.d.
over the R repeats / sqrt(R) (tolerances.z_scores), and the band is
``Z`` = 4.5 s.e. per key (Bonferroni over <= 10 keys: with a t distribution
on R - 1 >= 39 d.o.f. P(|t| > 4.5) < 1e-4 per key). Expectations are written
out from the papers in the tests, never read back from the code under test.

A remark that recurs: with ``p = e^eps/(e^eps+1)``,
``f p - f - p + 1 = (1-f)(1-p)`` and ``2 f p - f - p + 1 = f p + (1-f)(1-p)``,
so Theorem 5.3's theta is the share of non-holders among the users whose
key bit comes out 1: the mean of one LPP round is (up to O(1/N) ratio
bias) ``theta * E[Disc(m~)] + (1 - theta) * m``.
"""
import numpy as np

from kvldp.mechanisms.base import UserBatch


def theta(f, p):
    """Theorem 5.3 / Alg. 7: (f p - f - p + 1)/(2 f p - f - p + 1)."""
    f = np.asarray(f, dtype=np.float64)
    return (f * p - f - p + 1) / (2 * f * p - f - p + 1)


def tabular_users(n, key_probs, key_means, spread, seed):
    """Hand-built multi-pair users: user i holds key k independently w.p.
    key_probs[k] with value clip(key_means[k] + N(0, spread)) -- so values
    include exact +-1 and interior points and Disc is genuinely random."""
    rng = np.random.default_rng(seed)
    d = len(key_probs)
    hold = rng.random((n, d)) < np.asarray(key_probs)[None, :]
    _, keys = np.nonzero(hold)                   # row-major: keys sorted per user
    values = np.clip(np.asarray(key_means)[keys] + rng.normal(0, spread, len(keys)), -1, 1)
    offsets = np.concatenate([[0], np.cumsum(hold.sum(axis=1))])
    return UserBatch(offsets, keys, values)
