"""Privacy budget ledger: who spends how much epsilon, on what, in which round.

Every protocol states its shares up front. Building a ledger whose shares
for any user group add up to more than the stated total is an error, so a
protocol that over-spends fails when the pipeline graph is constructed,
before a single report exists.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Sequence

TOLERANCE = 1e-9


class BudgetExceeded(ValueError):
    """The shares of one user group add up to more than the total epsilon."""


@dataclasses.dataclass(frozen=True)
class Share:
    """``epsilon`` spent by every user of ``group`` in ``round`` on ``component``
    (``"key"``, ``"value"``, or ``"pair"`` for a joint key-value randomiser)."""

    round: int
    component: str
    epsilon: float
    group: str = "all"

    def __post_init__(self):
        if not math.isfinite(self.epsilon) or self.epsilon < 0:
            raise ValueError(f"a budget share must be finite and >= 0, got {self.epsilon}")


@dataclasses.dataclass(frozen=True)
class BudgetLedger:
    total: float
    shares: tuple[Share, ...]

    def __post_init__(self):
        object.__setattr__(self, "shares", tuple(self.shares))
        for group in self.groups:
            spent = self.spent(group=group)
            if spent > self.total * (1 + TOLERANCE) + TOLERANCE:
                raise BudgetExceeded(
                    f"group {group!r} would spend eps = {spent:.6g} > the stated total {self.total:.6g}: "
                    + ", ".join(f"round {s.round} {s.component} {s.epsilon:.4g}" for s in self.shares
                                if s.group == group))

    @classmethod
    def of(cls, total: float, shares: Iterable[Share]) -> BudgetLedger:
        return cls(float(total), tuple(shares))

    @property
    def groups(self) -> list[str]:
        return sorted({s.group for s in self.shares})

    @property
    def rounds(self) -> list[int]:
        return sorted({s.round for s in self.shares})

    def spent(self, rounds: Sequence[int] | None = None, group: str | None = None) -> float:
        """Epsilon spent per user of ``group`` (default: the most spending group)
        over ``rounds`` (default: all)."""
        if group is None:
            return max((self.spent(rounds, g) for g in self.groups), default=0.0)
        return math.fsum(s.epsilon for s in self.shares
                         if s.group == group and (rounds is None or s.round in rounds))

    def round_epsilon(self, round_index: int, component: str | None = None) -> float:
        return math.fsum(s.epsilon for s in self.shares
                         if s.round == round_index and (component is None or s.component == component))

    def rows(self) -> list[dict]:
        return [dataclasses.asdict(s) for s in self.shares]

    def describe(self) -> str:
        lines = [f"budget: total eps = {self.total:g}"]
        lines.extend(f"  round {s.round:>2} {s.group:>6} {s.component:>5}: {s.epsilon:.6g}" for s in self.shares)
        lines.append(f"  spent per user: {self.spent():.6g}")
        return "\n".join(lines)
