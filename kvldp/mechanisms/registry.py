"""Name -> mechanism: the one place a new mechanism is added.

An entry is a class (or factory) taking ``(d, epsilon, **options)`` with an
``options_type`` (``params.Options``): that declaration generates the
mechanism's flags, validation and template parameters, and registering it
here puts it into every job and into the exact privacy audit.
"""
from __future__ import annotations

from collections.abc import Callable

from kvldp.mechanisms.kv.ioh import ioh_factory
from kvldp.mechanisms.kv.ksadap import KSAdap
from kvldp.mechanisms.kv.kskv import KSGRR, KSUE
from kvldp.mechanisms.kv.pckv import PCKVGRR, PCKVUE
from kvldp.mechanisms.kv.privkv import PrivKV, PrivKVA, PrivKVMVirtual
from kvldp.mechanisms.kv.privkvm import PrivKVM, PrivKVMPlus
from kvldp.mechanisms.kv.sun import F2M, KVOH, KVUE
from kvldp.mechanisms.params import Options
from kvldp.mechanisms.protocol import Protocol

MECHANISMS: dict[str, Callable[..., Protocol]] = {
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


def can_draw_counts(name: str) -> bool:
    """Whether the mechanism's simulations may draw its counts without
    reports (``Protocol.draw_round_counts``)."""
    return bool(getattr(factory(name), "can_draw_counts", False))


def options_type(name: str) -> type[Options]:
    """The mechanism's typed options (``params.Options`` subclass)."""
    return factory(name).options_type


def options_of(name: str) -> list[str]:
    """The options a mechanism takes besides ``d`` and ``epsilon``."""
    return options_type(name).field_names()


def option_names() -> list[str]:
    """Every option any registered mechanism takes (a flag of the command line each)."""
    return sorted({option for name in names() for option in options_of(name)})


def options(name: str, **given) -> Options:
    """Typed, validated options from keywords; ``None`` keeps the default,
    an option the mechanism does not take is an error."""
    accepted = options_of(name)
    given = {k: v for k, v in given.items() if v is not None}
    unknown = sorted(set(given) - set(accepted))
    if unknown:
        raise ValueError(f"{name} does not take {', '.join(unknown)} (it takes: {', '.join(accepted) or 'nothing'})")
    return options_type(name)(**given)


def make(name: str, d: int, epsilon: float, opts: Options | None = None, **given) -> Protocol:
    """Build a registered mechanism from typed options ``opts`` (or from
    keywords, validated into them)."""
    if opts is None:
        opts = options(name, **given)
    elif given:
        raise ValueError("give the options either typed or as keywords, not both")
    if not isinstance(opts, options_type(name)):
        raise TypeError(f"{name} takes {options_type(name).__name__}, got {type(opts).__name__}")
    return factory(name)(d, epsilon, **opts.as_kwargs())
