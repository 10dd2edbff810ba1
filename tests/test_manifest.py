"""collect checks a delivery against perturb's manifest before any compute
(kvldp/pipelines/manifest.py): missing, extra (stale or foreign), truncated
files and an edited key dictionary are one-line errors naming the file;
--allow-partial collects what is there and says what is missing."""
from __future__ import annotations

import json
import re
import shutil

import pytest

from kvldp.cli import commands as cli

MECH = ["--mechanism", "pckv-grr", "--epsilon", "2"]


@pytest.fixture
def delivery(tmp_path, capsys):
    ratings = tmp_path / "raw" / "r.csv"
    ratings.parent.mkdir()
    ratings.write_text("user,item,rating\n" + "\n".join(f"u{u},i{u % 6},{1 + u % 5}" for u in range(3000)) + "\n")
    rep = tmp_path / "rep"
    assert cli.main(["perturb", *MECH, "--input", str(ratings), "--rating-range", "1,5", "--shards", "4",
                     "--seed", "3", "--output", str(rep / "R.avro")]) == 0
    assert "listed in" in capsys.readouterr().out
    return {"rep": rep, "ratings": ratings, "tmp": tmp_path}


def collect(delivery, *extra, dictionary=None):
    rep = delivery["rep"]
    return cli.main(["collect", *MECH, "--input", str(rep / "R-*.avro"),
                     "--key-dictionary", str(dictionary or rep / "R.keys.txt"),
                     "--output", str(delivery["tmp"] / "est.jsonl"), *extra])


def test_a_complete_delivery_is_collected(delivery, capsys):
    manifest = json.loads((delivery["rep"] / "R.manifest.json").read_text())
    assert manifest["reports"] == 3000 and len(manifest["files"]) == 4
    assert sum(f["records"] for f in manifest["files"]) == 3000
    assert collect(delivery) == 0
    assert "3000 reports collected" in capsys.readouterr().out


def test_a_missing_file_is_an_error_unless_partial_is_allowed(delivery, capsys):
    gone = delivery["rep"] / "R-00002.avro"
    records = next(f["records"] for f in json.loads((delivery["rep"] / "R.manifest.json").read_text())["files"]
                   if f["name"] == gone.name)
    gone.unlink()
    assert collect(delivery) == 2
    err = capsys.readouterr().err
    assert f"1 of 4 report files of {delivery['rep']}/R are missing (R-00002.avro; {records} of 3000 reports)" in err
    assert "--allow-partial" in err
    assert collect(delivery, "--allow-partial") == 0
    captured = capsys.readouterr()
    assert "PARTIAL: 1 of 4 report files" in captured.err
    assert f"{3000 - records} reports collected" in captured.out


def test_a_stale_or_foreign_file_is_an_error(delivery, capsys):
    shutil.copy(delivery["rep"] / "R-00001.avro", delivery["rep"] / "R-00009.avro")
    assert collect(delivery) == 2
    assert "R-00009.avro match" in capsys.readouterr().err


def test_a_truncated_file_is_an_error_naming_it(delivery, capsys):
    path = delivery["rep"] / "R-00003.avro"
    with open(path, "r+b") as fh:
        fh.truncate(path.stat().st_size - 10)
    assert collect(delivery) == 2
    assert f"{path} is not the file perturb wrote" in capsys.readouterr().err


def test_a_reordered_dictionary_is_refused(delivery, capsys):
    names = (delivery["rep"] / "R.keys.txt").read_text().split()
    edited = delivery["tmp"] / "keys.txt"
    edited.write_text("\n".join([names[1], names[0], *names[2:]]) + "\n")
    assert collect(delivery, dictionary=edited) == 2
    err = capsys.readouterr().err
    assert "the key dictionary is not the one" in err and "relabels every key" in err


def test_reports_without_a_manifest_need_no_manifest(delivery, capsys):
    (delivery["rep"] / "R.manifest.json").unlink()
    assert collect(delivery) == 2
    assert "no manifest" in capsys.readouterr().err
    assert collect(delivery, "--no-manifest") == 0


def test_a_rerun_of_perturb_replaces_the_earlier_run(delivery, capsys):
    """Fewer shards the second time: refused without --overwrite (issue 39: never in silence); with it the
    first run's extra files are removed, not left to be collected."""
    argv = ["perturb", *MECH, "--input", str(delivery["ratings"]), "--rating-range", "1,5", "--shards", "2",
            "--seed", "3", "--output", str(delivery["rep"] / "R.avro")]
    assert cli.main(argv) == 2 and "pass --overwrite" in capsys.readouterr().err
    assert cli.main([*argv, "--overwrite"]) == 0
    assert re.search(r"--overwrite: removed \d+ file\(s\) of an earlier run", capsys.readouterr().err)
    assert sorted(p.name for p in delivery["rep"].glob("R-*.avro")) == ["R-00000.avro", "R-00001.avro"]
    assert collect(delivery) == 0
