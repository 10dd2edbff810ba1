"""Ratings files as operators have them (issue 16): other delimiters,
encodings and headerless files are read by flags; an undecodable or
malformed row goes to the dead letter with its reason (rows in = accepted +
rejected); item ids are kept exactly, so ids that differ only in whitespace
stay two keys instead of colliding in the dictionary."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from kvldp.cli import commands as cli
from kvldp.pipelines import sources

MECH = ["--mechanism", "pckv-grr", "--epsilon", "2"]


def perturb(tmp_path, raw: bytes, *flags, name="r.csv"):
    """``kvldp perturb`` over ``raw``: (exit code, stdout, stderr, dictionary, dead letters)."""
    ratings = tmp_path / "raw" / name
    ratings.parent.mkdir(exist_ok=True)
    ratings.write_bytes(raw)
    out = tmp_path / "rep" / "R.avro"
    code = cli.main(["perturb", *MECH, "--input", str(ratings), "--rating-range", "1,5",
                     "--output", str(out), "--overwrite", *flags])
    return code, out.parent / "R.keys.txt", tmp_path / "raw" / "kvldp-rejected"


def dead_letters(directory) -> list[dict]:
    """The rows of every dead letter in ``directory`` (one file per run that rejected any)."""
    return [json.loads(x) for f in sorted(directory.glob("*.rejected.jsonl")) for x in f.read_text().splitlines()]


def rows(n: int, sep: str = ",") -> list[str]:
    return [sep.join((f"u{u}", f"i{u % 3}", str(1 + u % 5))) for u in range(n)]


def test_a_semicolon_file_is_read_with_delimiter_and_refused_with_a_hint_without(tmp_path, capsys):
    raw = ("user;item;rating\n" + "\n".join(rows(30, ";")) + "\n").encode()
    code, keys, _ = perturb(tmp_path, raw)
    err = capsys.readouterr().err
    assert code == 2 and "lacks column(s)" in err and "--delimiter" in err and err.count("\n") == 1, err
    code, keys, _dead = perturb(tmp_path, raw, "--delimiter", ";")
    assert code == 0 and keys.read_text().split() == ["i0", "i1", "i2"]
    assert "rows read 30 = accepted 30 + rejected 0 [ok]" in capsys.readouterr().out


def test_tab_separated_headerless_file_with_named_columns(tmp_path, capsys):
    lines = [f"{1 + u % 5}\tu{u}\ti{u % 3}\textra" for u in range(24)]
    raw = ("\n".join(lines) + "\n").encode()
    code, keys, _ = perturb(tmp_path, raw, "--delimiter", "tab", "--no-header",
                            "--column-names", "stars,who,what,note", "--user-col", "who", "--item-col", "what",
                            "--rating-col", "stars", name="r.tsv", )
    assert code == 2 and "cannot tell the format" in capsys.readouterr().err      # .tsv: say the format
    code, keys, _ = perturb(tmp_path, raw, "--delimiter", "tab", "--no-header", "--input-format", "csv",
                            "--column-names", "stars,who,what,note", "--user-col", "who", "--item-col", "what",
                            "--rating-col", "stars", name="r.tsv")
    assert code == 0 and keys.read_text().split() == ["i0", "i1", "i2"]
    assert "rows read 24 = accepted 24 + rejected 0 [ok]" in capsys.readouterr().out


def test_a_headerless_three_column_file_needs_only_no_header(tmp_path, capsys):
    raw = ("\n".join(rows(20)) + "\n").encode()
    code, _, _ = perturb(tmp_path, raw, "--max-reject-rate", "1")
    # read with a header, the first row is taken for column names: refused, with the way out
    assert code == 2 and "--no-header" in capsys.readouterr().err
    code, _keys, _dead = perturb(tmp_path, raw, "--no-header")
    assert code == 0 and "rows read 20 = accepted 20 + rejected 0 [ok]" in capsys.readouterr().out


def test_an_undecodable_byte_rejects_its_row_not_the_job(tmp_path, capsys):
    good = rows(60)
    raw = ("user,item,rating\n" + "\n".join(good[:30])).encode() + b"\nu99,caf\xe9,3\n" + \
        ("\n".join(good[30:]) + "\n").encode()
    code, keys, dead = perturb(tmp_path, raw, "--max-reject-rate", "0.05")
    assert code == 0, capsys.readouterr().err
    assert "rows read 61 = accepted 60 + rejected 1 [ok]" in capsys.readouterr().out
    [letter] = dead_letters(dead)
    assert letter["line"] == 32 and letter["reason"].startswith("undecodable bytes (not utf-8")
    assert letter["row"] == ["u99", "caf\\xe9", "3"]
    # the same bytes are Latin-1 text: with --encoding every row is read
    code, keys, dead = perturb(tmp_path, raw, "--encoding", "latin-1")
    assert code == 0 and "café" in keys.read_text(encoding="utf-8").split()
    assert "rows read 61 = accepted 61 + rejected 0 [ok]" in capsys.readouterr().out


def test_an_undecodable_jsonl_line_goes_to_the_dead_letter(tmp_path, capsys):
    good = [json.dumps({"user": f"u{u}", "item": f"i{u % 3}", "rating": 2}) for u in range(40)]
    raw = ("\n".join(good) + "\n").encode() + b'{"user": "x", "item": "\xff\xfe", "rating": 2}\n'
    code, _, dead = perturb(tmp_path, raw, "--max-reject-rate", "0.05", name="r.jsonl")
    assert code == 0 and "rows read 41 = accepted 40 + rejected 1 [ok]" in capsys.readouterr().out
    [letter] = dead_letters(dead)
    assert letter["line"] == 41 and "undecodable bytes" in letter["reason"] and "\\xff\\xfe" in letter["row"]


def test_item_ids_that_differ_only_in_whitespace_stay_two_keys(tmp_path, capsys):
    rows_ = [f"u{u},{' A' if u % 3 == 0 else 'A' if u % 3 == 1 else 'A '},{1 + u % 5}" for u in range(30)]
    code, keys, _ = perturb(tmp_path, ("user,item,rating\n" + "\n".join(rows_) + "\n").encode())
    assert code == 0, capsys.readouterr().err
    assert sources.read_dictionary(str(keys)) == [" A", "A", "A "]
    assert "rows read 30 = accepted 30 + rejected 0 [ok]" in capsys.readouterr().out


def test_an_item_id_with_a_line_break_is_rejected_with_its_reason(tmp_path, capsys):
    raw = ("user,item,rating\n" + "\n".join(rows(40)) + '\nz,"two\nlines",3\n').encode()
    code, _keys, dead = perturb(tmp_path, raw, "--max-reject-rate", "0.05")
    assert code == 0 and "rows read 41 = accepted 40 + rejected 1 [ok]" in capsys.readouterr().out
    [letter] = dead_letters(dead)
    assert letter["reason"] == "malformed row: the item id holds a line break" and letter["line"] == 43


def test_a_dictionary_keeps_whitespace_and_names_a_duplicate(tmp_path):
    path = tmp_path / "keys.txt"
    path.write_bytes(b"a\r\n b\r\nc \n\n")
    assert sources.read_dictionary(str(path)) == ["a", " b", "c "]
    path.write_text("a\nb\na\n")
    with pytest.raises(ValueError, match="lists a key twice: 'a'"):
        sources.read_dictionary(str(path))


@pytest.mark.parametrize("flags, message", [
    (["--delimiter", "ab"], "must be one character"),
    (["--encoding", "klingon"], "not an encoding Python knows"),
    (["--column-names", "a,,b"], "an empty column name"),
    (["--user-col", "x", "--item-col", "x"], "three different columns"),
])
def test_bad_format_flags_are_refused_before_any_compute(tmp_path, capsys, flags, message):
    try:
        code, _, _ = perturb(tmp_path, b"user,item,rating\nu,i,1\n", *flags)
    except SystemExit as parse_error:             # argparse: usage, then the error line
        code = parse_error.code
    err = capsys.readouterr().err
    assert code == 2 and message in err.splitlines()[-1], err
    assert not (tmp_path / "rep").exists()


@pytest.mark.parametrize("users", [
    ["u2", "u1", "u2", "u3", "u1", "u2"],
    ["é", "b", "日本", "é", "", "b\x00"],
    [],
])
def test_users_are_grouped_and_sorted_as_np_unique_does(users):
    """Each row's user is its distinct id, and sorted, the ids and the rows'
    indices are those of np.unique (code point order); shards are
    ``stable_shard``'s, read from the UTF-8 bytes."""
    from kvldp.transforms.rating_files import id_column
    from kvldp.transforms.ratings import (
        distinct_users,
        sorted_distinct_users,
        stable_shard,
        user_parts,
        user_shards,
    )

    column = id_column(users)
    distinct, row_user = distinct_users(column)
    assert [distinct[int(i)].as_py() for i in row_user] == users
    names, index = sorted_distinct_users(column)
    ref_names, ref_index = np.unique(np.array(users, dtype=object), return_inverse=True)
    assert names.to_pylist() == list(ref_names) and index.tolist() == ref_index.ravel().tolist()
    assert user_shards(names, 16).tolist() == [stable_shard(u, 16) for u in ref_names]
    assert user_shards(names.slice(1), 7).tolist() == [stable_shard(u, 7) for u in ref_names[1:]]
    parts = user_parts(column, 5)          # the pre-pass's partition: one part per id, in range
    assert all(0 <= p < 5 for p in parts)
    assert len({(u, int(p)) for u, p in zip(users, parts, strict=True)}) == len(set(users))
    assert user_parts(column.slice(2), 5).tolist() == parts[2:].tolist()


def test_an_id_that_is_not_unicode_text_is_a_dead_letter(tmp_path):
    """JSON can spell an unpaired surrogate (``"\\udc80"``), which no UTF-8
    file -- the dictionary, an Arrow column -- can hold: the row is
    rejected with the reason, and rows in = accepted + rejected."""
    path = tmp_path / "r.jsonl"
    path.write_text('{"user": "a", "item": "x", "rating": 1}\n'
                    '{"user": "\\udc80", "item": "x", "rating": 2}\n'
                    '{"user": "b", "item": "\\ud800y", "rating": 3}\n')
    out = tmp_path / "out"
    cli.main(["perturb", "--mechanism", "pckv-grr", "--epsilon", "1", "--padding", "1", "--rating-range", "1,5",
              "--seed", "1", "--max-reject-rate", "1", "--input", str(path), "--output", str(out / "r.avro")])
    dead = dead_letters(tmp_path / "kvldp-rejected")
    assert sorted(d["line"] for d in dead) == [2, 3]
    assert all("unpaired surrogate" in d["reason"] for d in dead)


def test_stable_ids_are_made_only_for_jobs_that_recognise_devices(tmp_path):
    """``ReadRatings(stable_ids=False)`` gives the same users without their
    ids (``memo.user_uid``, a BLAKE2b a user: a fifth of assembling them);
    the jobs ask for them only for the longitudinal mode and the ledger."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from apache_beam.testing.util import BeamAssertException, assert_that

    from kvldp.mechanisms import registry
    from kvldp.mechanisms.kv.longitudinal import longitudinal
    from kvldp.mechanisms.privacy.memo import user_uid
    from kvldp.pipelines import devices
    from kvldp.transforms.ratings import ReadRatings

    path = tmp_path / "r.csv"
    path.write_text("user,item,rating\n" + "\n".join(rows(500)) + "\n")

    def check(with_ids):
        def same(batches):
            users = sorted(batches, key=lambda b: b.batch_id)
            if not users or any((b.user_ids is not None) != with_ids for b in users):
                raise BeamAssertException(f"ids present: {[b.user_ids is not None for b in users]}")
            if with_ids and not all(len(b.user_ids) == b.n_users and b.user_ids.dtype == np.uint64 for b in users):
                raise BeamAssertException("one stable id per user")
            if sum(b.n_users for b in users) != 500:
                raise BeamAssertException("users lost")
        return same

    for with_ids in (True, False):
        with beam.Pipeline(runner=FnApiRunner()) as p:
            read = p | ReadRatings(str(path), (1.0, 5.0), ["i0", "i1", "i2"], stable_ids=with_ids)
            assert_that(read["users"], check(with_ids))
    assert user_uid(["u1"]).dtype == np.uint64
    plain = registry.make("pckv-grr", 3, 2.0)
    assert not devices.needs_stable_ids(plain) and devices.needs_stable_ids(plain, gate=object())
    assert devices.needs_stable_ids(longitudinal(registry.make("pckv-grr", 3, 2.0), eps_1=1.0))


def test_a_shard_larger_than_the_batch_size_is_split_into_consecutive_batches():
    """``split_shard``: a shard that fits stays one batch with its own id (its
    noise and groups unchanged); a larger one becomes batches of at most
    ``max_users`` consecutive users, ids ``shard + k * shards``, distinct
    across shards, the users and their pairs in order."""
    from kvldp.mechanisms.base import UserBatch
    from kvldp.transforms.ratings import split_shard

    rng = np.random.default_rng(2)
    sizes = rng.integers(1, 5, size=23)
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    users = UserBatch(offsets, rng.integers(0, 50, offsets[-1]), rng.uniform(-1, 1, offsets[-1]), batch_id=3,
                      user_ids=np.arange(100, 123, dtype=np.uint64))
    assert [b.batch_id for b in split_shard(users, 16, 23)] == [3] and next(split_shard(users, 16, None)) is users
    parts = list(split_shard(users, 16, 10))
    assert [b.batch_id for b in parts] == [3, 19, 35] and [b.n_users for b in parts] == [10, 10, 3]
    again = UserBatch.concat(parts, batch_id=3)
    for field in ("offsets", "keys", "values", "user_ids"):
        assert np.array_equal(getattr(again, field), getattr(users, field)), field
    other_shard = {b.batch_id for b in split_shard(dataclasses.replace(users, batch_id=4), 16, 10)}
    assert other_shard == {4, 20, 36} and not other_shard & {b.batch_id for b in parts}
