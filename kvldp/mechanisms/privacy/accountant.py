"""The privacy accountant: every budget kvldp states, typed, in exact arithmetic,
and every check of one, in this one module.

The budgets:

* ``Share`` -- pure eps-LDP spent by every user of a ``group`` in a
  ``round`` on a ``component`` (``"key"``, ``"value"``, ``"pair"`` for a
  joint key-value randomiser, ``"permanent"`` for a longitudinal report);
* ``Accountant`` -- a protocol's stated total and its shares: building one
  whose shares for any group add up to more than the total raises
  ``BudgetExceeded``, so a protocol that over-spends fails when its
  pipeline graph is built, before a single report exists;
* ``LongitudinalBudget`` -- the two-layer pair (``eps_inf``, ``eps_1``):
  any number of reports of one state reveal at most ``eps_inf``, one
  report at most ``eps_1 <= eps_inf`` (``kv/longitudinal.py``);
* a device's window (``fits``): a charge is admitted iff what the device
  spent in the window plus the charge is at most the window's budget
  (``SimulatedLedger`` here; the per-device store, ``kvldp.storage.ledger``).

Arithmetic is exact: an epsilon given as a float is read as the fraction
closest to it whose denominator is at most 10^9 (``exact``), so ``0.1`` is
1/10 and ``4/3`` is 4/3; shares add up and compare as fractions. Three
shares of eps/3 spend eps exactly, ten charges of 0.1 fit a budget of 1,
and there is no tolerance anywhere (the floats the mechanisms perturb with
are the ones given; only the bookkeeping is exact).
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence
from fractions import Fraction

import numpy as np

# A float epsilon is read as the closest fraction with a denominator at most this: every epsilon
# written with up to nine decimals, and every simple split (eps/3, 2 eps/3) of one, is read exactly.
DENOMINATOR = 10 ** 9


class BudgetExceeded(ValueError):
    """The shares of one user group add up to more than the total epsilon."""


def exact(epsilon) -> Fraction:
    """``epsilon`` as an exact fraction (a float: the closest fraction with a
    denominator at most ``DENOMINATOR``); it must be finite and >= 0."""
    if isinstance(epsilon, Fraction):
        value = epsilon
    else:
        if not math.isfinite(epsilon):
            raise ValueError(f"a budget must be finite, got {epsilon}")
        value = Fraction(epsilon).limit_denominator(DENOMINATOR)
    if value < 0:
        raise ValueError(f"a budget must be >= 0, got {epsilon}")
    return value


def fits(spent, charge, budget) -> bool:
    """Whether a device that spent ``spent`` in the window may be charged
    ``charge`` more under ``budget`` (``None``: no limit): exactly."""
    return budget is None or exact(spent) + exact(charge) <= exact(budget)


def fits_each(spent: np.ndarray, charge: np.ndarray, budget) -> np.ndarray:
    """``fits`` for each device ``i``: ``spent[i] + charge[i] <= budget``,
    exactly; each distinct (spent, charge) pair is read once, so a batch of
    10^5 devices costs a handful of fraction reads."""
    spent, charge = np.asarray(spent, dtype=float), np.asarray(charge, dtype=float)
    if budget is None:
        return np.ones(spent.shape, dtype=bool)
    pairs, index = np.unique(np.stack([spent.ravel(), charge.ravel()]), axis=1, return_inverse=True)
    verdicts = np.array([fits(s, c, budget) for s, c in pairs.T], dtype=bool)
    return verdicts[index.ravel()].reshape(spent.shape)


def check_split(shares: Sequence[float], what: str = "shares"):
    """A split of one budget: every share in (0, 1), adding up to 1 exactly."""
    if any(not 0 < s < 1 for s in shares) or sum(exact(s) for s in shares) != 1:
        raise ValueError(f"{what} must each be in (0, 1) and add up to 1, got {list(shares)}")


@dataclasses.dataclass(frozen=True)
class Share:
    """``epsilon`` spent by every user of ``group`` in ``round`` on ``component``."""

    round: int
    component: str
    epsilon: float
    group: str = "all"

    def __post_init__(self):
        exact(self.epsilon)


@dataclasses.dataclass(frozen=True)
class LongitudinalBudget:
    """The two-layer pair: ``eps_inf`` for any number of reports of one
    state, ``eps_1`` for one report (``None``: ``eps_inf``, the memoised
    single layer); ``0 < eps_1 <= eps_inf``."""

    eps_inf: float
    eps_1: float | None = None

    def __post_init__(self):
        if self.eps_1 is None:
            object.__setattr__(self, "eps_1", self.eps_inf)
        if not exact(self.eps_inf) > 0 or not exact(self.eps_1) > 0:
            raise ValueError(f"eps_inf and eps_1 must be > 0, got {self.eps_inf:g} and {self.eps_1:g}")
        if exact(self.eps_1) > exact(self.eps_inf):
            raise ValueError(f"eps_1 = {self.eps_1:g} exceeds eps_inf = {self.eps_inf:g}: one report cannot lose "
                             "more than any number of reports of its state")

    @property
    def memoised_only(self) -> bool:
        """No instantaneous layer: every report of a state is its permanent report."""
        return exact(self.eps_1) == exact(self.eps_inf)


@dataclasses.dataclass(frozen=True)
class Accountant:
    """A protocol's budget: the stated ``total`` and its ``shares``
    (``longitudinal``: the two-layer pair, whose ``eps_inf`` is the total)."""

    total: float
    shares: tuple[Share, ...]
    longitudinal: LongitudinalBudget | None = None

    def __post_init__(self):
        object.__setattr__(self, "shares", tuple(self.shares))
        total = exact(self.total)
        if self.longitudinal is not None and exact(self.longitudinal.eps_inf) != total:
            raise ValueError(f"the longitudinal eps_inf {self.longitudinal.eps_inf:g} is not the total {self.total:g}")
        for group in self.groups:
            if self._exact_spent(None, group) > total:
                raise BudgetExceeded(
                    f"group {group!r} would spend eps = {self.spent(group=group):.6g} > the stated total "
                    f"{self.total:.6g}: " + ", ".join(f"round {s.round} {s.component} {s.epsilon:.4g}"
                                                      for s in self.shares if s.group == group))

    @classmethod
    def of(cls, total: float, shares: Iterable[Share], longitudinal: LongitudinalBudget | None = None) -> Accountant:
        return cls(float(total), tuple(shares), longitudinal)

    @property
    def groups(self) -> list[str]:
        return sorted({s.group for s in self.shares})

    @property
    def rounds(self) -> list[int]:
        return sorted({s.round for s in self.shares})

    def _exact_spent(self, rounds: Sequence[int] | None, group: str) -> Fraction:
        return sum((exact(s.epsilon) for s in self.shares
                    if s.group == group and (rounds is None or s.round in rounds)), Fraction(0))

    def spent(self, rounds: Sequence[int] | None = None, group: str | None = None) -> float:
        """Epsilon spent per user of ``group`` (default: the most spending group)
        over ``rounds`` (default: all)."""
        groups = self.groups if group is None else [group]
        return float(max((self._exact_spent(rounds, g) for g in groups), default=Fraction(0)))

    def round_epsilon(self, round_index: int, component: str | None = None) -> float:
        """The epsilon a round's randomiser runs at (the shares' own floats,
        added without rounding error)."""
        return math.fsum(s.epsilon for s in self.shares
                         if s.round == round_index and (component is None or s.component == component))

    def rows(self) -> list[dict]:
        return [dataclasses.asdict(s) for s in self.shares]

    def describe(self) -> str:
        lines = [f"budget: total eps = {self.total:g}"]
        lines.extend(f"  round {s.round:>2} {s.group:>6} {s.component:>5}: {s.epsilon:.6g}" for s in self.shares)
        if self.longitudinal is not None:
            lines.append(f"  one report (eps_1): {self.longitudinal.eps_1:.6g}")
        lines.append(f"  spent per user: {self.spent():.6g}")
        return "\n".join(lines)


def fits_window(charges: Sequence[tuple[float, np.ndarray]], charge, budget) -> np.ndarray:
    """``fits`` for many devices at once: ``charges`` is the window's
    collections as (cost, whether each device was charged it), ``charge``
    what each device would be charged now (an array, one per device).
    Exact: every amount is counted in integer units of one over the least
    common denominator of the costs and the budget."""
    charge = np.asarray(charge, dtype=float)
    if budget is None:
        return np.ones(charge.shape, dtype=bool)
    now_values, now_index = np.unique(charge, return_inverse=True)
    costs, now = [exact(c) for c, _ in charges], [exact(c) for c in now_values]
    unit = math.lcm(*(a.denominator for a in [*costs, *now, exact(budget)]))
    largest = (sum(costs, Fraction(0)) + max(now, default=Fraction(0))) * unit
    dtype = np.int64 if largest < 2 ** 62 else object      # Python ints where int64 could overflow
    spent = np.zeros(charge.shape, dtype=dtype)
    for cost, (_, charged) in zip(costs, charges, strict=True):
        spent = spent + np.where(charged, int(cost * unit), 0).astype(dtype)
    now_units = np.asarray([int(c * unit) for c in now], dtype=dtype)[now_index.reshape(charge.shape)]
    return spent + now_units <= int(exact(budget) * unit)
