"""Where a type hint was declared, named by its frames without their source lines.

Beam records with every type hint it makes (``with_output_types``,
``with_input_types`` and the hints it derives from them) the stack that
made it: ``IOTypeHints._make_origin`` formats the five frames above the
call with ``traceback.format_stack`` and appends the origins of the hints
it was based on. The text is read only by one error message, a side
input's type violation ("Full type hint: ..."). Python 3.11's
``format_stack`` reads each frame's source line (a file read per module,
the first time) and works out where to draw its ``^^^`` markers: 35-67 us
a hint, ~100 hints in a one-round graph (6.8 ms of F2M's job at 10^6
users), ~590 in PrivKVM+'s ten rounds (20.7 ms), plus the hints kvldp's
modules declare when they are imported. With this module: 0.7 and 5-6 ms.

Here a hint's origin names the same frames -- file, line and function,
outermost first, as ``format_stack`` orders them -- without the source
line and its markers, and keeps everything else Beam puts there: the
message lines before the frames and the origins of the hints it was
based on after them (Beam's own code makes that part, from the same
arguments). The line number is what leads to the declaration.

Tweak ``short_hint_origins`` (``tweaks.py``): applied only while a
command's local job is built and run (``kvldp.runtime.tuned``,
``LocalRunner``); ``IOTypeHints._make_origin`` is a classmethod its methods
call as ``self._make_origin(...)``, so the class attribute is what is
replaced then. A Beam whose ``_make_origin`` takes other arguments keeps
its own.
"""
from __future__ import annotations

import inspect
import sys

from apache_beam.typehints import decorators

from kvldp.runtime.tweaks import Swap

_beams = decorators.IOTypeHints.__dict__.get("_make_origin")
# the frames between a hint's declaring call and the frame walk: _make_origin and the IOTypeHints method
_SKIPPED = 2


def frame_lines(frame, limit: int) -> list[str]:
    """``File "...", line N, in name`` for ``frame`` and up to ``limit - 1``
    frames it was called from, outermost first."""
    lines = []
    while frame is not None and len(lines) < limit:
        code = frame.f_code
        lines.append(f'File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
        frame = frame.f_back
    lines.reverse()
    return lines


def _make_origin(cls, bases, tb: bool = True, msg=()) -> list[str]:
    """``IOTypeHints._make_origin`` with frames named by ``frame_lines``
    (module docstring): the message, the frames, then Beam's "based on" part."""
    if tb:
        msg = [*msg, *frame_lines(sys._getframe(_SKIPPED), decorators.TRACEBACK_LIMIT)]
    return _beams.__func__(cls, bases, tb=False, msg=msg)


def _installable() -> bool:
    """Whether this Beam's ``_make_origin`` is the classmethod taking
    ``(bases, tb, msg)`` that the replacement calls through."""
    if not isinstance(_beams, classmethod) or not hasattr(decorators, "TRACEBACK_LIMIT"):
        return False
    return list(inspect.signature(_beams.__func__).parameters)[1:] == ["bases", "tb", "msg"]


SWAP = Swap(*([(decorators.IOTypeHints, "_make_origin", classmethod(_make_origin))] if _installable() else []))

