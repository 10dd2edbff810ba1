"""Name -> mechanism factory: the one place a new mechanism is added."""
from __future__ import annotations

from typing import Callable

from .base import Mechanism
from .pckv import PCKVGRR, PCKVUE

# Each factory takes (d, epsilon, **options) and validates its own options.
MECHANISMS: dict[str, Callable[..., Mechanism]] = {
    PCKVUE.name: PCKVUE,
    PCKVGRR.name: PCKVGRR,
}


def names() -> list[str]:
    return sorted(MECHANISMS)


def make(name: str, d: int, epsilon: float, **options) -> Mechanism:
    """Build a registered mechanism; unknown names fail with the list of known ones."""
    try:
        factory = MECHANISMS[name]
    except KeyError:
        raise ValueError(f"unknown mechanism {name!r}; known: {', '.join(names())}") from None
    return factory(d, epsilon, **options)
