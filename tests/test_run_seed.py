"""Where a real run's seed comes from (kvldp/pipelines/run_seed.py): a seed
file or the environment, never silently the command line."""
from __future__ import annotations

import os
import stat

import fastavro
import pytest

from kvldp.cli import commands as cli
from kvldp.pipelines import run_seed
from kvldp.pipelines.sources import DataConfig

SECRET = "9e3779b97f4a7c15f39cc0605cedc834"


def test_kvldp_seed_writes_a_private_128_bit_seed_and_never_overwrites(tmp_path, capsys):
    path = tmp_path / "run.seed"
    assert cli.main(["seed", str(path)]) == 0
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    first = run_seed.read_seed_file(str(path))
    assert run_seed.MIN_SECRET <= first < 2 ** 128
    assert cli.main(["seed", str(path)]) == 2
    assert "never overwritten" in capsys.readouterr().err
    assert run_seed.read_seed_file(str(path)) == first
    other = tmp_path / "other.seed"
    cli.main(["seed", str(other)])
    assert run_seed.read_seed_file(str(other)) != first           # fresh from the CSPRNG each time


@pytest.mark.parametrize("text, problem", [("1", "32 hex digits"), ("12345", "32 hex digits"),
                                           ("0" * 31 + "1", r"below 2\^64"), ("zz" * 16, "32 hex digits"),
                                           (SECRET + "00", "32 hex digits")])
def test_a_seed_that_is_not_a_128_bit_secret_is_refused(text, problem):
    with pytest.raises(ValueError, match=problem):
        run_seed.parse_secret(text, "--seed-file x")


def test_the_seed_comes_from_the_flag_the_file_or_the_environment(tmp_path):
    path = tmp_path / "s"
    path.write_text(f"0x{SECRET}\n")
    path.chmod(0o600)
    assert run_seed.resolve(None, str(path), {}) == run_seed.RunSeed(int(SECRET, 16), "file")
    assert run_seed.resolve(None, None, {run_seed.SEED_ENV: SECRET}) == run_seed.RunSeed(int(SECRET, 16), "env")
    assert run_seed.resolve(7, None, {run_seed.SEED_ENV: SECRET}) == run_seed.RunSeed(7, "flag")
    assert run_seed.resolve(None, None, {}) == run_seed.RunSeed(None)
    with pytest.raises(ValueError, match="both given"):
        run_seed.resolve(7, str(path), {})
    with pytest.raises(FileNotFoundError, match="cannot read"):
        run_seed.resolve(None, str(tmp_path / "missing"), {})


def test_a_seed_file_others_can_read_is_warned_about(tmp_path, capsys):
    path = tmp_path / "s"
    path.write_text(SECRET)
    path.chmod(0o644)
    assert run_seed.read_seed_file(str(path)) == int(SECRET, 16)
    assert "readable by other users" in capsys.readouterr().err
    path.chmod(0o600)
    run_seed.read_seed_file(str(path))
    assert capsys.readouterr().err == ""


def test_a_seed_file_reproduces_the_reports_of_the_same_seed_on_the_flag(tmp_path, capsys):
    """--seed-file is --seed without the exposure: the same reports."""
    ratings = tmp_path / "raw" / "r.csv"
    ratings.parent.mkdir()
    ratings.write_text("user,item,rating\n" + "\n".join(f"u{u},i{u % 5},{u % 3 - 1}" for u in range(200)) + "\n")
    (tmp_path / "s").write_text(SECRET)
    (tmp_path / "s").chmod(0o600)
    common = ["perturb", "--mechanism", "pckv-grr", "--epsilon", "1", "--input", str(ratings), "--shards", "1"]
    assert cli.main([*common, "--seed-file", str(tmp_path / "s"), "--output", str(tmp_path / "a" / "R.avro")]) == 0
    assert "anyone who sees this command line" not in capsys.readouterr().err
    assert cli.main([*common, "--seed", str(int(SECRET, 16)), "--output", str(tmp_path / "b" / "R.avro")]) == 0
    assert "anyone who sees this command line" in capsys.readouterr().err
    assert _records(tmp_path / "a" / "R-00000.avro") == _records(tmp_path / "b" / "R-00000.avro")
    assert cli.main([*common, "--output", str(tmp_path / "c" / "R.avro")]) == 0          # a fresh seed
    assert _records(tmp_path / "c" / "R-00000.avro") != _records(tmp_path / "a" / "R-00000.avro")


def _records(path):
    with open(path, "rb") as fh:
        return list(fastavro.reader(fh))


def test_seed_on_a_simulated_dataset_is_not_warned_about(capsys):
    _, config, _ = cli.configure(["perturb", "--mechanism", "pckv-grr", "--epsilon", "1", "--seed", "3",
                                  "--users", "10", "--output", "/tmp/x/R.avro"])
    assert config.data == DataConfig(users=10, seed=3)
    assert capsys.readouterr().err == ""
