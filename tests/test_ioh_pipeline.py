"""IOH end to end: packed or sparse reports through Beam, the counts file, and
``kvldp query`` (conditional answers with the truth beside them)."""
from __future__ import annotations

import json

import fastavro
import numpy as np
import pytest

from kvldp.cli import commands as cli
from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.kv.query import CellTable
from kvldp.mechanisms.local import run_local
from kvldp.pipelines import sources
from kvldp.pipelines.query import load_counts
from kvldp.plots.tables import read_estimates

SIM = ["--mechanism", "ioh-oue", "--epsilon", "3", "--dataset", "synthetic-corr", "--users", "40000",
       "--keys", "6", "--seed", "2", "--batch-size", "10000", "--ioh-keys", "1,3,4"]


def test_simulate_counts_file_matches_local_runner(tmp_path, capsys):
    out = tmp_path / "est.jsonl"
    assert cli.main(["simulate", *SIM, "--output", str(out), "--query", "target=1 given 3=1,4=0"]) == 0
    text = capsys.readouterr().out
    assert "f(1 | 3=1, 4=0)" in text and "truth" in text
    counts = load_counts(str(out) + ".counts.avro")
    assert counts.keys == ["1", "3", "4"] and counts.record["n_reports"] == 40_000
    mech = registry.make("ioh-oue", 6, 3.0, ioh_keys=[1, 3, 4])
    local = run_local(mech, SyntheticDataset("corr", 40_000, 6, seed=2), seed=2, batch_size=10_000)
    assert np.array_equal(counts.record["support"], local.counts[1:])
    records = {r["key"]: r for r in read_estimates(str(out))}
    assert sorted(records) == ["1", "3", "4"]
    assert np.allclose([records[k]["frequency"] for k in ("1", "3", "4")], local.estimates.frequency)


def test_query_command_forms_agree(tmp_path, capsys):
    out = tmp_path / "est.jsonl"
    assert cli.main(["simulate", *SIM, "--output", str(out)]) == 0
    counts = str(out) + ".counts.avro"
    capsys.readouterr()
    assert cli.main(["query", "--counts", counts, "--target", "4", "--given", "1=1,3=0"]) == 0
    a = capsys.readouterr().out
    assert cli.main(["query", "--counts", counts, "--target", "4", "--alpha", "110", "--beta", "100"]) == 0
    b = capsys.readouterr().out
    assert a.splitlines()[1:] == b.splitlines()[1:]
    # the answer is the CellTable's, from calibrated counts
    table = load_counts(counts).table()
    expected = table.conditional(2, {0: True, 1: False})
    assert f"{expected.frequency:.4f} ± {expected.frequency_se:.4f}" in a
    assert cli.main(["query", "--counts", counts, "--target", "4", "--given", "4=1"]) == 2
    assert cli.main(["query", "--counts", counts, "--target", "nope"]) == 2


@pytest.mark.parametrize("eps, kind", [("3", "report"), ("1", "ioh_report")])
def test_perturb_collect_reports_equal_simulate(tmp_path, eps, kind):
    """OUE's q = 1/(e^eps + 1): below 1/16 (eps 3) the reports travel as
    sparse positions, above (eps 1) as packed bits; both collect to the
    simulation's counts."""
    args = [eps if a == "3" else a for a in SIM]
    sim = tmp_path / "sim.jsonl"
    assert cli.main(["simulate", *args, "--output", str(sim)]) == 0
    reports = tmp_path / "rep" / "R.avro"
    assert cli.main(["perturb", *args, "--output", str(reports)]) == 0
    with open(tmp_path / "rep" / "R-00000.avro", "rb") as fh:
        reader = fastavro.reader(fh)
        first = next(iter(reader))
        assert first["kind"] == kind
        columns = {c["name"]: c for c in first["columns"]}
        if kind == "ioh_report":
            bits = columns["bits"]
            assert bits["shape"][1] == (27 + 7) // 8 and len(bits["data"]) == first["n_reports"] * bits["shape"][1]
        else:
            assert set(columns) == {"sizes", "positions", "symbols"}
        assert json.loads(reader.metadata["kvldp.config"])["ioh_keys"] == [1, 3, 4]
    est = tmp_path / "col.jsonl"
    # the chosen keys come from the reports' metadata
    assert cli.main(["collect", "--mechanism", "ioh-oue", "--epsilon", eps,
                     "--input", str(tmp_path / "rep" / "R*.avro"),
                     "--key-dictionary", str(tmp_path / "rep" / "R.keys.txt"), "--output", str(est)]) == 0
    a = load_counts(str(sim) + ".counts.avro").record
    b = load_counts(str(est) + ".counts.avro").record
    assert a["support"] == b["support"] and a["n_reports"] == b["n_reports"]
    assert b["truth"] is None                      # the collector never has the truth


def test_top_keys_are_the_most_frequent(tmp_path):
    out = tmp_path / "est.jsonl"
    args = [a for a in SIM if a not in ("--ioh-keys", "1,3,4")] + ["--ioh-top", "2"]
    assert cli.main(["simulate", *args, "--output", str(out)]) == 0
    data = SyntheticDataset("corr", 40_000, 6, seed=2)
    held = np.zeros(6)
    for b in data.batches(10_000):
        held += np.bincount(b.keys, minlength=6)
    assert load_counts(str(out) + ".counts.avro").keys == [str(k) for k in np.argsort(-held)[:2]]


def test_ioh_flags_rejected_elsewhere(capsys):
    assert cli.main(["simulate", "--mechanism", "kvue", "--epsilon", "1", "--ioh-top", "3", "--users", "100"]) == 2
    assert "does not take" in capsys.readouterr().err
    assert cli.main(["simulate", "--mechanism", "kvue", "--epsilon", "1", "--users", "100",
                     "--query", "target=1"]) == 2


def test_exact_table_through_counts_file_round_trip():
    """The query engine gives the paper's example values from exact counts."""
    states = np.array([[2, 1, 0], [0, 2, 2], [1, 0, 0]])
    table = CellTable.exact(states)
    assert table.conditional(1, {2: True}).frequency == pytest.approx(2 / 3)
    assert table.conditional(1, {2: True, 0: False}).mean == pytest.approx(-1.0)


def test_key_frequencies_of_a_ratings_file_are_exact(tmp_path):
    """--ioh-top on a ratings file: the ingest pre-pass counts every key's
    holders exactly (the keys of rejected rows are not counted)."""
    rng = np.random.default_rng(3)
    rows = {(f"u{u}", f"i{i}") for u, i in zip(rng.integers(0, 300, 2_000), rng.zipf(1.5, 2_000) % 12, strict=True)}
    lines = [f"{u},{i},{rng.integers(1, 6)}" for u, i in sorted(rows)] + ["u0,i3,9"]      # 9: out of range
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating\n" + "\n".join(lines) + "\n")
    _, config, beam_args = cli.configure(
        ["simulate", "--mechanism", "ioh-oue", "--epsilon", "1", "--dataset", str(path), "--rating-range", "1,5",
         "--shards", "3"])
    names = [f"i{k}" for k in range(12)]
    got = sources.key_frequencies(config.data, beam_args, None, names)
    want = np.bincount([int(i[1:]) for _, i in rows], minlength=12)
    np.testing.assert_array_equal(got, want)
