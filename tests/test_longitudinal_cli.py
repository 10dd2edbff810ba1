"""``--longitudinal --eps-inf A --eps-1 B`` on the jobs: generated from
``LongitudinalOptions``, validated before any compute, and a collector that
is not told the mode refuses the reports instead of mis-calibrating them."""
from __future__ import annotations

import json

import pytest

from example_data import example_ratings
from kvldp.cli import commands as cli
from kvldp.mechanisms.kv.longitudinal import Longitudinal
from kvldp.pipelines import run_seed

RATINGS = example_ratings()
LONGITUDINAL = ["--longitudinal", "--eps-inf", "2", "--eps-1", "0.5"]


@pytest.mark.parametrize("command, extra", [
    ("simulate", []),
    ("perturb", ["--input", RATINGS, "--output", "out/R.avro"]),
    ("publish", ["--input", RATINGS, "--topic", "projects/kvldp-demo/topics/reports"]),
    ("collect", ["--input", "R*.avro", "--keys", "5", "--output", "e.csv"]),
    ("stream", ["--subscription", "projects/kvldp-demo/subscriptions/reports-sub", "--keys", "5",
                "--output-dir", "panes", "--window", "1m"]),
])
def test_the_jobs_take_the_longitudinal_flags(command, extra):
    _, config, _ = cli.configure([command, "--mechanism", "pckv-ue", "--epsilon", "2", *LONGITUDINAL, *extra])
    chosen = getattr(config, "mechanism", None) or config.perturb.mechanism
    assert chosen.longitudinal.eps_1 == 0.5
    mech = chosen.make(5)
    assert isinstance(mech, Longitudinal) and mech.eps_inf == 2.0 and mech.eps_1 == 0.5
    assert mech.config()["longitudinal"] is True


def test_evaluate_takes_them_for_its_collections(tmp_path):
    _, config, _ = cli.configure(["evaluate", "--collections", "3", "--epsilons", "2", "--eps-1", "0.5",
                                  "--out", str(tmp_path)])
    assert config.collections == 3 and config.longitudinal.eps_1 == 0.5


@pytest.mark.parametrize("argv, message", [
    (["--eps-1", "0.5"], "need --longitudinal"),
    (["--longitudinal", "--eps-inf", "3"], "differs from --epsilon"),
    (["--longitudinal", "--eps-1", "3"], "exceeds eps_inf"),
    (["--longitudinal=false", "--eps-1", "1"], "need --longitudinal"),
])
def test_inconsistent_flags_are_refused(argv, message, capsys):
    assert cli.main(["simulate", "--mechanism", "pckv-ue", "--epsilon", "2", "--users", "100", *argv]) == 2
    assert message in capsys.readouterr().err


def test_unsupported_mechanism_is_refused(capsys):
    assert cli.main(["simulate", "--mechanism", "privkv", "--epsilon", "2", "--users", "100", "--longitudinal"]) == 2
    assert "implemented for pckv-ue, pckv-grr, ks-ue, kvue" in capsys.readouterr().err


def test_simulate_in_the_longitudinal_mode(capsys):
    assert cli.main(["simulate", "--mechanism", "kvue", "--epsilon", "2", *LONGITUDINAL[3:], "--longitudinal",
                     "--users", "20000", "--keys", "10", "--seed", "3", "--output", "est.jsonl"]) == 0
    assert "longitudinal=True, eps_inf=2.0, eps_1=0.5" in capsys.readouterr().out
    with open("est.jsonl") as fh:
        rows = [json.loads(line) for line in fh]
    assert len(rows) == 10 and all(r["epsilon"] == 2.0 for r in rows)


def test_collect_without_the_mode_refuses_longitudinal_reports(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(run_seed.SEED_ENV, "1" * 32)
    out = tmp_path / "rep" / "R.avro"
    assert cli.main(["perturb", "--mechanism", "pckv-grr", "--epsilon", "2", *LONGITUDINAL, "--input", RATINGS,
                     "--rating-range", "1,5", "--output", str(out)]) == 0
    capsys.readouterr()
    common = ["--input", str(tmp_path / "rep" / "R*.avro"), "--key-dictionary", str(tmp_path / "rep" / "R.keys.txt"),
              "--output", str(tmp_path / "e.csv")]
    assert cli.main(["collect", "--mechanism", "pckv-grr", "--epsilon", "2", *common]) == 2
    assert "longitudinal" in capsys.readouterr().err
    assert cli.main(["collect", "--mechanism", "pckv-grr", "--epsilon", "2", *LONGITUDINAL, *common]) == 0


def test_perturb_warns_when_the_permanent_configuration_may_drift(tmp_path, capsys, monkeypatch):
    """The key indices and ``cfg`` are part of every memo key: a dictionary
    derived from this run's ratings or ``--padding auto`` can change between
    collections (every state then new again), so the job says so; with a
    fixed catalogue and padding it does not."""
    monkeypatch.setenv(run_seed.SEED_ENV, "2" * 32)
    with open(RATINGS) as fh:
        items = sorted({line.split(",")[1] for line in fh.read().splitlines()[1:]})
    catalogue = tmp_path / "catalogue.txt"
    catalogue.write_text("\n".join(items) + "\n")
    common = ["perturb", "--mechanism", "pckv-ue", "--epsilon", "2", "--longitudinal", "--input", RATINGS,
              "--rating-range", "1,5"]
    assert cli.main([*common, "--padding", "auto", "--output", str(tmp_path / "a" / "R.avro")]) == 0
    err = capsys.readouterr().err
    assert "recognises an unchanged state only under the same configuration" in err
    assert "pass the same --key-dictionary" in err and "--padding auto measures" in err
    assert cli.main([*common, "--padding", "2", "--key-dictionary", str(catalogue),
                     "--output", str(tmp_path / "b" / "R.avro")]) == 0
    assert "same configuration" not in capsys.readouterr().err


def _records(prefix) -> list:
    import glob

    import fastavro
    out = []
    for path in sorted(glob.glob(f"{prefix}-*.avro")):
        with open(path, "rb") as fh:
            out.append([(r["n_reports"], r["columns"]) for r in fastavro.reader(fh)])
    return out


def test_separate_perturb_runs_send_the_same_memoised_reports(tmp_path, capsys, monkeypatch):
    """Across runs (separate jobs, other collection ids, the same secret seed)
    the memoised single layer sends bit-identical reports; another seed (other
    device secrets) does not."""
    common = ["perturb", "--mechanism", "pckv-grr", "--epsilon", "2", "--longitudinal", "--padding", "2",
              "--input", RATINGS, "--rating-range", "1,5"]
    runs = []
    for c, seed in ((1, "3" * 32), (2, "3" * 32), (3, "4" * 32)):
        monkeypatch.setenv(run_seed.SEED_ENV, seed)
        assert cli.main([*common, "--collection-id", f"{c:032x}", "--output", str(tmp_path / f"c{c}" / "R.avro")]) == 0
        runs.append(_records(tmp_path / f"c{c}" / "R"))
    capsys.readouterr()
    assert sum(n for f in runs[0] for n, _ in f) == 2000
    assert runs[0] == runs[1]
    assert runs[0] != runs[2]
