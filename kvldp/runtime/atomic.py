"""Local files written whole or not at all.

A job killed mid-write (SIGKILL, a full disk) must never leave half a file
under the name a reader opens (issue 42's crash tests: ``evaluate`` killed
inside ``savefig`` left a truncated PNG). ``replaced(path)`` gives a
temporary name beside ``path`` (hidden, same directory, same suffix so
writers that infer the format from it still do), renamed over ``path`` when
the block ends, removed when it fails. ``replaced_on_filesystems(path)``
does the same on Beam's filesystems (local or ``gs://``), for the report,
estimate, manifest and pane files: ``PATH.tmp-<uuid>``, which none of their
readers' patterns matches.

``writing(path)`` names the file in an ``OSError`` that names none: a write
on a full disk raises ``[Errno 28] No space left on device`` alone, and the
operator's one line must say which file. ``replaced`` applies it.
"""
from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path

from apache_beam.io.filesystems import FileSystems

TEMP_INFIX = ".tmp-"          # a file being written on Beam's filesystems: PATH.tmp-<uuid>


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


@contextlib.contextmanager
def replaced_on_filesystems(path: str) -> Iterator[str]:
    """``replaced`` on Beam's filesystems: write to the yielded name; it
    replaces ``path`` (a retried bundle's earlier file too) once the block
    ends, and is removed if the block fails."""
    temp = f"{path}{TEMP_INFIX}{uuid.uuid4().hex}"
    try:
        with writing(path):
            yield temp
        if FileSystems.exists(path):
            FileSystems.delete([path])
        FileSystems.rename([temp], [path])
    finally:
        if FileSystems.exists(temp):
            FileSystems.delete([temp])
