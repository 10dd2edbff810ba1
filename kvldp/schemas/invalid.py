"""A file that is not what its reader expects, refused in one line.

Every file the ingest or the collector reads may come from a buggy or
hostile writer (issue 42's fuzzing campaign). A damaged Avro container
makes fastavro raise whatever its decoder tripped on -- ``IndexError``,
``EOFError``, ``KeyError: 'avro.schema'``, ``UnicodeDecodeError``, a JSON
error from the header -- and a record of the wrong shape a ``KeyError`` or
``TypeError`` in the code that reads it. None of those names the file, and
the command printed them as an unexpected failure. ``reading(path, what)``
turns each into ``InvalidFile`` (a ``ValueError``: the CLI's one-line
``error:``), naming the file, what it should have been, and what was found.
"""
from __future__ import annotations

import contextlib

# what a damaged file makes a decoder or a reader raise; MemoryError too: fastavro allocates a length read
# from the file before reading that many bytes (12 random bytes asked it for more than the machine has).
# Not an OSError: a full disk or an unreadable file is not the file's fault and keeps its own message.
DAMAGE = (ValueError, EOFError, KeyError, IndexError, TypeError, AttributeError, OverflowError, StopIteration,
          MemoryError)


# the decoders' own exception types (fastavro's SchemaParseException, zstandard's ZstdError, zlib.error, …)
DECODERS = ("fastavro", "zstandard", "backports.zstd", "compression.", "zlib", "snappy", "cramjam", "lz4", "bz2",
            "lzma", "_lzma", "_bz2")


def _damage(err: BaseException) -> bool:
    return isinstance(err, DAMAGE) or type(err).__module__.startswith(DECODERS)


class InvalidFile(ValueError):
    """``PATH: not a valid WHAT (the problem)``."""


def one_line(text: str, limit: int = 300) -> str:
    """``text`` on one line, at most ``limit`` characters (a hostile file can
    put anything in a message)."""
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[:limit - 1] + "…"


@contextlib.contextmanager
def reading(path: str, what: str):
    """Re-raise any damage found inside as ``InvalidFile`` naming ``path``;
    a ``ValueError`` that is already a refusal keeps its words, prefixed
    with the path when it lacks it."""
    try:
        yield
    except InvalidFile:
        raise
    except Exception as err:
        if not _damage(err):
            raise
        text = one_line(err.args[0] if isinstance(err, KeyError) and err.args else err)
        if type(err) is ValueError or type(err).__module__.startswith("kvldp."):      # a reader's own words
            raise InvalidFile(text if path in text else f"{path}: {text}") from None
        problem = f"{type(err).__name__}: {text}" if text else type(err).__name__
        raise InvalidFile(f"{path}: not a valid {what} ({problem})") from None
