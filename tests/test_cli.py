"""End to end through the ``kvldp`` command line (local FnApiRunner)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dead_letters import dead_letter
from kvldp import schemas
from kvldp.cli import commands as cli
from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.estimation.postprocess import DEFAULT, postprocess
from kvldp.mechanisms.local import run_local
from kvldp.plots.tables import read_estimates


def _by_key(records):
    return {r["key"]: r for r in records}


def test_simulate_writes_every_field_and_matches_local_runner(tmp_path, capsys):
    out = tmp_path / "est.avro"
    assert cli.main(["simulate", "--mechanism", "pckv-ue", "--epsilon", "4", "--users", "60000", "--keys", "20",
                     "--seed", "1", "--batch-size", "20000", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "mse_frequency_all=" in text and "mse_mean_top50=" in text and "true f" in text
    records = read_estimates(str(out))
    assert len(records) == 20
    assert set(records[0]) == set(schemas.ESTIMATE_FIELDS)
    mech = registry.make("pckv-ue", 20, 4.0)
    local = run_local(mech, SyntheticDataset("uu", 60_000, 20, seed=1), seed=1, batch_size=20_000)
    got = _by_key(records)
    # the default post-processing of the local runner's estimates, bit for bit
    done = postprocess(local.estimates, DEFAULT)
    for field in ("frequency", "mean", "frequency_lo", "frequency_hi", "mean_lo", "mean_hi"):
        assert np.array_equal([got[str(k)][field] if got[str(k)][field] is not None else np.nan for k in range(20)],
                              getattr(done, field), equal_nan=True), field
    assert {r["postprocess"] for r in records} == {DEFAULT.name}
    f, _ = local.true_values(20)
    assert np.allclose([got[str(k)]["true_frequency"] for k in range(20)], f)
    # --postprocess raw: the paper's estimates as the mechanism gives them
    assert cli.main(["simulate", "--mechanism", "pckv-ue", "--epsilon", "4", "--users", "60000", "--keys", "20",
                     "--seed", "1", "--batch-size", "20000", "--output", str(out), "--postprocess", "raw",
                     "--overwrite"]) == 0
    raw = _by_key(read_estimates(str(out)))
    for field in ("frequency", "mean", "frequency_raw", "mean_raw", "frequency_se", "mean_se"):
        assert np.array_equal([raw[str(k)][field] for k in range(20)], getattr(local.estimates, field)), field
    assert {r["postprocess"] for r in raw.values()} == {"raw"}


@pytest.mark.parametrize("mechanism", ["pckv-ue", "pckv-grr"])
def test_perturb_then_collect_equals_simulate(tmp_path, mechanism):
    """The split deployment gives the simulation's estimates: with the same
    seed, identical ones (same batches, same streams, same integer counts)."""
    common = ["--mechanism", mechanism, "--epsilon", "2", "--users", "30000", "--keys", "15", "--seed", "4",
              "--batch-size", "10000", "--dataset", "synthetic-gg"]
    sim = tmp_path / "sim.jsonl"
    assert cli.main(["simulate", *common, "--output", str(sim)]) == 0
    reports = tmp_path / "reports" / "REPORTS.avro"
    assert cli.main(["perturb", *common, "--output", str(reports)]) == 0
    est = tmp_path / "collected.csv"
    assert cli.main(["collect", "--mechanism", mechanism, "--epsilon", "2",
                     "--input", str(tmp_path / "reports" / "REPORTS*.avro"),
                     "--key-dictionary", str(tmp_path / "reports" / "REPORTS.keys.txt"),
                     "--output", str(est)]) == 0
    a, b = _by_key(read_estimates(str(sim))), _by_key(read_estimates(str(est)))
    assert a.keys() == b.keys()
    for k in a:
        assert a[k]["frequency"] == pytest.approx(b[k]["frequency"], rel=1e-12)
        assert a[k]["mean"] == pytest.approx(b[k]["mean"], rel=1e-12, abs=1e-15)
        assert b[k]["true_frequency"] is None          # the collector never knows the truth


def test_collect_refuses_mismatched_reports(tmp_path, capsys):
    reports = tmp_path / "R.avro"
    assert cli.main(["perturb", "--mechanism", "pckv-grr", "--epsilon", "1", "--users", "1000", "--keys", "5",
                     "--seed", "1", "--output", str(reports)]) == 0
    code = cli.main(["collect", "--mechanism", "pckv-grr", "--epsilon", "2", "--keys", "5",
                     "--input", str(tmp_path / "R*.avro"), "--output", str(tmp_path / "e.csv")])
    assert code == 2 and "rerun collect" in capsys.readouterr().err
    code = cli.main(["collect", "--mechanism", "pckv-grr", "--epsilon", "1", "--keys", "5",
                     "--input", str(tmp_path / "none*.avro"), "--output", str(tmp_path / "e.csv")])
    assert code == 2


def test_reports_never_carry_raw_values_or_the_seed(tmp_path):
    import fastavro

    reports = tmp_path / "R.avro"
    assert cli.main(["perturb", "--mechanism", "pckv-ue", "--epsilon", "1", "--users", "500", "--keys", "5",
                     "--seed", "123456789", "--output", str(reports)]) == 0
    with open(tmp_path / "R-00000.avro", "rb") as fh:
        reader = fastavro.reader(fh)
        meta = json.loads(reader.metadata["kvldp.config"])
        recs = list(reader)
    assert set(meta) == {"mechanism", "d", "epsilon", "padding"}
    assert {r["kind"] for r in recs} == {"report"} and sum(r["n_reports"] for r in recs) == 500
    assert {c["name"] for c in recs[0]["columns"]} == {"sizes", "positions", "symbols"}   # nothing else
    assert b"123456789" not in (tmp_path / "R-00000.avro").read_bytes()


def test_simulate_ratings_file_reports_row_accounting(tmp_path, capsys):
    f = tmp_path / "ratings.jsonl"
    rows = [{"user": f"u{i % 40}", "item": f"m{i % 7}", "rating": 1 + i % 5} for i in range(300)]
    rows += [{"user": "x", "item": "m1"}, {"user": "y", "item": "m2", "rating": 11}]
    f.write_text("\n".join(json.dumps(r) for r in rows) + "\nnot json\n")
    keys = tmp_path / "keys.txt"
    keys.write_text("\n".join(f"m{k}" for k in range(7)) + "\n")
    out = tmp_path / "est.jsonl"
    assert cli.main(["simulate", "--mechanism", "pckv-grr", "--epsilon", "3", "--dataset", str(f),
                     "--rating-range", "1,5", "--key-dictionary", str(keys), "--seed", "2",
                     "--output", str(out), "--padding", "3", "--max-reject-rate", "0.2"]) == 0
    text = capsys.readouterr().out
    # 40 users with 7-8 rows over 7 items: some keys repeat, and are rejected, not dropped.
    line = next(x for x in text.splitlines() if x.startswith("rows read"))
    read, acc, rej = (int(t) for t in line.replace("[ok]", "").split() if t.isdigit())
    assert read == 303 and read == acc + rej and "[ok]" in line
    dead = [json.loads(x) for x in dead_letter(tmp_path, "est.jsonl").read_text().splitlines()]
    assert len(dead) == rej
    assert {d["reason"].split(":")[0] for d in dead} >= {"malformed row", "duplicate key for one user"}


def test_bench_reports_rates_and_identical_estimates(capsys):
    assert cli.main(["bench", "--mechanism", "pckv-grr", "--users", "100000", "--keys", "20",
                     "--repeats", "1"]) == 0
    text = capsys.readouterr().out
    assert "ratio beam/numpy" in text and "identical estimates: True" in text
    assert "the cryptographic generator costs" in text


def test_unknown_mechanism_is_a_clear_error():
    with pytest.raises(SystemExit):
        cli.main(["simulate", "--mechanism", "nope", "--epsilon", "1"])
