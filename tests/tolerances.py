"""Statistical tolerances shared by the tests (in the spirit of
privacy-on-beam's test tolerance helpers): one place for the z-bands and the
standard errors the statistical checks compare against.

A statistical check asserts ``|x - mu| <= z * sigma`` for an estimate ``x``
with expectation ``mu`` and standard error ``sigma``. Under a normal
approximation a correct implementation fails one such comparison with
probability ``P(|N(0, 1)| > z) = erfc(z / sqrt(2))`` (see
:func:`false_failure_rate`); a test making ``K`` comparisons fails falsely
with probability at most ``K`` times that (Bonferroni). Every test fixes its
seeds, so its outcome is deterministic; the rate is the chance that a
correct implementation trips the band under another seed (or after a
change that only reorders the random draws).

* ``Z = 4.5``: per key / cell / output, ``6.8e-6`` per comparison, so
  ``< 1e-3`` over 100 comparisons and ``< 2e-3`` over 216 (the largest
  Bonferroni family in the tests). With the empirical s.d. of ``R`` repeats
  as the s.e. the statistic is Student-t on ``R - 1`` d.o.f.:
  ``P(|t| > 4.5) = 1.6e-4`` at ``R = 24``, ``6e-5`` at ``R = 40``.
* ``Z_FEW = 4``: a pooled statistic (a variance ratio, a coverage, a group
  share) or a small family of comparisons: ``6.3e-5`` per comparison, so
  ``< 1e-3`` over up to 15.
"""
from __future__ import annotations

import math

import numpy as np

Z = 4.5
"""Per-key z-band: ``|x - mu| < Z * sigma``; false failure ``6.8e-6`` per
comparison (``K * 6.8e-6`` over ``K`` keys)."""

Z_FEW = 4.0
"""z-band of a pooled statistic or of a few comparisons:
``|x - mu| < Z_FEW * sigma``; false failure ``6.3e-5`` per comparison."""


def false_failure_rate(z: float = Z, comparisons: int = 1) -> float:
    """Probability that at least one of ``comparisons`` independent correct
    normal estimates leaves its band: ``1 - (1 - erfc(z / sqrt(2)))^K``
    (``<= K * erfc(z / sqrt(2))``). ``Z`` gives ``6.8e-6`` for ``K = 1`` and
    ``6.8e-4`` for ``K = 100``."""
    return -math.expm1(comparisons * math.log1p(-math.erfc(z / math.sqrt(2))))


def z_scores(samples, truth):
    """Per key, ``(mean_r x_r - mu) / (s / sqrt(R))``, with ``s`` the
    empirical s.d. (``ddof = 1``) of the ``R`` repeats (rows of ``samples``).
    Compared with ``Z``: Student-t on ``R - 1`` d.o.f., false failure
    ``1.6e-4`` per key at ``R = 24`` (``6e-5`` at ``R = 40``)."""
    samples = np.asarray(samples, dtype=np.float64)
    se = samples.std(axis=0, ddof=1) / math.sqrt(samples.shape[0])
    return (samples.mean(axis=0) - truth) / se


def z_known_variance(errors, variances):
    """Per key, the z of the errors pooled over ``R`` runs (rows) whose
    variances are known from the theory: ``sum_r e_r / sqrt(sum_r Var_r)``,
    i.e. the mean error over its s.e. ``sqrt(sum_r Var_r) / R``. Standard
    normal when the theory holds: ``|z| < Z`` fails falsely w.p. ``6.8e-6``
    per key."""
    return np.asarray(errors).sum(axis=0) / np.sqrt(np.asarray(variances).sum(axis=0))


def binomial_sigma(p, n):
    """S.d. of the share of ``n`` Bernoulli(``p``) draws,
    ``sigma = sqrt(p (1 - p) / n)``: a share is within the band when
    ``|share - p| < Z * sigma``."""
    return np.sqrt(p * (1 - p) / n)


def binomial_z(share, p, n):
    """``(share - p) / sqrt(p (1 - p) / n)``, elementwise: the z of observed
    shares of ``n`` draws against their probabilities ``p``."""
    return (share - p) / binomial_sigma(p, n)


def assert_counts_match(counts, probs, n):
    """Every output's empirical frequency within ``Z`` binomial sigma:
    ``|counts / n - p| < Z sqrt(p (1 - p) / n)`` for every output, after
    checking ``n min(p) > 50`` (the normal approximation needs expected
    counts well above 0). False failure ``<= K * 6.8e-6`` over ``K``
    outputs."""
    probs = np.asarray(probs)
    assert n * probs.min() > 50, "too few expected counts for a normal approximation"
    z = binomial_z(counts / n, probs, n)
    assert np.all(np.abs(z) < Z), (np.abs(z).max(), int(np.abs(z).argmax()))


def mean_square_se(k):
    """Relative s.e. of the mean of ``k`` squared standard normals,
    ``sqrt(2 / k)`` (``chi^2_k / k`` has variance ``2 / k``): a variance
    formula is right when ``|mean(z^2) - 1| < z_band * sqrt(2 / k)``."""
    return math.sqrt(2 / k)
