"""Fuzzing every file the ingest or the collector reads (issue 42).

Parsers: ratings files (CSV, JSON Lines, Avro: parse then validate, the
ingest's two steps), report files (the collect's read: header check, decode,
count), report manifests (``check_delivery``), broadcast files (a later
round's state), key dictionaries, and IOH counts files (``kvldp query``).
Cases are structure-aware: a valid file of the kind, rendered with fields
and bytes an honest writer never produces (Hypothesis, derandomised).

The property (``fuzz_harness``): accepted and counted, a one-line error
naming the file, or a dead letter with its reason. For ratings, rows in =
accepted + rejected: each row the file holds ends in exactly one of the
two, with its own line number.
"""
from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
import tempfile
from pathlib import Path

import fastavro
import numpy as np
import pytest
from apache_beam.pvalue import TaggedOutput
from hypothesis import strategies as st

from fuzz_harness import CAMPAIGN_CASES, DEFAULT_CASES, campaign, refusal
from kvldp import schemas
from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.protocol import Collection
from kvldp.pipelines import manifest, query, sources, split
from kvldp.schemas import envelope
from kvldp.schemas.records import broadcast_records, ioh_counts_record
from kvldp.transforms.io import _ReadReportFileFn
from kvldp.transforms.rating_files import DEAD_LETTER, ParseRatingFileFn, RatingsFormat
from kvldp.transforms.ratings import ValidateAndShardFn

WORK = Path(tempfile.mkdtemp(prefix="kvldp-fuzz-files-"))
D = 6
KEYS = [f"item{i}" for i in range(D)]


class _Readable:
    """What ``fileio.ReadMatches`` hands a DoFn: a path and ``open()``."""

    class metadata:        # noqa: N801 - Beam's attribute name
        path = ""

    def __init__(self, path: str, data: bytes):
        self.metadata = type("metadata", (), {"path": path})()
        self._data = data

    def open(self):
        return io.BytesIO(self._data)


def mutated(draw, data: bytes) -> bytes:
    """``data`` as it left an honest writer, or with bytes flipped, cut or appended."""
    kind = draw(st.sampled_from(["as written", "flip", "cut", "append", "random"]))
    body = bytearray(data)
    if kind == "flip" and body:
        for i in draw(st.lists(st.integers(0, len(body) - 1), min_size=1, max_size=6)):
            body[i] ^= draw(st.integers(1, 255))
    elif kind == "cut" and body:
        body = body[:draw(st.integers(0, len(body) - 1))]
    elif kind == "append":
        body += draw(st.binary(min_size=1, max_size=64))
    elif kind == "random":
        return draw(st.binary(max_size=512))
    return bytes(body)


def _avro(records, schema) -> bytes:
    """``records`` as an Avro container of ``schema``."""
    buf = io.BytesIO()
    fastavro.writer(buf, fastavro.parse_schema(schema), records)
    return buf.getvalue()


# --- ratings files ---------------------------------------------------------------------------------------

FIELD = st.one_of(
    st.sampled_from(["u1", "item0", "item3", "3", "5", "1.5", "", " ", "nan", "inf", "-inf", "1e309", "0x10",
                     "9" * 400, "NaN", "item\n0", "a,b", '"q"', "\ufeffitem1", "\x00", "é", "\udc80"]),
    st.text(max_size=12),
    st.integers(-10, 10).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)
JSON_VALUE = st.one_of(st.none(), st.booleans(), st.integers(-10**30, 10**30), st.floats(), st.text(max_size=8),
                       st.lists(st.integers(), max_size=2), st.dictionaries(st.text(max_size=3), st.integers(),
                                                                            max_size=2))


@st.composite
def rating_files(draw):
    """``(name, bytes, rows the file holds or None when its bytes were mutated, the format)``."""
    fmt = draw(st.sampled_from(["csv", "jsonl", "avro"]))
    n = draw(st.integers(0, 12))
    if fmt == "csv":
        header = draw(st.sampled_from([["user", "item", "rating"], ["user", "item", "rating", "extra"],
                                       ["user", "item"], ["rating", "user", "item"], ["\ufeffuser", "item", "rating"]]))
        rows = [[draw(FIELD) for _ in range(draw(st.sampled_from([3, 3, 3, 2, 4])))] for _ in range(n)]
        text = io.StringIO(newline="")
        writer = csv.writer(text, lineterminator=draw(st.sampled_from(["\n", "\r\n"])))
        writer.writerow(header)
        writer.writerows(rows)
        raw = text.getvalue().encode("utf-8", "surrogateescape")
        if any("\r" in field for row in rows for field in row):
            n = None      # the csv module leaves a lone CR unquoted: readers (rightly) end the row there
    elif fmt == "jsonl":
        lines = []
        for _ in range(n):
            record = {k: draw(st.one_of(FIELD, JSON_VALUE)) for k in draw(
                st.lists(st.sampled_from(["user", "item", "rating", "x"]), unique=True, max_size=4))}
            lines.append(draw(st.sampled_from([json.dumps(record), json.dumps(list(record.values())), "{", "3"])))
        raw = ("\n".join(lines) + "\n").encode("utf-8", "surrogateescape")
    else:
        kind = draw(st.sampled_from(["string", "double", "union", "int", "bytes"]))
        rating_type = {"string": "string", "double": "double", "union": ["null", "double", "string"],
                       "int": "int", "bytes": "bytes"}[kind]
        schema = {"type": "record", "name": "r", "fields": [
            {"name": "user", "type": ["null", "string"]}, {"name": "item", "type": ["null", "string"]},
            {"name": "rating", "type": rating_type}]}
        values = {"string": FIELD, "double": st.floats(), "union": st.one_of(st.none(), st.floats(), FIELD),
                  "int": st.integers(-2**31, 2**31 - 1), "bytes": st.binary(max_size=4)}[kind]
        records = [{"user": draw(st.one_of(st.none(), FIELD)), "item": draw(st.one_of(st.none(), FIELD)),
                    "rating": draw(values)} for _ in range(n)]
        records = [r for r in records if _encodable(r)]
        n = len(records)
        buf = io.BytesIO()
        if draw(st.booleans()) or not records:
            fastavro.writer(buf, fastavro.parse_schema(schema), records)
        else:       # a file that is Avro, but not of records
            fastavro.writer(buf, {"type": "array", "items": "string"}, [[str(r["user"])] for r in records])
        raw = buf.getvalue()
    data = mutated(draw, raw)
    return f"ratings.{fmt}", data, (n if data == raw and n is not None else None), fmt


def _encodable(record: dict) -> bool:
    return all(not isinstance(v, str) or _utf8(v) for v in record.values())


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_ratings(case) -> str:
    name, data, rows, fmt = case
    path = str(WORK / name)
    ratings_format = RatingsFormat()
    try:
        parsed = list(ParseRatingFileFn(ratings_format).process(_Readable(path, data)))
    except Exception as err:
        return refusal(err, path)
    dead = [x.value for x in parsed if isinstance(x, TaggedOutput)]
    assert all(x.tag == DEAD_LETTER for x in parsed if isinstance(x, TaggedOutput))
    chunks = [x for x in parsed if not isinstance(x, TaggedOutput)]
    accepted_lines = []
    validate = ValidateAndShardFn((1.0, 5.0), 2)
    for chunk in chunks:
        for out in validate.process(chunk, KEYS):
            if isinstance(out, TaggedOutput):
                dead.append(out.value)
            else:
                accepted_lines.extend(int(x) for x in out[1]["lines"])
    for letter in dead:
        assert letter["reason"] and letter["source"] == path and letter["line"] >= 1, letter
        json.dumps(letter, allow_nan=False)              # a dead letter is written as JSON
    lines = accepted_lines + [letter["line"] for letter in dead]
    assert len(lines) == len(set(lines)), "a row ended twice"
    if rows is not None:
        header = 1 if fmt == "csv" else 0
        assert len(lines) == rows or (fmt == "jsonl" and len(lines) <= rows), (len(lines), rows)
        assert all(header < line for line in lines)
    return "dead letters" if dead else "accepted"


# --- report files (what collect reads) -------------------------------------------------------------------

MECH = registry.make("pckv-grr", D, 2.0)
CONFIG = dict(MECH.config())
USERS = next(iter(SyntheticDataset("uu", n_users=30, d=D, seed=1).batches(30)))
HONEST = MECH.perturb(USERS, np.random.default_rng(1))


def _report_file(reports=HONEST, config=CONFIG) -> bytes:
    buf = io.BytesIO()
    envelope.write_reports(buf, reports, config)
    return buf.getvalue()


REPORT_FILE = _report_file()


@st.composite
def report_files(draw):
    kind = draw(st.sampled_from(["bytes", "bytes", "values", "config"]))
    if kind == "values":     # decodable, with values no honest client writes
        symbols, positions = np.array(HONEST.symbols), np.array(HONEST.positions)
        for i in draw(st.lists(st.integers(0, len(symbols) - 1), min_size=1, max_size=3)):
            symbols[i] = draw(st.integers(-2**7, 2**7 - 1))
            positions[i] = draw(st.integers(-2**31, 2**31 - 1))
        return _report_file(dataclasses.replace(HONEST, symbols=symbols.astype(HONEST.symbols.dtype),
                                                positions=positions.astype(HONEST.positions.dtype)))
    if kind == "config":
        config = dict(CONFIG)
        config[draw(st.sampled_from(sorted(config)))] = draw(st.one_of(JSON_VALUE, FIELD))
        return _report_file(config=config)
    return mutated(draw, REPORT_FILE)


def check_reports(data: bytes) -> str:
    path = str(WORK / "reports-00000.avro")
    read = _ReadReportFileFn(MECH, 0, CONFIG, 50_000)
    try:
        batches = list(read.process(_Readable(path, data)))
        counts = MECH.new_round_counts(0)
        for reports in batches:
            counts = MECH.accumulate_round(0, counts, reports)
    except Exception as err:
        return refusal(err, path)
    return "accepted"


# --- manifests ------------------------------------------------------------------------------------------

def _delivery(manifest_text: bytes) -> Path:
    out = Path(tempfile.mkdtemp(dir=WORK))
    (out / "R-00000.avro").write_bytes(REPORT_FILE)
    if manifest_text is not None:
        (out / "R.manifest.json").write_bytes(manifest_text)
    return out


_seed = _delivery(None)
MANIFEST = json.dumps(manifest.write_manifest(str(_seed / "R"), CONFIG, KEYS, (1, 5))).encode()


@st.composite
def manifests(draw):
    kind = draw(st.sampled_from(["bytes", "json", "json"]))
    if kind == "bytes":
        return mutated(draw, MANIFEST)
    doc = json.loads(MANIFEST)
    for _ in range(draw(st.integers(1, 3))):
        target = doc
        if draw(st.booleans()) and doc.get("files"):
            target = doc["files"][0] if isinstance(doc["files"], list) and isinstance(doc["files"][0], dict) else doc
        key = draw(st.sampled_from(sorted(target) or ["x"]))
        if draw(st.booleans()):
            target.pop(key, None)
        else:
            target[key] = draw(JSON_VALUE)
    return json.dumps(doc).encode()


def check_manifest(text: bytes) -> str:
    out = _delivery(text)
    pattern = str(out / "R-*.avro")
    try:
        manifest.check_delivery(pattern, KEYS, allow_partial=True)
        manifest.rating_scale(pattern)
    except Exception as err:
        return refusal(err, str(out / "R"))
    return "accepted"


# --- broadcasts -----------------------------------------------------------------------------------------

PRIVKVM = registry.make("privkvm", D, 2.0, rounds=2)


def _broadcast_bytes() -> bytes:
    state = PRIVKVM.initial_state(Collection.from_seed(7))
    reports = PRIVKVM.perturb_round(0, USERS, np.random.default_rng(2), state)
    counts = PRIVKVM.accumulate_round(0, PRIVKVM.new_round_counts(0), reports)
    state = PRIVKVM.next_state(0, state, counts)
    return _avro(broadcast_records(state, PRIVKVM, KEYS), schemas.load(schemas.BROADCAST))


BROADCAST_FILE = _broadcast_bytes()


@st.composite
def broadcasts(draw):
    if draw(st.booleans()):
        return mutated(draw, BROADCAST_FILE)
    records = list(fastavro.reader(io.BytesIO(BROADCAST_FILE)))
    for _ in range(draw(st.integers(1, 3))):
        action = draw(st.sampled_from(["drop", "duplicate", "field"]))
        i = draw(st.integers(0, len(records) - 1))
        if action == "drop" and len(records) > 1:
            records.pop(i)
        elif action == "duplicate":
            records.append(dict(records[i]))
        else:
            field = draw(st.sampled_from(sorted(records[i])))
            old = records[i][field]
            new = {str: FIELD, float: st.floats(), int: st.integers(-2**63, 2**63 - 1), bool: st.booleans(),
                   type(None): st.none()}.get(type(old), st.none())
            records[i][field] = draw(new) if draw(st.booleans()) else draw(st.sampled_from(
                ["{", "[]", "{}", json.dumps({"x": 1}), "null", ""])) if isinstance(old, str) else draw(new)
    buf = io.BytesIO()
    try:
        fastavro.writer(buf, schemas.parsed(schemas.BROADCAST), [r for r in records if _encodable(r)])
    except (ValueError, TypeError, OverflowError):
        return BROADCAST_FILE[:40]
    return buf.getvalue()


def check_broadcast(data: bytes) -> str:
    path = WORK / "broadcast.avro"
    path.write_bytes(data)
    try:
        split.protocol_state_for_round(PRIVKVM, 2, str(path), KEYS)
    except Exception as err:
        return refusal(err, str(path))
    return "accepted"


# --- key dictionaries -----------------------------------------------------------------------------------

@st.composite
def dictionaries(draw):
    names = draw(st.lists(st.one_of(st.sampled_from(KEYS), FIELD), max_size=10))
    raw = draw(st.sampled_from(["\n", "\r\n"])).join(names).encode("utf-8", "surrogateescape")
    return mutated(draw, raw)


def check_dictionary(data: bytes) -> str:
    path = WORK / "keys.txt"
    path.write_bytes(data)
    try:
        names = sources.read_dictionary(str(path))
    except Exception as err:
        return refusal(err, str(path))
    assert names and len(set(names)) == len(names) and all(names) and all("\n" not in x for x in names)
    return "accepted"


# --- IOH counts files (kvldp query) ---------------------------------------------------------------------

IOH = registry.make("ioh-oue", D, 2.0, ioh_keys=[0, 1])

def _counts_bytes() -> bytes:
    reports = IOH.perturb(USERS, np.random.default_rng(3))
    counts = IOH.accumulate(IOH.new_counts(), reports)
    return _avro([ioh_counts_record(counts, IOH, KEYS, truth=None)], schemas.load(schemas.IOH_COUNTS))


COUNTS_FILE = _counts_bytes()


@st.composite
def counts_files(draw):
    if draw(st.booleans()):
        return mutated(draw, COUNTS_FILE)
    [record] = list(fastavro.reader(io.BytesIO(COUNTS_FILE)))
    field = draw(st.sampled_from(sorted(record)))
    record[field] = draw({"keys": st.lists(FIELD.filter(_utf8), max_size=4),
                          "support": st.lists(st.integers(-2**63, 2**63 - 1), max_size=20),
                          "truth": st.one_of(st.none(), st.lists(st.floats(), max_size=20)),
                          "n_reports": st.integers(-2**63, 2**63 - 1), "p": st.floats(), "q": st.floats(),
                          "epsilon": st.floats(), "mechanism": FIELD.filter(_utf8)}[field])
    buf = io.BytesIO()
    records = [record] * draw(st.sampled_from([1, 1, 1, 0, 2]))
    fastavro.writer(buf, schemas.parsed(schemas.IOH_COUNTS), records)
    return buf.getvalue()


QUERIES = ["item1", "target=item1 given item0=1", "item0 given item1=0", "item1 given item0=1,item0=0",
           "item1 given x=2"]


def check_counts(case) -> str:
    data, q = case
    path = WORK / "counts.avro"
    path.write_bytes(data)
    try:
        counts = query.load_counts(str(path))
    except Exception as err:
        return refusal(err, str(path))
    try:                 # the query is the operator's: its error names what in it is wrong
        target, given = query.parse_query(q, counts.keys)
    except ValueError as err:
        return refusal(err, *re.findall(r"\w+", q))
    json.dumps(query.answer(counts, target, given))
    return "accepted"


PARSERS = {
    "ratings files (CSV, JSONL, Avro)": (rating_files(), check_ratings),
    "report files": (report_files(), check_reports),
    "report manifests": (manifests(), check_manifest),
    "broadcast files": (broadcasts(), check_broadcast),
    "key dictionaries": (dictionaries(), check_dictionary),
    "IOH counts files (query)": (st.tuples(counts_files(), st.sampled_from(QUERIES)), check_counts),
}


@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_every_file_is_accepted_or_refused_in_one_line(parser):
    strategy, check = PARSERS[parser]
    tally = campaign(strategy, check, DEFAULT_CASES, parser)
    assert tally["accepted"] + tally["dead letters"] > 0 and tally["refused"] > 0, tally   # both branches reached


@pytest.mark.slow
@pytest.mark.parametrize("parser", sorted(PARSERS))
def test_campaign_every_file_is_accepted_or_refused_in_one_line(parser):
    strategy, check = PARSERS[parser]
    campaign(strategy, check, CAMPAIGN_CASES, parser)


def test_the_honest_files_are_accepted():
    """Guard: each parser's seed file passes, so the fuzzer mutates valid input."""
    assert check_reports(REPORT_FILE) == "accepted"
    assert check_manifest(MANIFEST) == "accepted"
    assert check_broadcast(BROADCAST_FILE) == "accepted"
    assert check_counts((COUNTS_FILE, "item1 given item0=1")) == "accepted"
    assert os.path.isdir(WORK)


def _flipped(data: bytes, at: int) -> bytes:
    body = bytearray(data)
    body[at] ^= 0xFF
    return bytes(body)


_no_files = json.loads(MANIFEST)
del _no_files["files"]
_one_key_less = [r for r in fastavro.reader(io.BytesIO(BROADCAST_FILE)) if r["key"] != "item0"]
_support_short = next(iter(fastavro.reader(io.BytesIO(COUNTS_FILE))))
_support_short["support"] = _support_short["support"][:5]
_rating = {"type": "record", "name": "r", "fields": [{"name": "user", "type": ["null", "string"]},
                                                     {"name": "item", "type": "string"},
                                                     {"name": "rating", "type": "double"}]}

_stopped = [{**r, "stopped": True} for r in fastavro.reader(io.BytesIO(BROADCAST_FILE))]
_newline_hash = {**json.loads(MANIFEST), "key_dictionary_sha256": "\n"}

# what the campaign found, smallest form; each failed before its fix (the exception it raised then)
FOUND = {
    "a key dictionary that is not UTF-8 (UnicodeDecodeError, no file named)": (check_dictionary, b"item0\n\x80\n"),
    "a manifest that is not JSON (JSONDecodeError, no file named)": (check_manifest, b"{"),
    "a manifest without its files (KeyError: 'files')": (check_manifest, json.dumps(_no_files).encode()),
    "a broadcast saying the protocol stopped (ValueError, no file named; the 20,000-case campaign)":
        (check_broadcast, _avro(_stopped, schemas.load(schemas.BROADCAST))),
    "a manifest whose dictionary hash is a line break (a two-line error; the 20,000-case campaign)":
        (check_manifest, json.dumps(_newline_hash).encode()),
    "a truncated broadcast (IndexError/EOFError in fastavro)":
        (check_broadcast, BROADCAST_FILE[:len(BROADCAST_FILE) // 2]),
    "12 bytes asking fastavro for more memory than the machine has (MemoryError)":
        (check_broadcast, b"\x00\x00\x00\x00\x01\x00\x80\x80\x80\x80\x80\x02"),
    "a broadcast missing a key (ValueError, no file named)": (check_broadcast, _avro(
        _one_key_less, schemas.load(schemas.BROADCAST))),
    "a counts file with 5 cell sums for 2 keys (ValueError, no file named)": (check_counts, (_avro(
        [_support_short], schemas.load(schemas.IOH_COUNTS)), "item1")),
    "a report file whose compressed block is damaged (ZstdError)": (check_reports, _flipped(REPORT_FILE, -30)),
    "a report file with a PCKV sign of 0 (ValueError in the combine of everyone's reports)": (
        check_reports, _report_file(dataclasses.replace(HONEST, symbols=np.concatenate(
            [[0], HONEST.symbols[1:]]).astype(HONEST.symbols.dtype)))),
    "a lone CR in a CSV row (two rows given the same line number; the 100,000-case campaign)": (
        check_ratings, ("ratings.csv", b"user,item,rating\nu1,u1,u1\nu1,u1\nu1,u1,\r0\nu", None, "csv")),
    "an Avro ratings file of arrays (AttributeError: 'list' object has no attribute 'get')": (
        check_ratings, ("ratings.avro", _avro([["u1"]], {"type": "array", "items": "string"}), 1, "avro")),
    "a NaN rating of a row without a user (a dead letter JSON readers refuse: NaN)": (
        check_ratings, ("ratings.avro", _avro([{"user": None, "item": "item0", "rating": float("nan")}], _rating),
                        1, "avro")),
}


@pytest.mark.parametrize("case", sorted(FOUND))
def test_what_the_campaign_found_is_refused_in_one_line(case):
    check, data = FOUND[case]
    assert check(data) in {"refused", "dead letters"}


def test_collect_names_a_report_file_no_honest_client_wrote(tmp_path, capsys):
    """End to end: ``kvldp collect`` over an honest file and a crafted one
    (one report's sign 0) fails in one line naming the crafted file, and
    writes no estimates. Before: the combine of every file's reports raised,
    naming no file."""
    from kvldp.cli import commands as cli
    mech = ["--mechanism", "pckv-grr", "--epsilon", "2"]
    assert cli.main(["perturb", *mech, "--users", "400", "--keys", str(D), "--seed", "1", "--batch-size", "200",
                     "--output", str(tmp_path / "R.avro")]) == 0
    crafted = tmp_path / "R-00001.avro"
    config = envelope.ReportContainer(io.BytesIO(crafted.read_bytes())).config
    reports = next(envelope.ReportContainer(io.BytesIO(crafted.read_bytes())).batches(MECH, 0))
    reports = dataclasses.replace(reports, symbols=np.concatenate([[0], reports.symbols[1:]]).astype(
        reports.symbols.dtype))
    crafted.write_bytes(_report_file(reports, config))
    (tmp_path / "R.manifest.json").unlink()       # the crafting device writes no manifest that vouches for it
    capsys.readouterr()
    code = cli.main(["collect", *mech, "--input", str(tmp_path / "R-*.avro"), "--key-dictionary",
                     str(tmp_path / "R.keys.txt"), "--no-manifest", "--output", str(tmp_path / "e.jsonl")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code != 0 and str(crafted) in err[-1] and "signs must be +1 or -1" in err[-1], err   # one line
    assert "no manifest" in err[0] and len(err) == 2, err
    assert not (tmp_path / "e.jsonl").exists()
