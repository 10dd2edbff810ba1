"""The two-layer (longitudinal) channel: a permanent report at ``eps_inf``,
an instantaneous randomisation at ``eps_1`` per report on top.

RAPPOR's permanent + instantaneous randomised response (Erlingsson, Pihur
and Korolova, CCS 2014 §3.1) and the longitudinal L-GRR / L-OUE / L-OSUE of
Arcolezi, Couchot, Al Bouna and Xiao (2021, "Improving the Utility of Locally
Differentially Private Protocols for Longitudinal and Multidimensional
Frequency Estimates", §3-4; the multi-freq-ldpy package) chain two
randomisers: the first (memoised, memo.py) bounds what any number of reports
of one state reveal, ``eps_inf``; the second, drawn afresh per report, bounds
one report, ``eps_1 <= eps_inf``.

Every instantaneous layer here is a *mixture*: keep the permanent symbol w.p.
``t``, else replace it by a draw from a fixed, data-independent distribution
``nu``. The composed channel of one report is ``t Q_1 + (1 - t) nu``, which

* stays in the permanent mechanism's own family, so its estimator and
  variance apply unchanged with the composed parameters (below); and
* has a per-report privacy loss that grows monotonically in ``t`` (each
  likelihood ratio ``(t P(y|u) + (1-t) nu(y)) / (t P(y|u') + (1-t) nu(y))`` is
  a linear-fractional function of ``t``, monotone, 1 at ``t = 0``), so
  ``t = max{t : eps(t) <= eps_1}`` is found by bisection on the exact,
  closed-form ``eps(t)``. ``eps_1 = eps_inf`` gives ``t = 1``: the memoised
  single layer.

Families (``a``: P(sampled key reported), ``b``: P(other key reported), ``p``:
P(value kept | key reported); PCKV.md; ``d' = d + l``):

* **GRR over the ``2 d'`` pairs** (PCKV-GRR): ``nu`` uniform over the pairs,
  i.e. GRR with keep ``t + (1-t)/(2d')`` (L-GRR's second layer).
  ``a_c = t a + (1-t)/d'``, ``b_c = t b + (1-t)/d'``,
  ``a_c p_c = t a p + (1-t)/(2d')``. Per report, with ``A = ap - b/2``,
  ``B = a(1-p) - b/2``: ``eps = ln[(l b/2 + A)/(l b/2 + min(B, 0))]`` (a
  report ``<k, s>`` has probability ``b/2 + w_{k,s} A + w_{k,-s} B`` for a
  user whose sampling puts ``w`` on ``<k, ±1>``, and ``w <= 1/l``; this is
  Theorem 3 of PCKV for its optimal parameters).
* **Ternary unary encoding** (PCKV-UE, KS-UE): position by position, keep
  w.p. ``t``, else redraw from ``(0: 1 - rho, ±1: rho/2)``.
  ``a_c = t a + (1-t) rho``, ``b_c = t b + (1-t) rho``,
  ``a_c p_c = t a p + (1-t) rho/2``. Per report (PCKV Theorem 2, which holds
  for any ``a, b, p`` and ``l``): ``eps = max{ln(p/(1-p)), ln(2ap/b) -
  ln min((1-a)/(1-b), 2a(1-p)/b)}``. **Choice** of ``rho``: ``2/3``, i.e. the
  symmetric per-position GRR over ``{-1, 0, +1}`` (``symmetric``), the ternary
  analogue of L-OSUE's symmetric second layer: measured against the ``rho``
  minimising the frequency variance (a bounded search), it is within 0.6 %
  for PCKV-UE and optimal for KS-UE at ``(eps_inf, eps_1) = (4, 1), (2, 0.5),
  (6, 1), (1, 0.2)``, and 1.2-38x better than ``rho = b`` (``sparse``: the
  reports stay as sparse as the permanent ones, for very large domains, where
  a symmetric report sets 2/3 of the ``d'`` positions).
* **GRR over ``k`` states** (KVUE's 3 states): ``nu`` uniform, so
  ``p_c = t p + (1-t)/k`` and ``t = (p_c - 1/k)/(p - 1/k)`` with
  ``p_c = e^eps_1/(e^eps_1 + k - 1)``: L-GRR, whose second round keeps w.p.
  ``p_2 = t + (1-t)/k``. (multi-freq-ldpy's closed form for ``p_2`` solves
  the two-state ratio ``(p_1 p_2 + q_1 q_2)/(p_1 q_2 + q_1 p_2) = e^eps_1``:
  exact for ``k = 2``, conservative for ``k > 2`` -- at ``k = 3``,
  ``(eps_inf, eps_1) = (2, 0.5)`` its report loses 0.46, not 0.5; the audit
  test shows both.)

Exact frequency variances of the composed channels are in ``longitudinal.py``
(they are those of the base estimators at the composed parameters).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

from kvldp.mechanisms.kv.pckv import PCKVParams

BISECTION_STEPS = 200


@dataclasses.dataclass(frozen=True)
class Channel:
    """Raw (unvalidated) parameters of a PCKV-shaped channel."""

    a: float
    b: float
    p: float

    def params(self, d: int, l: int) -> PCKVParams:
        return PCKVParams(a=self.a, b=self.b, p=self.p, d=d, l=l)


def of(params: PCKVParams) -> Channel:
    return Channel(params.a, params.b, params.p)


def grr_pairs_epsilon(ch: Channel, l: int) -> float:
    """Exact per-report loss of a PCKV-GRR-shaped channel with padding ``l``."""
    A, B = ch.a * ch.p - ch.b / 2, ch.a * (1 - ch.p) - ch.b / 2
    return math.log((l * ch.b / 2 + A) / (l * ch.b / 2 + min(B, 0.0)))


def ue_epsilon(ch: Channel, l: int = 1) -> float:
    """Exact per-report loss of a ternary-UE-shaped channel (any ``l``)."""
    a, b, p = ch.a, ch.b, ch.p
    value = math.log(p / (1 - p))
    key = math.log(2 * a * p / b) - math.log(min((1 - a) / (1 - b), 2 * a * (1 - p) / b))
    return max(value, key)


def mix_grr_pairs(ch: Channel, t: float, d_prime: int) -> Channel:
    """``t Q_1 + (1-t) Uniform(2 d' pairs)``."""
    a = t * ch.a + (1 - t) / d_prime
    return Channel(a, t * ch.b + (1 - t) / d_prime, (t * ch.a * ch.p + (1 - t) / (2 * d_prime)) / a)


SYMMETRIC, SPARSE = "symmetric", "sparse"
SECOND_LAYERS = (SYMMETRIC, SPARSE)


def ue_redraw(ch: Channel, second_layer: str) -> float:
    """``rho``: the probability that a redrawn position is non-zero."""
    if second_layer not in SECOND_LAYERS:
        raise ValueError(f"the UE second layer is one of {SECOND_LAYERS}, got {second_layer!r}")
    return 2.0 / 3.0 if second_layer == SYMMETRIC else ch.b


def mix_ue(ch: Channel, t: float, rho: float) -> Channel:
    """Per position ``t Q_1 + (1-t) (0: 1-rho, ±1: rho/2)``."""
    a = t * ch.a + (1 - t) * rho
    return Channel(a, t * ch.b + (1 - t) * rho, (t * ch.a * ch.p + (1 - t) * rho / 2) / a)


def grr_keep(epsilon: float, k: int) -> float:
    """GRR over ``k`` symbols: ``e^eps/(e^eps + k - 1)``."""
    e = math.exp(epsilon)
    return e / (e + k - 1)


def mixing_for(epsilon_of_t: Callable[[float], float], eps_1: float, eps_inf: float) -> float:
    """``max{t in [0, 1] : epsilon_of_t(t) <= eps_1}`` by bisection on the
    monotone ``epsilon_of_t``; 1 when ``eps_1 >= eps_inf``. The lower end of
    the final bracket is returned, so the loss is at most ``eps_1``. The pair
    was checked when the mechanism was built (``accountant.LongitudinalBudget``)."""
    if eps_1 >= eps_inf or epsilon_of_t(1.0) <= eps_1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2
        if epsilon_of_t(mid) <= eps_1:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-16:
            break
    return lo


def grr_pairs_mixing(ch: Channel, l: int, d_prime: int, eps_1: float, eps_inf: float) -> float:
    return mixing_for(lambda t: grr_pairs_epsilon(mix_grr_pairs(ch, t, d_prime), l) if t > 0 else 0.0,
                      eps_1, eps_inf)


def ue_mixing(ch: Channel, l: int, rho: float, eps_1: float, eps_inf: float) -> float:
    return mixing_for(lambda t: ue_epsilon(mix_ue(ch, t, rho), l) if t > 0 else 0.0, eps_1, eps_inf)


def grr_mixing(k: int, eps_1: float, eps_inf: float) -> float:
    """L-GRR's ``t`` in closed form (see the module docstring; the pair was
    checked when the mechanism was built)."""
    if eps_1 >= eps_inf:
        return 1.0
    return (grr_keep(eps_1, k) - 1 / k) / (grr_keep(eps_inf, k) - 1 / k)
