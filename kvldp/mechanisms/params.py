"""Typed mechanism options: one frozen dataclass per mechanism family.

A mechanism declares what it can be told besides ``d`` and ``epsilon`` as a
frozen dataclass whose fields carry their documentation, range and choices
(:func:`option`). From that one declaration come

* validation, in ``__post_init__``, with messages that name the flag;
* the command line: one ``--flag`` per field name (``kvldp.cli.flags``),
  its help listing the mechanisms that take it;
* the Flex Template's parameters (``kvldp.cli.template``).

Defaults are the constructor's, so ``Mechanism(d, eps, **asdict(options))``
with default options is the mechanism with its defaults (a test checks it).
This module is pure Python: a client builds options without Beam.
"""
from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, ClassVar

_META = "kvldp"


def option(default, help: str, *, low: float | None = None, high: float | None = None,
           low_open: bool = False, high_open: bool = False, choices: tuple | None = None,
           whole: bool = False, short: str | None = None, parse: Callable[[str], Any] | None = None,
           metavar: str | None = None):
    """A documented option field: ``low``/``high`` bound numbers (``*_open``:
    strictly), ``choices`` enumerates strings, ``whole`` asks for an integer;
    ``parse`` turns the flag's text into the value (default: by the
    default's type); ``short``: a one-letter alias such as ``-l``."""
    meta = {"help": help, "low": low, "high": high, "low_open": low_open, "high_open": high_open,
            "choices": choices, "whole": whole, "short": short, "parse": parse, "metavar": metavar}
    return dataclasses.field(default=default, metadata={_META: meta})


def describe(f: dataclasses.Field) -> dict:
    return f.metadata.get(_META, {})


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def range_text(meta: dict) -> str:
    """``[a, b]``, ``(0, 1)``, ``>= 1``, or one of the choices."""
    if meta.get("choices"):
        return "one of " + ", ".join(map(str, meta["choices"]))
    lo, hi = meta.get("low"), meta.get("high")
    if lo is not None and hi is not None:
        return f"{'(' if meta['low_open'] else '['}{lo:g}, {hi:g}{')' if meta['high_open'] else ']'}"
    if lo is not None:
        return f"{'>' if meta['low_open'] else '>='} {lo:g}"
    if hi is not None:
        return f"{'<' if meta['high_open'] else '<='} {hi:g}"
    return ""


def _must_be(meta: dict) -> str:
    rng = range_text(meta)
    return f"in {rng}" if rng.startswith(("[", "(")) else rng


def check_value(name: str, value, meta: dict):
    """``value`` against the field's declaration; the error names the flag."""
    flag = flag_name(name)
    if meta.get("choices") is not None:
        if value not in meta["choices"]:
            raise ValueError(f"{flag} must be {_must_be(meta)}, got {value!r}")
        return
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return
    if meta.get("whole") and int(value) != value:
        raise ValueError(f"{flag} must be a whole number, got {value!r}")
    if not math.isfinite(value):
        raise ValueError(f"{flag} must be a finite number, got {value!r}")
    lo, hi = meta.get("low"), meta.get("high")
    too_low = lo is not None and (value <= lo if meta["low_open"] else value < lo)
    too_high = hi is not None and (value >= hi if meta["high_open"] else value > hi)
    if too_low or too_high:
        raise ValueError(f"{flag} must be {_must_be(meta)}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class Options:
    """Base of every mechanism's options: validates each field against its
    declaration. Sequence fields are checked element by element."""

    takes: ClassVar[str] = ""      # filled by the registry: which mechanisms use this class

    def __post_init__(self):
        for f in dataclasses.fields(self):
            value, meta = getattr(self, f.name), describe(f)
            if value is None:
                continue
            if isinstance(value, (list, tuple)):
                object.__setattr__(self, f.name, tuple(value))
                for v in value:
                    check_value(f.name, v, meta)
            else:
                check_value(f.name, value, meta)

    @classmethod
    def field_names(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    def as_kwargs(self) -> dict:
        """The constructor's keyword arguments."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}


@dataclasses.dataclass(frozen=True)
class NoOptions(Options):
    """A mechanism with nothing to set besides ``d`` and ``epsilon``."""


# -- parsing flag text -------------------------------------------------------

AUTO = "auto"


def whole_or_auto(text: str):
    """``--padding``: a whole number, or ``auto`` (the ingest side then picks
    ``l`` from the data's set sizes before building the mechanism)."""
    if str(text).strip().lower() == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"must be a whole number >= 1 or 'auto', got {text!r}") from None


def floats(text: str) -> tuple[float, ...]:
    """Comma-separated numbers."""
    try:
        return tuple(float(x) for x in str(text).split(","))
    except ValueError:
        raise ValueError(f"must be comma-separated numbers, got {text!r}") from None


# -- options shared by several mechanisms: one declaration per concept --------

def padding_option(default: int = 1):
    return option(default, "padding length l of padding-and-sampling, or 'auto': the ingest side picks the "
                  "smallest l covering --coverage (0.9) of the users from the data's set sizes (a "
                  "data-dependent public parameter); default: auto on the ingest side (simulate, perturb, "
                  "evaluate), the reports' l on the collector's", low=1, whole=True, short="-l",
                  parse=whole_or_auto, metavar="L")


def kept_share_option():
    return option(1.0, "the share of the pairs' frequency mass that sampling one pair per user keeps, "
                  "sum min(|S|, l) / sum |S| over the users' set sizes; the collector divides the frequencies by "
                  "it (status 'truncated'). Set by the ingest side from the data's set sizes (a public parameter "
                  "outside the epsilon guarantee, like --padding auto) and read from the reports by collect; "
                  "1 (the default): no correction", low=0.0, high=1.0, low_open=True, parse=float)


def checked_kept_share(value) -> float:
    """The one check of a kept share (a mechanism's option, an estimate's field)."""
    value = float(value)
    if not 0 < value <= 1:
        raise ValueError(f"kept_share must be in (0, 1], got {value}")
    return value


def kept_share_config(value: float) -> dict:
    """The reports' configuration entry: none at 1, so that reports written
    before the correction existed still match a collector without it."""
    return {} if value >= 1 else {"kept_share": float(value)}


def top_option(default: int = 20):
    return option(default, "t: the candidates are the top 2t keys of round 1; also the top-t set of the "
                  "accuracy summary (default 50)", low=1, whole=True, parse=int, metavar="T")


def rounds_option(default: int):
    return option(default, "rounds c (PrivKVM: real rounds; PrivKVM-VI: including the virtual ones)",
                  low=1, whole=True, parse=int, metavar="C")


def key_share_option(default: float = 0.5):
    return option(default, "LPP: the share of epsilon spent on the key bit (eps1 = share x eps)",
                  low=0.0, high=1.0, low_open=True, high_open=True, parse=float)
