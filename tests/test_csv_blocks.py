"""The vectorised CSV reader (issue 17) gives exactly what the row-by-row
reader gives -- the same rows, lines, dead letters and reasons -- on clean
files and on every kind of damage, whatever the block size."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from kvldp.transforms import csv_blocks, rating_files
from kvldp.transforms.rating_files import DEAD_LETTER, ParseRatingFileFn, RatingsFormat


class _File:
    """What ``fileio.ReadMatches`` hands a DoFn."""

    def __init__(self, path, data: bytes):
        self.metadata = type("Meta", (), {"path": path})()
        self._data = data

    def open(self):
        return io.BytesIO(self._data)


DEFAULT = RatingsFormat()


def parse(data: bytes, fmt: RatingsFormat = DEFAULT, fast: bool = True, monkeypatch=None):
    if not fast:
        monkeypatch.setattr(csv_blocks, "parse_clean_block", lambda *a, **k: None)
    fn = ParseRatingFileFn(fmt)
    rows, dead = {"lines": [], "users": [], "items": [], "ratings": []}, []
    for out in fn.process(_File("r.csv", data)):
        if getattr(out, "tag", None) == DEAD_LETTER:
            dead.append(out.value)
        else:
            for k in rows:
                rows[k].extend(np.asarray(out[k]).tolist())
    if not fast:
        monkeypatch.undo()
    return rows, dead


def clean(n: int, sep=",") -> bytes:
    header = sep.join(("user", "item", "rating"))
    return (header + "\n" + "".join(f"u{u}{sep}i{u % 7}{sep}{1 + u % 5}\n" for u in range(n))).encode()


DAMAGED = [
    clean(50),
    clean(50).replace(b"\n", b"\r\n"),                            # CRLF
    b"\xef\xbb\xbf" + clean(20),                                  # BOM
    clean(30) + b"u99,caf\xe9,3\n" + clean(30)[17:],              # undecodable byte
    clean(30) + b"u98,i1\n" + b"u97,i2,3,4\n",                    # short and long rows
    clean(30) + b"u96,i1,many\n" + b"u95,,3\n" + b",i3,2\n",      # non-numeric rating, missing item/user
    clean(30) + b'u94,"two\nlines",3\n' + b'"u93","i,comma",4\n', # quoted newline and delimiter
    clean(30) + b"\n\n" + b"u92,i1,2\n",                          # blank lines
    clean(30).rstrip(b"\n"),                                      # no final newline
]


@pytest.mark.parametrize("block_bytes", [64, 1 << 20])
@pytest.mark.parametrize("case", range(len(DAMAGED)))
def test_the_fast_reader_equals_the_careful_one(case, block_bytes, monkeypatch):
    monkeypatch.setattr(csv_blocks, "BLOCK_BYTES", block_bytes)
    fast = parse(DAMAGED[case])
    careful = parse(DAMAGED[case], fast=False, monkeypatch=monkeypatch)
    assert fast == careful


def test_a_clean_file_takes_the_fast_path(monkeypatch):
    calls = []
    monkeypatch.setattr(ParseRatingFileFn, "_csv_records",
                        lambda self, rows, names: calls.append(1) or iter(()))
    rows, dead = parse(clean(2000))
    assert len(rows["lines"]) == 2000 and rows["lines"] == list(range(2, 2002)) and not dead and not calls


def test_blocks_end_outside_quotes():
    data = b'a,"x\ny",1\n' * 50
    pieces = list(csv_blocks.blocks(io.BytesIO(data), block_bytes=7))
    assert b"".join(p for _, p in pieces) == data
    assert all(p.count(b'"') % 2 == 0 for _, p in pieces)
    assert [line for line, _ in pieces] == [1 + sum(p.count(b"\n") for _, p in pieces[:i]) for i in range(len(pieces))]


def test_other_encodings_and_delimiters(monkeypatch):
    latin = clean(40, sep=";").replace(b"u3;", "ü3;".encode("latin-1"))
    fmt = RatingsFormat(delimiter=";", encoding="latin-1")
    fast = parse(latin, fmt)
    assert "ü3" in fast[0]["users"] and not fast[1]
    assert fast == parse(latin, fmt, fast=False, monkeypatch=monkeypatch)
    utf16 = clean(40).decode().encode("utf-16")
    assert parse(utf16, RatingsFormat(encoding="utf-16"))[0] == parse(clean(40))[0]


def test_undecodable_reason_is_kept():
    _, dead = parse(DAMAGED[3])
    assert [d["reason"].split(" (")[0] for d in dead] == [rating_files.UNDECODABLE] and dead[0]["line"] == 32


def test_the_light_pre_pass_finds_the_dictionary_and_set_sizes_of_the_main_job(tmp_path):
    """ScanRatings (memory in distinct items and users) gives the dictionary
    and set-size histogram that assembling every user (ReadRatings) gives."""
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline

    from kvldp.mechanisms.frequency.padding import size_histogram
    from kvldp.transforms.ratings import ReadRatings, ScanRatings

    rng = np.random.default_rng(4)
    rows = [f"u{u},i{k},{1 + (u + k) % 5}" for u in range(300) for k in rng.choice(9, 1 + u % 4, replace=False)]
    rows += ["u7,i3,9", "u8,i99,0"]                              # out of range: not counted by either
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating\n" + "\n".join(rows) + "\n")
    out = {name: str(tmp_path / f"{name}.json") for name in ("scan_dict", "scan_sizes", "read_sizes", "read_dict")}

    def keep(name):
        return beam.Map(lambda value, path=out[name]: Path(path).write_text(json.dumps(np.asarray(value).tolist())))

    with TestPipeline() as p:
        scan = p | ScanRatings(str(path), (1.0, 5.0), shards=4)
        scan["dictionary"] | "KeepDict" >> keep("scan_dict")
        scan["sizes"] | "KeepSizes" >> keep("scan_sizes")
        read = p | ReadRatings(str(path), (1.0, 5.0), None, shards=4)
        (read["users"] | beam.Map(size_histogram) | beam.CombineGlobally(
            lambda hs: sum((np.pad(h, (0, 10 - len(h))) for h in hs), np.zeros(10, np.int64)))
         | "KeepRead" >> keep("read_sizes"))
        read["dictionary"] | "KeepReadDict" >> keep("read_dict")
    seen = {name: json.loads(Path(file).read_text()) for name, file in out.items()}
    # an item only a rejected row names (i99) is not published by the light pre-pass
    assert seen["scan_dict"] == [f"i{k}" for k in range(9)] and seen["read_dict"] == seen["scan_dict"] + ["i99"]
    scan_sizes = np.pad(seen["scan_sizes"], (0, 10 - len(seen["scan_sizes"])))
    assert np.array_equal(scan_sizes, seen["read_sizes"]) and scan_sizes.sum() == 300
