"""The element a worker failed on, in the error the operator reads.

Beam reports a failed DoFn with the transform's name; the operator also
needs the element -- which report file, which ratings file, which batch --
to fix or remove it. ``element_context`` re-raises any exception inside it
as an ``ElementError`` naming the element and the original exception, and
``pipelines.failures`` prints it as one line.
"""
from __future__ import annotations

import contextlib


class ElementError(Exception):
    """``WHAT: OriginalType: message``: a worker's failure on one element."""


@contextlib.contextmanager
def element_context(what: str):
    """Name ``what`` (e.g. a file path, ``batch 17``) in any error raised inside."""
    try:
        yield
    except ElementError:
        raise
    except Exception as err:
        text = str(err)
        if isinstance(err, OSError) and err.filename == what:     # already names it (runtime.atomic.writing)
            text = f"[Errno {err.errno}] {err.strerror}"
        if text.startswith(what):                  # already names it
            text = text[len(what):].lstrip(": ")
        raise ElementError(f"{what}: {type(err).__name__}: {text}") from err
