"""Name -> mechanism factory: the one place a new mechanism is added.

A factory takes ``(d, epsilon, **options)``. Single-round mechanisms are
``Mechanism``s; multi-round ones are ``Protocol``s.
"""
from __future__ import annotations

import inspect
from typing import Callable

from .ioh import ioh_factory
from .kskv import KSGRR, KSUE, KSAdap
from .pckv import PCKVGRR, PCKVUE
from .privkv import PrivKV, PrivKVA, PrivKVMVirtual
from .privkvm import PrivKVM, PrivKVMPlus
from .protocol import Mechanism, Protocol
from .sun import F2M, KVOH, KVUE

MECHANISMS: dict[str, Callable[..., Mechanism | Protocol]] = {
    PCKVUE.name: PCKVUE,
    PCKVGRR.name: PCKVGRR,
    PrivKV.name: PrivKV,
    PrivKVA.name: PrivKVA,
    PrivKVMVirtual.name: PrivKVMVirtual,
    PrivKVM.name: PrivKVM,
    PrivKVMPlus.name: PrivKVMPlus,
    F2M.name: F2M,
    KVUE.name: KVUE,
    KVOH.name: KVOH,
    "ioh-oue": ioh_factory("oue"),
    "ioh-sue": ioh_factory("sue"),
    KSUE.name: KSUE,
    KSGRR.name: KSGRR,
    KSAdap.name: KSAdap,
}


def names() -> list[str]:
    return sorted(MECHANISMS)


def factory(name: str):
    try:
        return MECHANISMS[name]
    except KeyError:
        raise ValueError(f"unknown mechanism {name!r}; known: {', '.join(names())}") from None


def options_of(name: str) -> list[str]:
    """The options a mechanism takes besides ``d`` and ``epsilon``."""
    params = list(inspect.signature(factory(name)).parameters)
    return [p for p in params if p not in ("d", "epsilon")]


def make(name: str, d: int, epsilon: float, **options) -> Mechanism | Protocol:
    """Build a registered mechanism. Options set to ``None`` are left at the
    mechanism's default; an option the mechanism does not take is an error."""
    accepted = options_of(name)
    given = {k: v for k, v in options.items() if v is not None}
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise ValueError(f"{name} does not take {', '.join(unknown)} (it takes: {', '.join(accepted) or 'nothing'})")
    return factory(name)(d, epsilon, **given)


def is_protocol(obj) -> bool:
    return isinstance(obj, Protocol)
