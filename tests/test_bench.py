"""``kvldp bench`` runs every kind of mechanism and both paths agree bit for bit."""
import pytest

from kvldp.pipelines import cli


@pytest.mark.parametrize("mechanism", [["pckv-grr"], ["ks-adap"], ["privkvm-plus"],
                                       ["ioh-oue", "--ioh-keys", "5,2,9"]])     # IOH's keys, not in key order
def test_bench_runs_and_paths_agree(mechanism, capsys):
    assert cli.main(["bench", "--mechanism", *mechanism, "--users", "6000", "--keys", "12", "--batch-size", "2000",
                     "--repeats", "1", "--dataset", "synthetic-multi"]) == 0
    out = capsys.readouterr().out
    assert "identical estimates: True" in out, out
