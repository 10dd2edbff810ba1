"""Standard errors by the delta method over multinomial counts.

For ratio estimators (PrivKV-A, F2M, KVUE, …) the papers give no closed-form
variance. Each key's reports fall into ``c`` categories with counts
``C ~ Multinomial(M, pi)``; for an estimator ``g(C)``,
``Var g ≈ M [sum_i g_i^2 pi_i - (sum_i g_i pi_i)^2]`` with ``g_i = dg/dC_i``
at the expected counts ``M pi``. Gradients are central differences, so any
vectorised estimator works unchanged.

Where ``pi`` comes from matters. The observed shares ``C / M`` (the plain
plug-in) make the variance 0 wherever a category is empty -- on a sparse key
a zero s.e. next to an estimate that is wrong. So the mechanisms pass
``probabilities``: the report distribution their model gives at the
estimates clipped into the model's range (frequency in ``[0, 1]``, mean in
``[-1, 1]``). Inside that range it equals the plug-in for a model with as
many free parameters as the multinomial (PrivKV-A, KVUE); at its boundary it
keeps the perturbation's noise floor (a non-holder's report is random too),
so the variance stays positive.
"""
from __future__ import annotations

from collections.abc import Callable

import numpy as np


def multinomial_delta_variance(estimator: Callable[[np.ndarray], np.ndarray], counts: np.ndarray,
                               probabilities: np.ndarray | None = None, rel_step: float = 1e-6) -> np.ndarray:
    """Per-key variance of ``estimator(counts)``; ``counts`` has shape ``(c, d)``
    (category x key) and the estimator must take the total from the counts.

    With ``probabilities`` (shape ``(c, d)``, columns summing to 1) the
    gradient and the covariance are evaluated at the expected counts
    ``M * probabilities`` (``M`` the observed total per key); without, at the
    observed counts. NaN for keys without reports (``M = 0``) or where the
    estimator is undefined at that point.
    """
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum(axis=0)
    if probabilities is not None:
        pi = np.asarray(probabilities, dtype=np.float64)
        at = pi * total
    else:
        with np.errstate(divide="ignore", invalid="ignore"):
            pi = counts / total
        at = counts
    # central differences with a step relative to each count (a ratio
    # estimator is far from linear over a step comparable to a small count)
    floor = 1e-6 * np.maximum(total, 1.0)
    grads = np.empty_like(at)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(at.shape[0]):
            step = rel_step * np.maximum(np.abs(at[i]), floor)
            up, down = at.copy(), at.copy()
            up[i] += step
            down[i] -= step
            grads[i] = (estimator(up) - estimator(down)) / (2 * step)
        var = total * ((grads ** 2 * pi).sum(axis=0) - (grads * pi).sum(axis=0) ** 2)
    return np.where(np.isfinite(var) & (total > 0), np.maximum(var, 0.0), np.nan)


def mixture(holder_plus, holder_minus, non_holder, f, m, padding: int = 1) -> np.ndarray:
    """``s (1+m)/2 h+ + s (1-m)/2 h- + (1-s) h0`` with ``s = f/padding``
    (the symbol axis first in the ``h``, broadcast against ``f`` and ``m``)."""
    s = f / padding
    return s * (1 + m) / 2 * holder_plus + s * (1 - m) / 2 * holder_minus + (1 - s) * non_holder


def mixture_probabilities(f, m, holder_plus: np.ndarray, holder_minus: np.ndarray,
                          non_holder: np.ndarray) -> np.ndarray:
    """Report distribution ``(c, d)`` of a sampled key's reports when a share
    ``f`` of the users hold it with mean ``m``: holders are ``+1`` w.p.
    ``(1+m)/2`` (symbol distribution ``holder_plus``), ``-1`` otherwise
    (``holder_minus``); non-holders report by ``non_holder`` (each ``(c,)`` or
    ``(c, d)``). ``f`` and ``m`` are clipped into ``[0, 1]`` and ``[-1, 1]``."""
    f = np.clip(np.nan_to_num(np.asarray(f, dtype=np.float64)), 0.0, 1.0)
    m = np.clip(np.nan_to_num(np.asarray(m, dtype=np.float64)), -1.0, 1.0)
    col = lambda x: np.asarray(x, dtype=np.float64).reshape(len(x), -1)   # noqa: E731
    return mixture(col(holder_plus), col(holder_minus), col(non_holder), f, m)
