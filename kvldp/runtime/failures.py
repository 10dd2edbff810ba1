"""A failed job in one line: what went wrong, where, and how to see more.

Beam surfaces a worker's exception as a ``RuntimeError`` whose message
embeds the worker's whole traceback (250-370 lines for a bad element on the
local runner). The operator needs its last line -- the original exception --
and the transform it happened in. ``KVLDP_DEBUG=1`` re-raises instead, for
the full traceback.
"""
from __future__ import annotations

import logging
import os
import re

DEBUG_ENV = "KVLDP_DEBUG"
_EXCEPTION_LINE = re.compile(r"^\s*((?:[A-Za-z_][\w]*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit)): (.+)$")
_TRANSFORM = re.compile(r"\[while running '([^']+)'\]")


def debugging() -> bool:
    return os.environ.get(DEBUG_ENV) == "1"


def one_line(err: BaseException) -> str:
    """The innermost exception named in ``err``'s message (Beam's wrapped
    worker tracebacks), else ``err`` itself, with the transform it ran in."""
    text = str(err)
    found = [m for m in map(_EXCEPTION_LINE.match, text.splitlines()) if m]
    what = f"{found[-1].group(1).rsplit('.', 1)[-1]}: {found[-1].group(2).strip()}" if found else (
        f"{type(err).__name__}: {text.strip().splitlines()[0] if text.strip() else ''}")
    if what.startswith("ElementError: "):          # transforms.context: "ELEMENT: Type: message"
        what = what[len("ElementError: "):]
    where = _TRANSFORM.findall(text)
    what = _TRANSFORM.sub("", what).strip()
    return f"{what}{f' (in {where[-1]})' if where else ''}"


def quiet_worker_tracebacks() -> None:
    """Beam logs a failed element's traceback at ERROR from its DoFn runner
    before raising it; the CLI prints the one line instead (unless debugging)."""
    if not debugging():
        logging.getLogger("apache_beam.runners.common").setLevel(logging.CRITICAL)
