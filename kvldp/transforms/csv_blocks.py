"""Reading CSV ratings a block at a time, vectorised (issue 17: parsing row
by row with the ``csv`` module was a third of the ingest's time).

A file is cut into blocks of about ``BLOCK_BYTES`` at line ends that lie
outside quotes (an even number of quote characters before the cut), so
every row is whole in one block and the line number of a block's first
line is known. A clean block -- valid text in its encoding, the right
number of fields in every row, no empty user or item, numeric ratings, no
line inside quotes, no blank line -- is parsed by pyarrow's CSV reader into
arrays, its rows' line numbers being consecutive. Any other block returns
``None`` and is parsed row by row by the caller, which gives each bad row
its reason and exact line (``transforms.ratings``); a clean file never
takes that path.
"""
from __future__ import annotations

import io
import re
from collections.abc import Iterator, Sequence

import numpy as np

BLOCK_BYTES = 4 << 20
_SURROGATE = re.compile("[\udc80-\udcff]")
_LONE_CR = re.compile(rb"\r(?!\n)")


def blocks(fh, block_bytes: int | None = None, quote: bytes = b'"') -> Iterator[tuple[int, bytes]]:
    """``(number of the block's first line, bytes)`` of a binary file, each
    block ending at a line end outside quotes (the last: wherever the file does)."""
    carry, line = b"", 1
    while True:
        data = fh.read(block_bytes or BLOCK_BYTES)
        if not data:
            break
        buf = carry + data
        cut = _cut(buf, quote)
        if cut < 0:                 # no line end outside quotes yet: read on
            carry = buf
            continue
        head, carry = buf[:cut + 1], buf[cut + 1:]
        yield line, head
        # lines as the csv module counts them (\r\n, \n and a lone \r each end one), so that the
        # line numbers of two blocks never overlap (a lone CR made two rows share a number)
        line += head.count(b"\n") + len(_LONE_CR.findall(head))
    if carry:
        yield line, carry


def _cut(buf: bytes, quote: bytes) -> int:
    """The last ``\\n`` of ``buf`` preceded by an even number of quotes, or -1."""
    cut = buf.rfind(b"\n")
    quotes = buf.count(quote, 0, cut + 1) if cut >= 0 else 0
    while cut >= 0 and quotes % 2:
        previous = buf.rfind(b"\n", 0, cut)
        quotes -= buf.count(quote, previous + 1, cut + 1)
        cut = previous
    return cut


def is_undecodable(text: str) -> bool:
    """Whether ``text`` (decoded with ``surrogateescape``) held bytes its
    encoding could not decode: they became lone surrogates U+DC80..U+DCFF."""
    return _SURROGATE.search(text) is not None


def _is_utf8(block: bytes) -> bool:
    try:
        block.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def parse_clean_block(block: bytes, first_line: int, names: Sequence[str], wanted: Sequence[str],
                      delimiter: str, encoding: str) -> dict | None:
    """A clean block's rows as ``{"lines", "users", "items", "ratings"}``
    arrays (the ids as Arrow strings; ``names``: the file's columns;
    ``wanted``: the user, item and rating columns), or ``None`` when any
    row needs the careful reader."""
    import pyarrow as pa
    import pyarrow.compute as pc
    from pyarrow import csv as pacsv

    if encoding.replace("-", "").replace("_", "").lower() not in ("utf8", "utf8sig"):
        text = block.decode(encoding, "surrogateescape")
        if is_undecodable(text):
            return None
        block = text.encode("utf-8")
    elif first_line == 1 and block.startswith(b"\xef\xbb\xbf"):
        block = block[3:]
    if not _is_utf8(block):
        # a byte UTF-8 cannot decode: the careful reader rejects its row with the reason. pyarrow would
        # decode such a row for its invalid-row handler itself, fail, and print "Exception ignored" with
        # a traceback (issue 39: 5 of 24 mutated files)
        return None
    if b"\r" in block.replace(b"\r\n", b""):          # a lone carriage return ends lines for the csv module only
        return None
    bad_rows = []

    def refuse(row):
        bad_rows.append(row)
        return "skip"

    try:
        table = pacsv.read_csv(
            io.BytesIO(block),
            read_options=pacsv.ReadOptions(column_names=list(names), use_threads=False,
                                           block_size=max(1 << 20, len(block) + 1)),
            parse_options=pacsv.ParseOptions(delimiter=delimiter, newlines_in_values=False,
                                             ignore_empty_lines=False, invalid_row_handler=refuse),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in wanted},
                                                 include_columns=list(wanted), strings_can_be_null=False))
    except (pa.ArrowInvalid, UnicodeError):
        return None
    n = table.num_rows
    if bad_rows or n != block.count(b"\n") + (0 if block.endswith(b"\n") else 1):
        return None
    user, item, rating = (table.column(c) for c in wanted)
    if n and (pc.any(pc.equal(user, "")).as_py() or pc.any(pc.equal(item, "")).as_py()):
        return None
    try:
        ratings = pc.cast(rating, pa.float64()).to_numpy()
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return {"lines": np.arange(first_line, first_line + n, dtype=np.int64),
            "users": user.combine_chunks(), "items": item.combine_chunks(),     # Arrow strings, as read
            "ratings": np.asarray(ratings, dtype=np.float64)}
