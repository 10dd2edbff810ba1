"""``kvldp bench`` runs every kind of mechanism and both paths agree bit for bit."""
import pytest

from kvldp.cli import commands as cli


@pytest.mark.parametrize("mechanism", [["pckv-grr"], ["ks-adap"], ["privkvm-plus"],
                                       ["ioh-oue", "--ioh-keys", "5,2,9"]])     # IOH's keys, not in key order
def test_bench_runs_and_paths_agree(mechanism, capsys):
    assert cli.main(["bench", "--mechanism", *mechanism, "--users", "6000", "--keys", "12", "--batch-size", "2000",
                     "--repeats", "1", "--dataset", "synthetic-multi"]) == 0
    out = capsys.readouterr().out
    assert "identical estimates: True" in out, out
    assert "of which graph:" in out        # the local runner's split of the Beam job


def test_the_sweep_writes_its_table_and_figure(tmp_path, capsys):
    """Each (mechanism, users, path) in its own process: the paths agree, the
    CSV has a row per run with its peak RSS, and the kernels are compared
    with the plain NumPy floor on the same generator."""
    import csv

    out = tmp_path / "bench"
    assert cli.main(["bench", "--sweep", str(out), "--mechanisms", "pckv-grr,ks-grr", "--sizes", "3000",
                     "--keys", "12", "--kernels", "--repeats", "1", "--stock"]) == 0
    with open(out / "bench.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert {(r["mechanism"], r["users"], r["path"]) for r in rows} == {
        (m, "3000", p) for m in ("pckv-grr", "ks-grr") for p in ("numpy", "beam", "beam-stock")}
    assert all(r["error"] == "" and r["identical"] == "True" and float(r["peak_rss_mb"]) > 50 and r["runs"] == "1"
               for r in rows)
    assert all(float(r["command_seconds"]) > float(r["seconds"]) for r in rows)       # imports included
    # a Beam run's seconds split at its first stage: the graph before, the stages after, and the read back
    # (stock Beam's own runner notes no stage start: its run is timed whole)
    for r in rows:
        if r["path"] != "beam":
            assert r["graph_seconds"] == r["stages_seconds"] == ""
        else:
            graph, stages = float(r["graph_seconds"]), float(r["stages_seconds"])
            assert graph > 0 and stages > 0 and graph + stages <= float(r["seconds"]) + 0.0015   # rounded to ms
    assert (out / "bench.png").stat().st_size > 10_000
    with open(out / "kernels.csv", newline="") as fh:
        kernels = {r["oracle"]: r for r in csv.DictReader(fh)}
    assert set(kernels) == {"grr", "oue", "olh"} and all(float(k["kvldp_users_per_s"]) > 0 for k in kernels.values())


def test_estimates_come_back_in_the_runner_order():
    """The Beam path's estimates file is matched to the NumPy path's key
    order by key, whatever order the file holds them in, and a key without
    an estimate is an error, not a silent NaN."""
    import numpy as np

    from kvldp.bench.command import in_key_order

    keys, values = np.array([7, 2, 5, 0]), np.array([0.7, 0.2, 0.5, 0.0])
    assert in_key_order(keys, values, [0, 2, 5, 7]).tolist() == [0.0, 0.2, 0.5, 0.7]
    assert in_key_order(keys, values, [5, 5, 7]).tolist() == [0.5, 0.5, 0.7]
    for missing in ([3], [8], [0, 9]):
        with pytest.raises(KeyError):
            in_key_order(keys, values, missing)
    with pytest.raises(KeyError):
        in_key_order(np.array([], dtype=int), np.array([]), [0])
    assert in_key_order(keys, values, []).tolist() == []


def test_a_sweep_point_is_its_fastest_run_with_the_largest_peak(monkeypatch, tmp_path):
    """``--repeats k``: each point runs k times; its row is the fastest run,
    its memory the largest any run peaked at, and a failure is reported."""
    import numpy as np

    from kvldp.bench import sweep as bench_sweep

    runs = iter([(2.0, 300), (1.0, 200), (1.5, 400)])

    def fake(path, name, users, keys, seed, epsilon, work):
        seconds, peak = next(runs)
        return {"path": path, "seconds": seconds, "peak_rss_mb": peak, "error": ""}, np.full(3, seconds)

    monkeypatch.setattr(bench_sweep, "run_one", fake)
    row, frequency = bench_sweep.best_of("beam", "pckv-grr", 10, 5, 1, 4.0, tmp_path, 3)
    assert (row["seconds"], row["peak_rss_mb"], row["runs"]) == (1.0, 400, 3) and frequency.tolist() == [1.0] * 3
    monkeypatch.setattr(bench_sweep, "run_one", lambda *a: ({"error": "boom"}, None))
    assert bench_sweep.best_of("beam", "pckv-grr", 10, 5, 1, 4.0, tmp_path, 3) == ({"error": "boom"}, None)
