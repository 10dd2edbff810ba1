"""What an operator meets before and after a job (issue 16, first part): a
bare relative pattern works, a missing input or an unwritable output is one
line before any compute, and a job that rejects more than --max-reject-rate
of its rows writes its dead letter and fails with the counts."""
from __future__ import annotations

import json
import re

import pytest

from dead_letters import dead_letter
from kvldp.cli import commands as cli

MECH = ["--mechanism", "pckv-grr", "--epsilon", "2"]


def _ratings(path, n_good, n_bad):
    rows = [f"u{u},i{u % 4},{1 + u % 5}" for u in range(n_good)]
    rows += [f"b{u},i{u % 4},99" for u in range(n_bad)]          # out of --rating-range 1,5
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("user,item,rating\n" + "\n".join(rows) + "\n")
    return path


def test_a_bare_relative_pattern_is_found(tmp_path, monkeypatch, capsys):
    assert cli.main(["perturb", *MECH, "--users", "500", "--keys", "4", "--seed", "1",
                     "--output", str(tmp_path / "rep" / "R.avro")]) == 0
    monkeypatch.chdir(tmp_path / "rep")
    capsys.readouterr()
    assert cli.main(["collect", *MECH, "--input", "R-*.avro", "--key-dictionary", "R.keys.txt",
                     "--output", "est.jsonl"]) == 0
    assert "500 reports collected" in capsys.readouterr().out
    assert len((tmp_path / "rep" / "est.jsonl").read_text().splitlines()) == 4


def test_a_missing_input_is_one_line_before_any_compute(tmp_path, capsys):
    for command in (["perturb", "--output", str(tmp_path / "R.avro")], ["simulate"]):
        code = cli.main([*command, *MECH, "--input" if command[0] == "perturb" else "--dataset",
                         str(tmp_path / "nothing-*.csv")])
        err = capsys.readouterr().err
        assert code == 2 and err.strip().count("\n") == 0, err
        assert f"--input '{tmp_path}/nothing-*.csv' matches no file" in err
    code = cli.main(["collect", *MECH, "--input", str(tmp_path / "R-*.avro"), "--keys", "4",
                     "--output", str(tmp_path / "e.jsonl")])
    assert code == 2 and "no report files match" in capsys.readouterr().err


def test_an_output_that_cannot_be_written_is_refused_before_any_compute(tmp_path, capsys):
    ratings = _ratings(tmp_path / "raw" / "r.csv", 50, 0)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    code = cli.main(["perturb", *MECH, "--input", str(ratings), "--rating-range", "1,5",
                     "--output", str(blocker / "rep" / "R.avro")])
    err = capsys.readouterr().err
    assert code == 2 and f"--output {blocker}/rep/R-00000.avro: cannot create {blocker}/rep" in err, err
    assert not (tmp_path / "raw" / "kvldp-rejected").exists()          # nothing ran


def test_too_many_rejected_rows_fail_the_job_after_the_dead_letter(tmp_path, capsys):
    ratings = _ratings(tmp_path / "raw" / "r.csv", 80, 20)             # 20 % rejected
    out = tmp_path / "rep" / "R.avro"
    code = cli.main(["perturb", *MECH, "--input", str(ratings), "--rating-range", "1,5", "--output", str(out)])
    captured = capsys.readouterr()
    assert code == 2
    assert "rows read 100 = accepted 80 + rejected 20 [FAILED: too many rejected]" in captured.out
    assert "20 of 100 rows rejected (20.0%), more than --max-reject-rate 5.0%" in captured.err
    dead = dead_letter(tmp_path / "raw", "R")
    reasons = [json.loads(x)["reason"] for x in dead.read_text().splitlines()]
    assert len(reasons) == 20 and all("outside the declared rating range" in r for r in reasons)
    # the operator who accepts it says so
    assert cli.main(["perturb", *MECH, "--input", str(ratings), "--rating-range", "1,5", "--output", str(out),
                     "--max-reject-rate", "0.25", "--overwrite"]) == 0
    assert cli.main(["simulate", *MECH, "--dataset", str(ratings), "--rating-range", "1,5",
                     "--output", str(tmp_path / "e.jsonl")]) == 2
    assert "more than --max-reject-rate" in capsys.readouterr().err


def test_a_worker_side_failure_is_one_line_naming_the_transform(tmp_path, capsys, monkeypatch):
    """A report file cut in the middle of a block fails inside a worker
    (here without its manifest, which would refuse it first): the operator
    gets the cause and the transform, not Beam's traceback."""
    assert cli.main(["perturb", *MECH, "--users", "20000", "--keys", "8", "--seed", "1",
                     "--output", str(tmp_path / "R.avro")]) == 0
    report = tmp_path / "R-00000.avro"
    (tmp_path / "R.manifest.json").unlink()        # else the manifest's check refuses the file first
    with open(report, "r+b") as fh:
        fh.truncate(report.stat().st_size // 2)
    capsys.readouterr()
    argv = ["collect", *MECH, "--input", str(tmp_path / "R-*.avro"), "--key-dictionary", str(tmp_path / "R.keys.txt"),
            "--output", str(tmp_path / "est.jsonl"), "--no-manifest"]
    assert cli.main(argv) == 1
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].endswith("R-*.avro: no manifest, collected unchecked") and len(lines) == 2, lines
    failure = lines[1]
    # the cause (the cut block: its codec's or Avro's end of data), the element (which file) and the transform
    assert re.match(rf"kvldp collect: failed: {re.escape(str(report))}: InvalidFile: not a valid report file "
                    r"\((EOFError|ZstdError): ", failure), failure
    assert "(in ReadReports/ReadReportFiles)" in failure
    assert "KVLDP_DEBUG=1" in failure
    monkeypatch.setenv("KVLDP_DEBUG", "1")
    with pytest.raises(Exception, match=r"EOFError|Expected|end-of-stream"):
        cli.main(argv)


def test_users_whose_every_row_is_rejected_are_counted_not_silently_dropped(tmp_path, capsys):
    rows = [f"u{u},i{(u + k) % 4},{1 + (u + k) % 5}" for u in range(60) for k in range(2)]
    rows += ["gone1,i1,99", "gone1,i2,98", "gone2,i3,-7"]        # every row out of range
    rows += ["twice,i1,2", "twice,i1,3"]                         # its one key held twice: both rejected
    rows += ["u5,i0,77"]                                         # u5 keeps its good rows: not lost
    ratings = tmp_path / "raw" / "r.csv"
    ratings.parent.mkdir()
    ratings.write_text("user,item,rating\n" + "\n".join(rows) + "\n")
    out = tmp_path / "est.jsonl"
    assert cli.main(["simulate", *MECH, "--dataset", str(ratings), "--rating-range", "1,5", "--shards", "3",
                     "--padding", "2", "--output", str(out), "--max-reject-rate", "0.1"]) == 0
    text = capsys.readouterr().out
    assert "rows read 126 = accepted 120 + rejected 6 [ok]" in text
    assert "3 users had every row rejected: they send no report and are not in n" in text
    assert {json.loads(x)["n_reports"] for x in out.read_text().splitlines()} == {60}


def test_jobs_leave_no_temporary_files_and_default_outputs_land_in_the_working_directory(
        tmp_path, monkeypatch, capsys):
    """Derived dictionaries, set-size histograms and padding pre-passes live
    in scratch directories removed when the job ends (also when it fails);
    simulate's estimates without --output go to the working directory."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr("tempfile.tempdir", str(scratch))
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    ratings = _ratings(tmp_path / "raw" / "r.csv", 60, 0)
    assert cli.main(["perturb", *MECH, "--input", str(ratings), "--rating-range", "1,5", "--padding", "auto",
                     "--output", str(tmp_path / "rep" / "R.avro")]) == 0
    assert cli.main(["simulate", *MECH, "--users", "300", "--keys", "5", "--seed", "2"]) == 0
    assert f"estimates written to {work}/estimates-pckv-grr-eps2.jsonl" in capsys.readouterr().out
    assert len((work / "estimates-pckv-grr-eps2.jsonl").read_text().splitlines()) == 5
    bad = _ratings(tmp_path / "raw2" / "r.csv", 10, 10)
    assert cli.main(["simulate", *MECH, "--dataset", str(bad), "--rating-range", "1,5",
                     "--output", str(tmp_path / "e.jsonl")]) == 2          # fails after its pre-pass
    assert list(scratch.iterdir()) == []


def test_a_worker_error_names_its_element_once():
    from kvldp.runtime.failures import one_line
    from kvldp.transforms.context import ElementError, element_context

    with pytest.raises(ElementError) as caught, element_context("user batch 7 (10 users), round 1"):
        raise ValueError("values outside [-1, 1]")
    assert str(caught.value) == "user batch 7 (10 users), round 1: ValueError: values outside [-1, 1]"
    with pytest.raises(ElementError) as caught, element_context("/d/r.csv"):
        raise ValueError("/d/r.csv: CSV header lacks user")         # already named: not twice
    assert str(caught.value) == "/d/r.csv: ValueError: CSV header lacks user"
    beam_style = RuntimeError("Traceback …\nkvldp.transforms.context.ElementError: /d/r.csv: ValueError: bad "
                              "[while running 'ReadRatings/Parse']")
    assert one_line(beam_style) == "/d/r.csv: ValueError: bad (in ReadRatings/Parse)"
