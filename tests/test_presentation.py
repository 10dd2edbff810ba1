"""What a person reads (issue 16): means on the ratings' own scale next to
the internal [-1, 1] one, one colour and marker per mechanism in every
figure, an axis that shows the measurements, and progress lines from a
long job."""
from __future__ import annotations

import json
import re

import pytest

from kvldp.cli import commands as cli
from kvldp.plots import figures
from kvldp.plots.tables import read_estimates

MECH = ["--mechanism", "pckv-grr", "--epsilon", "2"]


def ratings_file(tmp_path):
    rows = [f"u{u},i{u % 4},{1 + (u * 7) % 5}" for u in range(400)]
    path = tmp_path / "raw" / "r.csv"
    path.parent.mkdir()
    path.write_text("user,item,rating\n" + "\n".join(rows) + "\n")
    return path


def assert_on_scale(records, lo, hi):
    scaled = [r for r in records if r["mean"] is not None]
    assert scaled
    for r in scaled:
        assert r["mean_rating"] == pytest.approx(lo + (r["mean"] + 1) * (hi - lo) / 2)
        assert r["mean_rating_se"] == pytest.approx(r["mean_se"] * (hi - lo) / 2)


def test_means_are_also_given_on_the_ratings_scale(tmp_path, capsys):
    ratings = ratings_file(tmp_path)
    est = tmp_path / "sim.jsonl"
    assert cli.main(["simulate", *MECH, "--dataset", str(ratings), "--rating-range", "1,5", "--seed", "4",
                     "--output", str(est)]) == 0
    out = capsys.readouterr().out
    assert "(means on the ratings' 1-5 scale)" in out and "mean RMSE on the 1-5 scale: all " in out
    assert_on_scale(read_estimates(str(est)), 1.0, 5.0)
    # the collector learns the range from the manifest perturb wrote (a public parameter)
    assert cli.main(["perturb", *MECH, "--input", str(ratings), "--rating-range", "1,5",
                     "--output", str(tmp_path / "rep" / "R.avro")]) == 0
    manifest = json.loads((tmp_path / "rep" / "R.manifest.json").read_text())
    assert manifest["rating_range"] == [1.0, 5.0]
    collected = tmp_path / "col.csv"
    assert cli.main(["collect", *MECH, "--input", str(tmp_path / "rep" / "R-*.avro"),
                     "--key-dictionary", str(tmp_path / "rep" / "R.keys.txt"), "--output", str(collected)]) == 0
    assert "(means on the ratings' 1-5 scale)" in capsys.readouterr().out
    assert_on_scale(read_estimates(str(collected)), 1.0, 5.0)
    # a range given to collect wins
    assert cli.main(["collect", *MECH, "--input", str(tmp_path / "rep" / "R-*.avro"), "--rating-range", "0,10",
                     "--key-dictionary", str(tmp_path / "rep" / "R.keys.txt"), "--output", str(collected),
                     "--overwrite"]) == 0
    assert_on_scale(read_estimates(str(collected)), 0.0, 10.0)


def test_synthetic_data_has_no_other_scale(tmp_path, capsys):
    est = tmp_path / "e.jsonl"
    assert cli.main(["simulate", *MECH, "--users", "2000", "--keys", "5", "--seed", "1", "--output", str(est)]) == 0
    assert "scale" not in capsys.readouterr().out
    assert {r["mean_rating"] for r in read_estimates(str(est))} == {None}


def test_a_mechanism_looks_the_same_in_every_figure():
    alone = figures.style("pckv-ue")
    assert figures.style("pckv-ue") == alone                          # whatever else is plotted
    looks = {(figures.style(m)["color"], figures.style(m)["marker"]) for m in
             ("pckv-ue", "pckv-grr", "privkv", "privkvm-vi", "kvue", "ks-ue", "ks-grr", "f2m", "kvoh", "privkvm")}
    assert len(looks) == 10                                             # told apart
    variant = figures.style("pckv-ue (norm-sub)")
    assert (variant["color"], variant["marker"]) == (alone["color"], alone["marker"])
    assert variant["linestyle"] != alone["linestyle"]


def test_theory_far_above_the_measurements_does_not_squash_them(tmp_path):
    """pckv-fig10b's mean panel: the unclipped estimator's theory reaches 10^6
    at eps 0.1 while clipped estimates have MSE ~ 0.04-1.5."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = {"pckv-ue": [(0.1, 1.0, 0.9, 1.1, 2e3), (6.0, 0.04, 0.03, 0.05, 0.05)],
              "pckv-grr": [(0.1, 1.2, 1.0, 1.4, 1e6), (6.0, 0.1, 0.05, 0.2, 0.1)]}
    seen = {}
    real_savefig = plt.Figure.savefig

    def keep(fig, *args, **kwargs):
        seen["ylim"] = fig.axes[0].get_ylim()
        return real_savefig(fig, *args, **kwargs)

    plt.Figure.savefig = keep
    try:
        figures._plot(series, "MSE of mean", "MSE", tmp_path / "m.png", log=True)
    finally:
        plt.Figure.savefig = real_savefig
    lo, hi = seen["ylim"]
    assert lo <= 0.03 and 1.4 <= hi <= 10, seen


def test_a_long_job_prints_its_progress(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("KVLDP_PROGRESS_EVERY", "0.3")
    assert cli.main(["simulate", "--mechanism", "pckv-ue", "--epsilon", "4", "--users", "3000000", "--seed", "1",
                     "--output", str(tmp_path / "e.jsonl")]) == 0
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith("[")]
    counts = [int(re.search(r"users perturbed ([\d,]+)", x).group(1).replace(",", "")) for x in lines]
    assert counts and counts == sorted(counts) and 0 < counts[-1] <= 3_000_000, lines


def test_results_whose_repeats_are_all_equal_plot(tmp_path):
    """Equal values in every repeat (Base-Cut setting every key to 0 gives
    the same MSE each time): their float mean can fall an ulp outside them
    (0.1 x 3 -> 0.10000000000000002), which matplotlib's error bars refused,
    failing ``evaluate`` after its whole sweep had run."""
    import csv

    path = tmp_path / "results.csv"
    with open(path, "w", newline="") as fh:
        out = csv.writer(fh)
        out.writerow(["mechanism", "epsilon", "repeat", "postprocess", "metric", "key_set", "value", "theory",
                      "dataset"])
        for eps in (1.0, 2.0):
            for repeat in range(3):
                out.writerow(["pckv-ue", eps, repeat, "base-cut", "mse_frequency", "all", 0.1, "", "x"])
                out.writerow(["pckv-ue", eps, repeat, "raw", "mse_frequency", "all", 0.3 + repeat, "", "x"])
    pngs = figures.plot_results(path, tmp_path)
    assert pngs and all(p.exists() and p.stat().st_size > 0 for p in pngs)
