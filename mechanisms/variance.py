"""Standard errors by the delta method over multinomial counts.

For ratio estimators (PrivKV, PrivKV-A, …) the papers give no closed-form
variance. Each key's reports fall into ``c`` categories with counts
``C ~ Multinomial(M, pi)``; for an estimator ``g(C)``,
``Var g ≈ M [sum_i g_i^2 pi_i - (sum_i g_i pi_i)^2]`` with ``g_i = dg/dC_i``
at the observed counts (plug-in ``pi = C / M``). Gradients are central
differences, so any vectorised estimator works unchanged.
"""
from __future__ import annotations

from typing import Callable

import numpy as np


def multinomial_delta_variance(estimator: Callable[[np.ndarray], np.ndarray], counts: np.ndarray,
                               rel_step: float = 1e-4) -> np.ndarray:
    """Per-key variance of ``estimator(counts)``; ``counts`` has shape ``(c, d)``
    (category x key) and the estimator must take the total from the counts."""
    counts = np.asarray(counts, dtype=np.float64)
    total = counts.sum(axis=0)
    step = np.maximum(1.0, rel_step * total)
    grads = np.empty_like(counts)
    with np.errstate(divide="ignore", invalid="ignore"):
        for i in range(counts.shape[0]):
            up, down = counts.copy(), counts.copy()
            up[i] += step
            down[i] -= step
            grads[i] = (estimator(up) - estimator(down)) / (2 * step)
        pi = counts / total
        var = total * ((grads ** 2 * pi).sum(axis=0) - (grads * pi).sum(axis=0) ** 2)
    return np.where(np.isfinite(var), np.maximum(var, 0.0), np.inf)
