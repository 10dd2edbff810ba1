"""Batch sizes from a memory budget (issue 16: the README's Clothing sweep
took 11 GB per PCKV-UE cell with 50,000-user batches): wide reports get
small batches, narrow ones keep the default (so estimates stay bit-identical
where nothing was wrong), and the size never depends on anyone's data."""
from __future__ import annotations

import resource
import subprocess
import sys

import numpy as np
import pytest

from kvldp.cli import commands as cli
from kvldp.mechanisms import registry, sizing
from kvldp.mechanisms.base import DEFAULT_BATCH_SIZE
from kvldp.pipelines.sources import DataConfig


def test_narrow_reports_keep_the_default_batch():
    for name in ("pckv-grr", "kvue", "privkv", "privkvm", "ks-grr"):
        assert sizing.batch_size_for(registry.make(name, 5850, 0.5), 5850) == DEFAULT_BATCH_SIZE
    assert sizing.batch_size_for(registry.make("pckv-ue", 100, 4), 100) == DEFAULT_BATCH_SIZE


@pytest.mark.parametrize("name", ["pckv-ue", "ks-ue"])
def test_wide_reports_get_batches_whose_working_set_fits_the_budget(name):
    proto = registry.make(name, 5850, 0.5)
    per_report = sizing.bytes_per_report(proto, 5850)
    assert per_report > 5_000                      # ~b d set entries: thousands per user
    for budget in (2**28, 2**30, 2**32):
        batch = sizing.batch_size_for(proto, 5850, budget)
        in_flight = sizing.PARALLEL_BATCHES * sizing.WORKING_SET_FACTOR * per_report
        room = max(budget - sizing.BASELINE, budget / 4)
        assert batch < DEFAULT_BATCH_SIZE
        assert batch * in_flight <= room
        assert (batch + 1) * in_flight > room or batch == sizing.MIN_BATCH
    assert sizing.batch_size_for(proto, 5850, 2**28) < sizing.batch_size_for(proto, 5850, 2**30)


def test_the_size_is_the_same_every_time_and_for_any_data():
    proto = registry.make("pckv-ue", 3000, 1.0, padding=2)
    sizes = {sizing.batch_size_for(proto, 3000) for _ in range(3)}
    assert len(sizes) == 1
    a = DataConfig("synthetic-uu", keys=3000, users=10).sized_for(proto, 3000)
    b = DataConfig("synthetic-gg", keys=3000, users=99, seed=5).sized_for(proto, 3000)
    assert a.batch_size == b.batch_size == sizes.pop()
    assert DataConfig("synthetic-uu", batch_size=777).sized_for(proto, 3000).batch_size == 777     # given: kept


def test_the_probe_users_are_synthetic_and_fixed():
    one, two = sizing.probe_users(50, 3), sizing.probe_users(50, 3)
    assert np.array_equal(one.keys, two.keys) and np.array_equal(one.values, two.values)
    assert set(one.sizes) == {3} and all(len(set(one.keys[i * 3:i * 3 + 3])) == 3 for i in range(one.n_users))


def test_memory_budget_flag(capsys):
    _, config, _ = cli.configure(["simulate", "--mechanism", "pckv-ue", "--epsilon", "1", "--memory-budget", "512MiB"])
    assert config.data.memory_budget == 2**29 and config.data.batch_size is None
    with pytest.raises(SystemExit):
        cli.configure(["simulate", "--mechanism", "pckv-ue", "--epsilon", "1", "--memory-budget", "10kB"])
    assert "at least 1 MiB" in capsys.readouterr().err


@pytest.mark.slow
def test_the_readme_clothing_cell_stays_within_its_budget(tmp_path):
    """PCKV-UE on Clothing at eps 0.5 (d = 5,850, l = 2): 10.5 GB peak with
    50,000-user batches before; now within the default budget of 1 GiB."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    subprocess.run([sys.executable, "-m", "kvldp", "simulate", "--mechanism", "pckv-ue",
                    "--epsilon", "0.5", "--dataset", "clothing", "--seed", "1", "--output", str(tmp_path / "e.jsonl")],
                   check=True, capture_output=True)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    assert peak_kib > before and peak_kib < 2**20, f"peak {peak_kib / 2**20:.2f} GiB"


@pytest.mark.parametrize("name, d, epsilon, options", [
    ("pckv-ue", 5850, 0.5, {}), ("ks-ue", 5850, 0.5, {}),
    ("ioh-sue", 100, 4.0, {"ioh_keys": tuple(range(10))}), ("ioh-oue", 100, 4.0, {"ioh_keys": tuple(range(10))})])
def test_a_budget_sized_batch_perturbs_within_the_working_set_the_size_assumes(name, d, epsilon, options):
    """The batch size assumes a batch's perturbation peaks at
    ``WORKING_SET_FACTOR`` times its reports' bytes; measured here
    (tracemalloc: NumPy reports its buffers) on a batch of that size. IOH-SUE
    at k = 10 peaked at 39x (0.79 GB a batch: 1.6-1.8 GB jobs) while its
    unary encoding kept five int64 arrays of ~20M set positions at once."""
    import tracemalloc

    from kvldp.mechanisms.privacy.randomness import batch_rng
    from kvldp.mechanisms.protocol import Collection

    proto = registry.make(name, d, epsilon, **options)
    batch = sizing.batch_size_for(proto, d)
    assert batch < DEFAULT_BATCH_SIZE                       # the budget sizes it
    users = sizing.probe_users(d, int(getattr(proto, "l", 1) or 1), n=batch)
    state = proto.initial_state(Collection.from_seed(1))
    users = proto.participants(0, users, state)
    tracemalloc.start()
    try:
        reports = proto.perturb_round(0, users, batch_rng(7, 1), state)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak <= sizing.WORKING_SET_FACTOR * sizing.report_bytes(reports), \
        f"{peak / 1e6:.0f} MB for {sizing.report_bytes(reports) / 1e6:.0f} MB of reports"
