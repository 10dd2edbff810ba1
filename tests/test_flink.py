"""kvldp on real Flink (marker ``flink``; ``.ci/run`` runs it after the unit
tests): Beam's portable Flink job server built by ``deploy/flink/flink.sh``
from Maven Central, on Flink's embedded mini-cluster and on a standalone
cluster (a JobManager and a TaskManager started from the Flink distribution
that the apache-flink wheels ship). Parallelism 2, so records cross a real
shuffle and combiners merge partial accumulators across tasks. Every job
must give estimates identical to the local runner's with the same seed.

Needs Java and Maven; with ``KVLDP_REQUIRE_FLINK=1`` (``.ci/run``) a missing
one is a failure, not a skip. Jars and the distribution are cached under
``$KVLDP_FLINK_CACHE`` (default ``deploy/flink/.cache``)."""
from __future__ import annotations

import json
import sys
import time
import urllib.request

import fastavro
import pytest

from flink_cluster import flink_built, job_server, standalone_cluster  # noqa: F401 - fixtures
from kvldp.cli import commands as cli
from kvldp.plots.tables import read_estimates
from kvldp.runtime import portable

pytestmark = pytest.mark.flink

@pytest.fixture(scope="module")
def embedded(flink_built):  # noqa: F811
    with job_server() as server:
        yield server.endpoint


def on_flink(endpoint: str) -> list[str]:
    return ["--runner", "PortableRunner", "--job_endpoint", endpoint, "--environment_type", "LOOPBACK",
            "--parallelism", "2"]


def estimates(path) -> list[dict]:
    return sorted(read_estimates(str(path)), key=lambda r: str(r["key"]))


def run(argv, capsys) -> str:
    assert cli.main(argv) == 0
    return capsys.readouterr().out


def assert_same_on_flink_and_locally(args, endpoint, tmp_path, capsys):
    local, flink = tmp_path / "local.jsonl", tmp_path / "flink.jsonl"
    run(["simulate", *args, "--output", str(local)], capsys)
    start = time.monotonic()
    run(["simulate", *args, "--output", str(flink), *on_flink(endpoint)], capsys)
    print(f"{args[1]} on Flink: {time.monotonic() - start:.1f} s", file=sys.stderr)
    ours, theirs = estimates(flink), estimates(local)
    assert len(ours) > 0 and ours == theirs


SMALL = ["--users", "20000", "--keys", "12", "--batch-size", "5000", "--seed", "5"]


@pytest.mark.parametrize("mechanism", ["pckv-ue", "kvue"])
def test_single_round_mechanisms_match_the_local_runner(mechanism, embedded, tmp_path, capsys):
    assert_same_on_flink_and_locally(["--mechanism", mechanism, "--epsilon", "2", "--dataset", "synthetic-gg",
                                      *SMALL], embedded, tmp_path, capsys)


def test_ioh_matches_the_local_runner_counts_included(embedded, tmp_path, capsys):
    args = ["--mechanism", "ioh-oue", "--epsilon", "3", "--dataset", "synthetic-corr", "--users", "20000",
            "--keys", "6", "--seed", "2", "--batch-size", "5000", "--ioh-keys", "1,3,4"]
    assert_same_on_flink_and_locally(args, embedded, tmp_path, capsys)
    assert _avro(tmp_path / "flink.jsonl.counts.avro") == _avro(tmp_path / "local.jsonl.counts.avro")


@pytest.mark.parametrize("mechanism", [["privkvm", "--rounds", "3"], ["ks-grr"]])
def test_multi_round_protocols_run_as_one_flink_pipeline(mechanism, embedded, tmp_path, capsys):
    assert_same_on_flink_and_locally(["--mechanism", *mechanism, "--epsilon", "2", "--dataset", "synthetic-multi",
                                      *SMALL], embedded, tmp_path, capsys)


def test_a_protocol_that_stops_early_matches_the_local_runner(embedded, tmp_path, capsys):
    """PrivKVM+ stops after round 1 (A0 = 100): its later rounds get no input
    on Flink either -- a generated dataset's recipes are held back, a file's
    stored users see the stop as a stopped state (the side input's default)."""
    common = ["--mechanism", "privkvm-plus", "--epsilon", "2", "--a0", "100", "--max-rounds", "3"]
    assert_same_on_flink_and_locally([*common, "--dataset", "synthetic-multi", *SMALL], embedded, tmp_path, capsys)
    ratings = tmp_path / "ratings.csv"
    ratings.write_text("user,item,rating\n" + "\n".join(
        f"u{u},i{(u * 5 + k) % 7},{(u + k) % 5 + 1}" for u in range(2000) for k in range(u % 2 + 1)) + "\n")
    assert_same_on_flink_and_locally([*common, "--dataset", str(ratings), "--rating-range", "1,5", "--seed", "4"],
                                     embedded, tmp_path / "file", capsys)
    summary = json.loads((tmp_path / "file" / "flink.jsonl.protocol.json").read_text())
    assert summary["rounds_run"] == 1 and summary["stopped_early"]


def test_split_deployment_perturb_then_collect_on_flink(embedded, tmp_path, capsys):
    ratings = tmp_path / "raw" / "ratings.csv"
    ratings.parent.mkdir()
    ratings.write_text("user,item,rating\n" + "\n".join(
        f"u{u},i{(u * 7 + k) % 9},{(u + k) % 5 + 1}" for u in range(3000) for k in range(u % 3 + 1)) + "\n")
    (tmp_path / "seed").write_text("9e3779b97f4a7c15f39cc0605cedc834\n")
    (tmp_path / "seed").chmod(0o600)
    mech = ["--mechanism", "pckv-grr", "--epsilon", "2", "--padding", "2"]
    for where, extra in (("local", []), ("flink", on_flink(embedded))):
        run(["perturb", *mech, "--input", str(ratings), "--rating-range", "1,5", "--shards", "4",
             "--seed-file", str(tmp_path / "seed"), "--output", str(tmp_path / where / "R.avro"), *extra], capsys)
        run(["collect", *mech, "--input", str(tmp_path / where / "R-*.avro"),
             "--key-dictionary", str(tmp_path / where / "R.keys.txt"),
             "--output", str(tmp_path / where / "est.jsonl"), *extra], capsys)
    batches = sorted(p.name for p in (tmp_path / "local").glob("R-*.avro"))
    assert len(batches) == 4 and batches == sorted(p.name for p in (tmp_path / "flink").glob("R-*.avro"))
    for name in batches:      # the same reports, batch by batch
        assert _avro(tmp_path / "flink" / name) == _avro(tmp_path / "local" / name)
    assert estimates(tmp_path / "flink" / "est.jsonl") == estimates(tmp_path / "local" / "est.jsonl")


def _avro(path) -> list:
    with open(path, "rb") as fh:
        return list(fastavro.reader(fh))


@pytest.fixture(scope="module")
def standalone(flink_built):  # noqa: F811
    with standalone_cluster() as port:
        yield port


def test_a_standalone_cluster_runs_the_job(standalone, tmp_path, capsys):
    rest = standalone
    with job_server(f"localhost:{rest}") as server:
        assert_same_on_flink_and_locally(["--mechanism", "pckv-ue", "--epsilon", "2", *SMALL],
                                         server.endpoint, tmp_path, capsys)
    jobs = json.load(urllib.request.urlopen(f"http://localhost:{rest}/jobs/overview", timeout=10))["jobs"]
    assert [j["state"] for j in jobs] == ["FINISHED"], jobs
    overview = json.load(urllib.request.urlopen(f"http://localhost:{rest}/overview", timeout=10))
    assert overview["taskmanagers"] == 1 and overview["slots-total"] == 2
    assert overview["flink-version"] == next(p.flink for p in portable.pairs_for_sdk())
