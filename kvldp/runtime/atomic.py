"""Local files written whole or not at all.

A job killed mid-write (SIGKILL, a full disk) must never leave half a file
under the name a reader opens (issue 42's crash tests: ``evaluate`` killed
inside ``savefig`` left a truncated PNG). ``replaced(path)`` gives a
temporary name beside ``path`` (hidden, same directory, same suffix so
writers that infer the format from it still do), renamed over ``path`` when
the block ends, removed when it fails. Files on Beam's filesystems
(``gs://``) use their own temporary-then-rename in the sinks.

``writing(path)`` names the file in an ``OSError`` that names none: a write
on a full disk raises ``[Errno 28] No space left on device`` alone, and the
operator's one line must say which file. ``replaced`` applies it.
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def writing(path) -> Iterator[None]:
    """Re-raise an ``OSError`` that names no file as the same error naming ``path``."""
    try:
        yield
    except OSError as err:
        if err.filename is not None or err.errno is None:
            raise
        raise OSError(err.errno, err.strerror, str(path)) from err


@contextlib.contextmanager
def replaced(path: str | os.PathLike) -> Iterator[Path]:
    """Write to the yielded path; it becomes ``path`` only once complete."""
    path = Path(path)
    temp = path.with_name(f".{path.stem}.{os.getpid()}.tmp{path.suffix}")
    try:
        with writing(path):
            yield temp
            os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def write_text(path: str | os.PathLike, text: str) -> None:
    """``Path(path).write_text(text)``, whole or not at all."""
    with replaced(path) as temp:
        temp.write_text(text)
