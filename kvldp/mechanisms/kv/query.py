"""L-way conditional frequency and mean queries over IOH cell counts
(Sun et al. 2019 §V-A/B, Definitions 2-6; SPEC.md §2).

The calibrated cell counts ``A_s`` are reshaped into a ``3 x … x 3``
tensor, axis ``j`` = chosen key ``j`` with states ``0`` (``<1,-1>``), ``1``
(``<0,0>``), ``2`` (``<1,+1>``). A condition fixes, per conditioning key,
"held" (states ``{0, 2}``) or "not held" (``{1}``); other keys are summed
over. ``F(C)`` = the tensor summed over the cells ``C`` admits (one
``np.ix_`` selection per query, never a list of ``3^k`` indices):

* ``f(k | C) = F(C, k held) / F(C)``;
* ``m(k | C) = (F(C, k = 2) - F(C, k = 0)) / F(C, k held)``.

Cells are independent (each report bit is perturbed independently), so a
sum's variance is the sum of the cells' variances and the ratios' standard
errors follow by the delta method with independent numerator/complement.
Default outputs clip negative counts at 0 and ratios into ``[0, 1]`` /
``[-1, 1]``; raw ratios are returned too.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from kvldp.mechanisms.estimation.truth import exact_sums
from kvldp.mechanisms.kv.cells import state_index

HELD = (0, 2)
NOT_HELD = (1,)


@dataclasses.dataclass(frozen=True)
class QueryResult:
    frequency: float
    mean: float
    frequency_raw: float
    mean_raw: float
    frequency_se: float
    mean_se: float
    users_in_condition: float

    def as_tuple(self):
        return (self.frequency, self.mean, self.frequency_raw, self.mean_raw, self.frequency_se, self.mean_se)


@dataclasses.dataclass(frozen=True)
class CellTable:
    """Users per IOH cell as a ``(3,)*k`` tensor, with per-cell variances."""

    cells: np.ndarray
    variance: np.ndarray

    @property
    def k(self) -> int:
        return self.cells.ndim

    @classmethod
    def from_vector(cls, cells, variance=None) -> CellTable:
        cells = np.asarray(cells, dtype=np.float64)
        k = round(float(np.log(len(cells)) / np.log(3)))
        if 3 ** k != len(cells):
            raise ValueError(f"{len(cells)} cells is not a power of 3")
        var = np.zeros_like(cells) if variance is None else np.asarray(variance, dtype=np.float64)
        return cls(cells.reshape((3,) * k), var.reshape((3,) * k))

    @classmethod
    def from_counts(cls, mechanism, counts) -> CellTable:
        A, var = mechanism.cell_counts(counts)
        return cls.from_vector(A, var)

    @classmethod
    def exact(cls, states: np.ndarray) -> CellTable:
        """Unperturbed counts of users' (already discretised) states ``(n, k)``."""
        states = np.asarray(states)
        return cls.from_vector(np.bincount(state_index(states), minlength=3 ** states.shape[1]))

    def select(self, constraints: Mapping[int, Sequence[int]]):
        """``(sum, variance)`` of the cells whose key ``j`` is in ``constraints[j]``."""
        for j in constraints:
            if not 0 <= j < self.k:
                raise ValueError(f"key axis {j} outside [0, {self.k})")
        index = np.ix_(*[list(constraints.get(j, (0, 1, 2))) for j in range(self.k)])
        return float(self.cells[index].sum()), float(self.variance[index].sum())

    def conditional(self, target: int, given: Mapping[int, bool] | None = None) -> QueryResult:
        """``f(target | given)`` and ``m(target | given)``; ``given`` maps key
        axes to held (True) / not held (False)."""
        given = dict(given or {})
        if target in given:
            raise ValueError("the target key cannot also be a condition")
        cond = {j: HELD if held else NOT_HELD for j, held in given.items()}
        X, vX = self.select({**cond, target: HELD})
        Z, vZ = self.select({**cond, target: NOT_HELD})
        P, vP = self.select({**cond, target: (2,)})
        N, vN = self.select({**cond, target: (0,)})
        with np.errstate(divide="ignore", invalid="ignore"):
            f_raw = X / (X + Z) if X + Z != 0 else float("nan")
            m_raw = (P - N) / (P + N) if P + N != 0 else float("nan")
            f_se = float(np.sqrt(Z * Z * vX + X * X * vZ) / (X + Z) ** 2) if X + Z != 0 else float("inf")
            m_se = float(np.sqrt(4 * (N * N * vP + P * P * vN)) / (P + N) ** 2) if P + N != 0 else float("inf")
        Pc, Nc, Zc = max(P, 0.0), max(N, 0.0), max(Z, 0.0)
        f = (Pc + Nc) / (Pc + Nc + Zc) if Pc + Nc + Zc > 0 else 0.0
        m = (Pc - Nc) / (Pc + Nc) if Pc + Nc > 0 else 0.0
        return QueryResult(float(np.clip(f, 0, 1)), float(np.clip(m, -1, 1)), float(f_raw), float(m_raw),
                           f_se, m_se, X + Z)

    def marginal(self, j: int):
        return self.conditional(j).as_tuple()


def parse_given(text: str, key_names: Sequence[str]) -> dict[int, bool]:
    """``"A=1,B=0"`` -> ``{axis of A: True, axis of B: False}``."""
    out: dict[int, bool] = {}
    if not text:
        return out
    for part in text.split(","):
        name, _, value = part.strip().rpartition("=")
        if not name or value not in ("0", "1"):
            raise ValueError(f"condition {part!r} must look like KEY=1 or KEY=0")
        out[axis_of(name, key_names)] = value == "1"
    return out


def parse_alpha_beta(alpha: str, beta: str) -> dict[int, bool]:
    """Sun et al.'s ``(alpha, beta)`` form: ``alpha_j = 1`` puts key ``j`` in
    the condition, ``beta_j`` says held (1) or not (0)."""
    if len(alpha) != len(beta) or set(alpha + beta) - {"0", "1"}:
        raise ValueError(f"alpha and beta must be bit strings of one length, got {alpha!r}, {beta!r}")
    if any(a == "0" and b == "1" for a, b in zip(alpha, beta, strict=True)):
        raise ValueError("beta may set a bit only where alpha does")
    return {j: b == "1" for j, (a, b) in enumerate(zip(alpha, beta, strict=True)) if a == "1"}


def axis_of(name: str, key_names: Sequence[str]) -> int:
    try:
        return list(key_names).index(name)
    except ValueError:
        raise ValueError(f"key {name!r} is not one of the IOH keys {list(key_names)}") from None


def parse_query(text: str, key_names: Sequence[str]):
    """``"target=KEY given KEY=1,KEY=0"`` -> ``(target axis, given)``."""
    head, _, given = text.partition(" given ")
    name = head.strip()
    if name.startswith("target="):
        name = name[len("target="):]
    return axis_of(name, key_names), parse_given(given.strip(), key_names)


def pattern_truth(users, ioh_keys: Sequence[int], d: int) -> np.ndarray:
    """Mergeable non-private truth for conditional queries: per holding
    pattern ``P = sum_j 2^(k-1-j) [user holds key j]``, the number of users
    and, per key, the sum of their values: ``[counts[2^k], sums[2^k * k]]``
    (sums made order-independent by ``exact_sums``)."""
    k = len(ioh_keys)
    column = np.full(d, -1, dtype=np.int64)
    column[list(ioh_keys)] = np.arange(k)
    col = column[users.keys]
    mine = col >= 0
    held = np.zeros((users.n_users, k), dtype=bool)
    vals = np.zeros((users.n_users, k))
    held[users.owners[mine], col[mine]] = True
    vals[users.owners[mine], col[mine]] = users.values[mine]
    pattern = held @ (1 << np.arange(k - 1, -1, -1))
    counts = np.bincount(pattern, minlength=2 ** k)
    sums = np.stack([np.bincount(pattern, weights=vals[:, j], minlength=2 ** k) for j in range(k)], axis=1)
    return np.concatenate([counts, exact_sums(sums.ravel())]).astype(np.float64)


def true_conditional(truth: np.ndarray, k: int, target: int, given: Mapping[int, bool]):
    """``(f(target | given), m(target | given), users in the condition)``
    from :func:`pattern_truth`'s statistics."""
    counts = truth[:2 ** k]
    sums = truth[2 ** k:].reshape(2 ** k, k)
    bits = (np.arange(2 ** k)[:, None] >> np.arange(k - 1, -1, -1)) & 1
    mask = np.ones(2 ** k, dtype=bool)
    for j, held in given.items():
        mask &= bits[:, j] == int(held)
    inside = counts[mask].sum()
    holding = mask & (bits[:, target] == 1)
    n_hold = counts[holding].sum()
    f = n_hold / inside if inside else float("nan")
    m = sums[holding, target].sum() / n_hold if n_hold else float("nan")
    return float(f), float(m), int(inside)
