"""Jobs take typed, frozen configs built once from the command line; no
library function reads an argparse namespace."""
from __future__ import annotations

import ast
import dataclasses
import os
from pathlib import Path

import numpy as np
import pytest

from kvldp.cli import commands as cli
from kvldp.mechanisms.estimation.postprocess import postprocess
from kvldp.mechanisms.local import run_local
from kvldp.pipelines import evaluate, simulate, sources, split
from kvldp.pipelines.mechanism_config import MechanismConfig
from kvldp.pipelines.simulate import SimulateConfig
from kvldp.pipelines.sources import DataConfig

PIPELINES = Path(__file__).resolve().parents[1] / "kvldp" / "pipelines"
# the only functions that may read a parsed command line: the configs'
# from_args, cli's dispatch to them, and the preset filling evaluate's flags
READS_ARGS = {"from_args", "config_from_args", "apply_preset"}


def test_only_from_args_reads_a_parsed_command_line():
    """A function taking ``args`` builds a config from it (``from_args``,
    cli's dispatch, evaluate's preset); every other one takes a config."""
    offenders = []
    for path in sorted(PIPELINES.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            params = [a.arg for a in node.args.args + node.args.kwonlyargs]
            if "args" in params and node.name not in READS_ARGS:
                offenders.append(f"{path.name}:{node.lineno} {node.name}")
    assert not offenders, offenders


def test_every_command_builds_a_frozen_config():
    for name, command in cli.COMMANDS.items():
        assert dataclasses.is_dataclass(command.config), name
        assert command.config.__dataclass_params__.frozen, name
        assert callable(command.config.from_args), name


def test_a_job_runs_from_a_config_built_in_python(tmp_path):
    """simulate without argparse: the estimates are bit-identical to the
    NumPy runner's with the same seed, post-processed the same way, and the
    CLI builds the same config."""
    data = DataConfig(dataset="synthetic-gg", users=3_000, keys=8, seed=2, batch_size=1_000)
    config = SimulateConfig(data, MechanismConfig("pckv-grr", 2.0), output=str(tmp_path / "e.jsonl"))
    out = simulate.execute(config, [])
    got = {int(r["key"]): r["frequency"] for r in out["records"]}
    dataset = sources.built_in_dataset(data, data.seed)
    local = run_local(out["mechanism"], dataset, data.seed, data.batch_size)
    np.testing.assert_array_equal([got[k] for k in range(8)],
                                  postprocess(local.estimates, config.postprocess).frequency)
    _, parsed, beam_args = cli.configure(["simulate", "--mechanism", "pckv-grr", "--epsilon", "2", "--dataset",
                                          "synthetic-gg", "--users", "3000", "--keys", "8", "--seed", "2",
                                          "--batch-size", "1000", "--output", str(tmp_path / "e.jsonl")])
    assert parsed == config and beam_args == []


def test_configs_check_their_values_up_front():
    with pytest.raises(ValueError, match="--users"):
        DataConfig(users=0)
    with pytest.raises(ValueError, match="lo < hi"):
        DataConfig(rating_range=(5.0, 1.0))
    with pytest.raises(ValueError, match="unknown mechanism"):
        MechanismConfig("nope", 1.0)
    with pytest.raises(ValueError, match="no mechanism option"):
        MechanismConfig("pckv-ue", 1.0, {"paddng": 2})
    with pytest.raises(ValueError, match="--key-dictionary"):
        split.CollectConfig(MechanismConfig("pckv-ue", 1.0), "R*.avro", "e.csv")
    with pytest.raises(dataclasses.FrozenInstanceError):
        DataConfig().users = 5
    with pytest.raises(SystemExit):          # argparse: --users 0 is refused when parsed
        cli.configure(["simulate", "--mechanism", "pckv-ue", "--epsilon", "1", "--users", "0"])


def test_for_cell_keeps_what_each_mechanism_declares():
    """A sweep's options go to the mechanisms that declare them; the job's
    roles (top, coverage) stay; IOH's key choice only for IOH."""
    template = MechanismConfig("pckv-ue", 1.0, {"padding": 2, "rounds": 7, "coverage": 0.8}, ioh_top=3)
    privkvm = template.for_cell("privkvm", 2.0, top=50)
    assert privkvm.options == {"rounds": 7, "coverage": 0.8, "top": 50} and privkvm.ioh_top is None
    assert privkvm.make(10).max_rounds == 7
    pckv = template.for_cell("pckv-grr", 2.0)
    assert pckv.options == {"padding": 2, "coverage": 0.8} and pckv.make(10).l == 2
    ioh = template.for_cell("ioh-oue", 1.0)
    assert ioh.ioh_top == 3 and ioh.options == {"coverage": 0.8}
    with pytest.raises(ValueError, match="does not take padding"):       # given for one mechanism: refused
        MechanismConfig("privkv", 1.0, {"padding": 2}).make(10)


def test_the_cli_fills_configs_from_flags_and_presets(tmp_path):
    _, perturb, _ = cli.configure(["perturb", "--mechanism", "pckv-ue", "--epsilon", "1", "--input", "r.csv",
                                   "--rating-range", "1,5", "--output", str(tmp_path / "R.avro")])
    assert perturb.data.dataset == os.path.abspath("r.csv") and perturb.data.rating_range == (1.0, 5.0)
    assert perturb.prefix == str(tmp_path / "R") and not perturb.data.is_built_in
    _, sweep, _ = cli.configure(["evaluate", "--preset", "sun-fig1", "--repeats", "1", "--out", str(tmp_path)])
    assert sweep.data.users == 100_000 and sweep.repeats == 1 and sweep.top_sets == (20,)
    assert sweep.mechanisms[-1] == "privkvm" and sweep.template.get("rounds") == 10
    cell = sweep.cell(("privkvm", 0.5, 0), str(tmp_path))
    assert isinstance(cell, SimulateConfig) and cell.mechanism.get("top") == 20 and cell.data.seed == 0
    assert isinstance(sweep, evaluate.EvaluateConfig)
