"""Multi-round protocols on Beam: one pipeline of sequential stages linked by
side inputs, identical to the local runner and to the split deployment."""
from __future__ import annotations

import json

import apache_beam as beam
import numpy as np
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import BeamAssertException, assert_that

from kvldp.cli import commands as cli
from kvldp.datasets import SyntheticDataset
from kvldp.datasets.base import InMemoryDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.local import run_local
from kvldp.pipelines import sources
from kvldp.pipelines.graphs import simulate_graph
from kvldp.plots.tables import read_estimates
from kvldp.runtime import jobs as runner
from kvldp.transforms.io import WriteEstimates
from kvldp.transforms.rounds import RunProtocol


def _users(p, data, batch):
    return p | beam.Create(data.specs(batch)) | beam.Reshuffle() | beam.MapTuple(data.batch)


@pytest.mark.parametrize("name, options", [("privkvm", {"rounds": 3}), ("privkvm-plus", {"a0": 0.05, "max_rounds": 4}),
                                           ("privkvm-plus", {"a0": 100, "max_rounds": 3})])
def test_pipeline_equals_local_runner(name, options):
    """Stored users (no recipes): after a stop (A0 = 100: after round 1) the
    later rounds' clients see the side input's default, a stopped state."""
    proto = registry.make(name, 12, 3.0, **options)
    data = SyntheticDataset("uu", n_users=30_000, d=12, seed=2)
    local = run_local(proto, data, seed=8, batch_size=7_000)

    def check(states):
        (s,) = states
        ok = (s.rounds_done == local.state.rounds_done and s.epsilon_spent == local.state.epsilon_spent
              and np.array_equal(s.estimates.mean, local.estimates.mean, equal_nan=True)
              and np.array_equal(s.estimates.frequency, local.estimates.frequency, equal_nan=True))
        if not ok:
            raise BeamAssertException(f"pipeline state {s} != local {local.state}")

    with beam.Pipeline(runner=FnApiRunner()) as p:
        assert_that((_users(p, data, 7_000) | RunProtocol(proto, seed=8))["state"], check)


@pytest.mark.parametrize("name, options", [("privkvm", {"rounds": 3}), ("privkvm-plus", {"a0": 0.05, "max_rounds": 4}),
                                           ("ks-grr", {})])
def test_rounds_that_rebuild_generated_users_equal_the_local_runner(name, options):
    """A generated dataset's later rounds read its batch recipes and make
    the users again (``UserRecipes``) instead of the stored users: the same
    users, so the same estimates, bit for bit."""
    proto = registry.make(name, 12, 3.0, **options)
    config = sources.DataConfig("synthetic-uu", users=30_000, keys=12, seed=2, batch_size=7_000)
    data = sources.built_in_dataset(config, 2)
    local = run_local(proto, data, seed=8, batch_size=7_000)

    def check(states):
        (s,) = states
        est = proto.estimates(s)
        if not (s.rounds_done == local.state.rounds_done and s.epsilon_spent == local.state.epsilon_spent
                and np.array_equal(est.mean, local.estimates.mean, equal_nan=True)
                and np.array_equal(est.frequency, local.estimates.frequency, equal_nan=True)):
            raise BeamAssertException(f"pipeline state {s} != local {local.state}")

    with beam.Pipeline(runner=FnApiRunner()) as p:
        source = sources.user_source(p, config, data)
        assert source.recipes is not None
        assert_that(simulate_graph(source, proto, 8, truth=False)["state"], check)


def test_later_rounds_read_the_recipes_and_a_loaded_dataset_keeps_its_users():
    proto = registry.make("privkvm", 5, 2.0, rounds=3)
    config = sources.DataConfig("synthetic-uu", users=100, keys=5, seed=1, batch_size=50)
    p = beam.Pipeline(runner=FnApiRunner())
    simulate_graph(sources.user_source(p, config, sources.built_in_dataset(config, 1)), proto, 1)
    api = p.to_runner_api()
    names = {t.unique_name: t for t in api.components.transforms.values()}
    producer = {pc: name for name, t in names.items() if not t.subtransforms for pc in t.outputs.values()}

    def main_input(step):
        t = names[step]
        (pc,) = [pc for tag, pc in t.inputs.items() if "side_input" not in tag]
        return producer[pc]

    def side_inputs(step):
        return {producer[pc] for tag, pc in names[step].inputs.items() if "side_input" in tag}

    assert main_input("Protocol/Round1/Perturb") == "MakeUsers"
    for r in (2, 3):
        # the recipes come through the previous round's going-on state, so a stopped protocol makes no users
        assert main_input(f"Protocol/Round{r}/Perturb") == f"Protocol/Round{r}/Items", r
        assert main_input(f"Protocol/Round{r}/Recipes").startswith(f"Protocol/Round{r - 1}/Collect/Calibrate"), r
        assert any(origin.startswith("BatchSpecs/") for origin in side_inputs(f"Protocol/Round{r}/Recipes")), r
    loaded = InMemoryDataset("loaded", UserBatch.single_pair(np.arange(4) % 2, np.zeros(4)), ["a", "b"])
    assert sources.user_source(beam.Pipeline(), config, loaded).recipes is None


def test_a_stopped_protocol_runs_no_stage_of_its_later_rounds(tmp_path):
    """PrivKVM+ with a large A0 stops after round 1; its nine later rounds
    are in the graph but get no input, so the local runner runs none of their
    stages (each cost ~34 ms when they ran empty) -- and the estimates are
    still the local runner's, bit for bit."""
    proto = registry.make("privkvm-plus", 10, 2.0, a0=100)
    config = sources.DataConfig("synthetic-uu", users=5_000, keys=10, seed=1, batch_size=1_000)
    data = sources.built_in_dataset(config, 1)
    local = run_local(proto, data, seed=1, batch_size=1_000)
    assert local.state.rounds_done == 1 and local.state.stopped
    out = tmp_path / "est.jsonl"
    p = runner.make_pipeline([])
    run = simulate_graph(sources.user_source(p, config, data), proto, 1, truth=False)
    run["records"] | WriteEstimates(str(out))
    result = p.run()
    result.wait_until_finish()
    steps = {r.key.step or "" for kind in result.monitoring_metrics().query().values() for r in kind}
    later = sorted(step for step in steps
                   if step.startswith("Protocol/Round") and not step.startswith("Protocol/Round1/"))
    # round 1's calibration emits no going-on state: round 2's recipes and their shuffle write ran empty, nothing else
    assert later == ["Protocol/Round2/Recipes", "Protocol/Round2/Spread/Write"], later
    est = {r["key"]: r for r in read_estimates(str(out))}
    names = data.key_names
    assert np.array_equal([est[names[k]]["frequency"] for k in range(10)], local.estimates.frequency)
    assert np.array_equal([est[names[k]]["mean"] for k in range(10)], local.estimates.mean, equal_nan=True)


def test_privkvm_graph_is_three_stages_linked_by_side_inputs():
    """PrivKVM with c = 3 is one pipeline: Round1..3 each perturb, combine and
    calibrate, and round r+1's perturbation reads round r's state."""
    proto = registry.make("privkvm", 5, 2.0, rounds=3)
    data = SyntheticDataset("uu", n_users=100, d=5, seed=1)
    p = beam.Pipeline(runner=FnApiRunner())
    _users(p, data, 50) | RunProtocol(proto, seed=1)
    api = p.to_runner_api()
    names = {t.unique_name: t for t in api.components.transforms.values()}
    producer = {pc: name for name, t in names.items() if not t.subtransforms for pc in t.outputs.values()}
    for r in (1, 2, 3):
        for step in ("Perturb", "Collect/Accumulate", "Collect/Calibrate"):
            assert any(n.endswith(f"Round{r}/{step}") for n in names), (r, step)
    for r in (2, 3):
        perturb = next(t for n, t in names.items() if n.endswith(f"Round{r}/Perturb"))
        side = [pc for tag, pc in perturb.inputs.items() if "side_input" in tag]
        assert side, f"Round{r}/Perturb has no side input"
        # the side input is (a view of) the previous round's calibrated state
        origins = {producer[pc] for pc in side}
        assert any(f"Round{r - 1}/Collect/Calibrate" in o for o in origins), origins


def test_simulate_prints_rounds_and_budget(tmp_path, capsys):
    out = tmp_path / "est.jsonl"
    assert cli.main(["simulate", "--mechanism", "privkvm-plus", "--epsilon", "2", "--users", "20000",
                     "--keys", "10", "--seed", "3", "--a0", "100", "--output", str(out)]) == 0
    text = capsys.readouterr().out
    assert "rounds run: 1 of at most 10" in text and "epsilon spent per user: 1 of 2" in text
    summary = json.loads((tmp_path / "est.jsonl.protocol.json").read_text())
    assert summary["rounds_run"] == 1 and summary["stopped_early"] and summary["epsilon_spent"] == 1.0


def assert_split_rounds_equal_simulation(tmp_path, common, data, rounds):
    """Run ``rounds`` perturb/collect jobs linked by broadcast files and check
    they give the single pipeline's estimates (same seed: identical)."""
    sim = tmp_path / "sim.jsonl"
    assert cli.main(["simulate", *common, *data, "--output", str(sim)]) == 0
    broadcast = []
    for r in range(1, rounds + 1):
        rep = tmp_path / f"r{r}" / "R.avro"
        assert cli.main(["perturb", *common, *data, "--round", str(r), *broadcast, "--output", str(rep)]) == 0
        est = tmp_path / f"est{r}.jsonl"
        assert cli.main(["collect", *common, "--round", str(r), *broadcast,
                         "--input", str(tmp_path / f"r{r}" / "R*.avro"),
                         "--key-dictionary", str(tmp_path / f"r{r}" / "R.keys.txt"), "--output", str(est)]) == 0
        broadcast = ["--broadcast", str(est) + ".broadcast.avro"]
    a = {r["key"]: r for r in read_estimates(str(sim))}
    b = {r["key"]: r for r in read_estimates(str(tmp_path / f"est{rounds}.jsonl"))}
    assert a.keys() == b.keys()
    for k in a:
        assert a[k]["mean"] == pytest.approx(b[k]["mean"], abs=1e-12)
        assert a[k]["frequency"] == pytest.approx(b[k]["frequency"], abs=1e-12)
        assert a[k]["frequency_total"] == pytest.approx(b[k]["frequency_total"], abs=1e-12)


def test_split_rounds_equal_one_pipeline(tmp_path):
    """PrivKVM c = 3 as three perturb/collect jobs with broadcast files."""
    assert_split_rounds_equal_simulation(
        tmp_path, ["--mechanism", "privkvm", "--epsilon", "2", "--rounds", "3"],
        ["--users", "20000", "--keys", "8", "--seed", "6", "--batch-size", "5000"], 3)


def test_split_rounds_refuse_wrong_order(tmp_path, capsys):
    common = ["--mechanism", "privkvm", "--epsilon", "2", "--rounds", "2", "--keys", "4"]
    rep = tmp_path / "R.avro"
    assert cli.main(["perturb", *common, "--users", "1000", "--seed", "1", "--round", "2",
                     "--output", str(rep)]) == 2
    assert "needs --broadcast" in capsys.readouterr().err
    assert cli.main(["perturb", *common, "--users", "1000", "--seed", "1", "--output", str(rep)]) == 0
    # round-1 reports cannot be collected as round 2
    code = cli.main(["collect", "--mechanism", "privkvm", "--epsilon", "2", "--rounds", "2", "--keys", "4",
                     "--round", "1", "--input", str(tmp_path / "R*.avro"), "--output", str(tmp_path / "e.jsonl")])
    assert code == 0
    code = cli.main(["collect", "--mechanism", "privkvm", "--epsilon", "2", "--rounds", "2", "--keys", "4",
                     "--round", "2", "--broadcast", str(tmp_path / "e.jsonl.broadcast.avro"),
                     "--input", str(tmp_path / "R*.avro"), "--output", str(tmp_path / "e2.jsonl")])
    assert code == 2 and "rerun collect" in capsys.readouterr().err
    # after the last round the protocol has ended
    assert cli.main(["perturb", *common, "--users", "1000", "--seed", "1", "--round", "3",
                     "--broadcast", str(tmp_path / "e.jsonl.broadcast.avro"), "--output", str(rep)]) == 2


def test_options_are_checked_per_mechanism(capsys):
    assert cli.main(["simulate", "--mechanism", "pckv-ue", "--epsilon", "1", "--rounds", "3",
                     "--users", "100"]) == 2
    assert "does not take rounds" in capsys.readouterr().err


@pytest.mark.parametrize("name, options, kind", [("ks-grr", {"top": 3}, "gg"), ("ks-adap", {"top": 3}, "multi")])
def test_key_strategy_pipeline_equals_local_runner(name, options, kind):
    """Group-split protocols on Beam: the groups, the candidate side input and
    (KS-Adap) the chosen padding give the local runner's estimates exactly."""
    proto = registry.make(name, 15, 3.0, **options)
    data = SyntheticDataset(kind, n_users=30_000, d=15, seed=4)
    local = run_local(proto, data, seed=9, batch_size=6_000)

    def check(states):
        (s,) = states
        if not (s == local.state and np.array_equal(s.estimates.mean, local.estimates.mean, equal_nan=True)):
            raise BeamAssertException(f"pipeline state {s} != local {local.state}")

    with beam.Pipeline(runner=FnApiRunner()) as p:
        assert_that((_users(p, data, 6_000) | RunProtocol(proto, seed=9))["state"], check)


def test_ks_adap_split_rounds_equal_one_pipeline(tmp_path):
    """KS-Adap's three group rounds (candidates, sizes -> l, final GRR) split."""
    assert_split_rounds_equal_simulation(
        tmp_path, ["--mechanism", "ks-adap", "--epsilon", "3", "--top", "4"],
        ["--dataset", "synthetic-multi", "--users", "20000", "--keys", "12", "--seed", "3", "--batch-size", "5000"],
        3)


def test_ks_grr_split_rounds_keep_round_1s_total(tmp_path):
    """KS-GRR's total (round 1's share of users with a pair) travels in the
    broadcast: the split collection's frequencies and total are the single
    pipeline's."""
    assert_split_rounds_equal_simulation(
        tmp_path, ["--mechanism", "ks-grr", "--epsilon", "3", "--top", "4"],
        ["--dataset", "synthetic-multi", "--users", "20000", "--keys", "40", "--seed", "3", "--batch-size", "5000"],
        2)
    (record, *_) = read_estimates(str(tmp_path / "est2.jsonl"))
    assert record["frequency_total"] == pytest.approx(2.0, abs=4 * record["frequency_total_se"])


def test_simulate_reports_kskv_metrics(capsys):
    assert cli.main(["simulate", "--mechanism", "ks-ue", "--epsilon", "4", "--users", "50000", "--keys", "30",
                     "--dataset", "synthetic-gg", "--seed", "1", "--top", "5"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("mse_frequency_all"))
    fields = dict(kv.split("=") for kv in line.split())
    assert 0.0 <= float(fields["ncr_top5"]) <= 1.0 and "mse_mean_found5" in fields
