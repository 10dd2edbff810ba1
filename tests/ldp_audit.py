"""Shared pieces of the exact privacy audits (enumerate inputs and outputs).

Only vertex values ``v in {-1, +1}`` are enumerated: every report
distribution audited here is affine in each held value (``Disc(v) = +1``
w.p. ``(1+v)/2``), so a user with interior values has a convex combination of
vertex users' distributions, and a ratio of two convex combinations never
exceeds the largest ratio between their components.
"""
from __future__ import annotations

import itertools
import math

import numpy as np


def keep(eps: float) -> float:
    """Randomised response keep probability ``e^eps/(e^eps+1)``, written out."""
    return math.exp(eps) / (math.exp(eps) + 1)


def all_users(d: int):
    """Every key set ``S ⊆ {0..d-1}`` (empty and large sets included) with
    every ±1 assignment: ``3^d`` users as ``[(key, value), …]``."""
    for r in range(d + 1):
        for keys in itertools.combinations(range(d), r):
            for vals in itertools.product((-1.0, 1.0), repeat=r):
                yield list(zip(keys, vals, strict=True))


def log_worst_ratio(P) -> float:
    """``ln max P(y|u)/P(y|u')`` over users (rows) and outputs (columns), after
    checking every row is a probability distribution with full support."""
    P = np.asarray(P, dtype=np.float64)
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    assert np.all(P > 0)
    return math.log((P.max(axis=0) / P.min(axis=0)).max())


def check_vertex_argument(mech, eps: float, users_per_size: int):
    """The premise of enumerating vertices only: a report distribution is
    affine in each held value, and users with fractional values stay within
    ``eps``."""
    for v in (-0.6, 0.0, 0.35):
        mixed = mech.output_probabilities([(0, 1.0), (2, v)])
        plus = mech.output_probabilities([(0, 1.0), (2, 1.0)])
        minus = mech.output_probabilities([(0, 1.0), (2, -1.0)])
        np.testing.assert_allclose(mixed, (1 + v) / 2 * plus + (1 - v) / 2 * minus, rtol=1e-12, atol=0)
    rng = np.random.default_rng(7)
    users = [[(int(k), rng.uniform(-1, 1)) for k in sorted(rng.choice(3, size=s, replace=False))]
             for s in (0, 1, 2, 3) for _ in range(users_per_size)]
    P = np.array([mech.output_probabilities(u) for u in users])
    assert math.log((P.max(axis=0) / P.min(axis=0)).max()) <= eps + 1e-9
