"""``kvldp bench``: users/second of the Beam pipeline next to the pure-NumPy
local runner on the same data (generate -> perturb -> accumulate -> calibrate)."""
from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np

from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.randomness import SimulationSeed, noise_generator_name
from kvldp.pipelines import mechanism_args, runner, sources
from kvldp.pipelines.graphs import simulate_graph
from kvldp.pipelines.mechanism_args import MechanismConfig
from kvldp.pipelines.report import read_estimates
from kvldp.pipelines.sources import DataConfig
from kvldp.transforms.io import WriteEstimates

SYNTHETIC = ("synthetic-uu", "synthetic-gg", "synthetic-multi", "synthetic-corr")


def add_arguments(parser: argparse.ArgumentParser):
    mechanism_args.add_mechanism_args(parser, epsilon=4.0)
    parser.add_argument("--users", type=sources.positive_int, default=1_000_000)
    parser.add_argument("--keys", type=sources.positive_int, default=100)
    parser.add_argument("--dataset", default="synthetic-uu", choices=SYNTHETIC)
    sources.add_batch_args(parser)
    parser.add_argument("--seed", type=int, default=1)
    sources.add_fast_rng_arg(parser)
    parser.add_argument("--repeats", type=sources.positive_int, default=3,
                        help="timed runs of each path; the best is reported (the first pays one-off warm-up)")


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """The mechanism, the synthetic users it runs on, and how many timed runs."""

    data: DataConfig
    mechanism: MechanismConfig
    repeats: int = 3

    @classmethod
    def from_args(cls, args) -> BenchConfig:
        return cls(DataConfig.from_args(args), MechanismConfig.from_args(args), args.repeats)


def _beam_run(config: BenchConfig, beam_args, dataset, mechanism, seed) -> tuple[float, np.ndarray]:
    out = runner.scratch_path(beam_args, "estimates.jsonl")
    start = time.perf_counter()
    p = runner.make_pipeline(beam_args)
    source = sources.user_source(p, config.data, dataset)
    run = simulate_graph(source.users, mechanism, seed, source.key_names, truth=False)
    run["records"] | "Write" >> WriteEstimates(out)
    p.run().wait_until_finish()
    seconds = time.perf_counter() - start
    by_key = {int(r["key"]): r["frequency"] for r in read_estimates(out)}
    # in the order of the local runner's arrays: mechanism.estimate_keys (IOH: its chosen keys)
    return seconds, np.array([np.nan if by_key[k] is None else by_key[k] for k in mechanism.estimate_keys])


def run(config: BenchConfig, beam_args) -> dict:
    data = config.data
    seeds = sources.Seeds.of(data)
    dataset = sources.built_in_dataset(data, seeds.data)
    mechanism = config.mechanism.make(dataset.d, dataset, mechanism_args.resolve_ioh_keys(
        config.mechanism, data, beam_args, dataset.key_names, dataset, None))
    data = data.sized_for(mechanism, dataset.d)
    config = dataclasses.replace(config, data=data)
    crypto = not isinstance(seeds.perturb, SimulationSeed)
    numpy_s, beam_s, fast_s = [], [], []
    for _ in range(config.repeats):
        seconds, local = _numpy_run(mechanism, dataset, seeds.perturb, data.batch_size)
        numpy_s.append(seconds)
        if crypto:      # the same run with the fast generator: what the cryptographic one costs
            fast_s.append(_numpy_run(mechanism, dataset, SimulationSeed(seeds.perturb), data.batch_size)[0])
        seconds, beam_freq = _beam_run(config, beam_args, dataset, mechanism, seeds.perturb)
        beam_s.append(seconds)
    same = bool(np.array_equal(beam_freq, local.estimates.frequency, equal_nan=True))   # null = null
    n = dataset.n_users
    numpy_rate, beam_rate = n / min(numpy_s), n / min(beam_s)
    print(f"{mechanism!r}, {data.dataset}, n={n:,}, batch={data.batch_size:,}, noise from "
          f"{noise_generator_name(seeds.perturb)}")
    print(f"  numpy local runner: {min(numpy_s):8.2f} s  {numpy_rate / 1e6:8.3f} M users/s")
    print(f"  beam pipeline:      {min(beam_s):8.2f} s  {beam_rate / 1e6:8.3f} M users/s")
    print(f"  ratio beam/numpy:   {beam_rate / numpy_rate:8.2f}   identical estimates: {same}")
    out = {"numpy_users_per_s": numpy_rate, "beam_users_per_s": beam_rate, "ratio": beam_rate / numpy_rate,
           "identical": same}
    if crypto:
        share = 1.0 - min(fast_s) / min(numpy_s)
        print(f"  numpy, PCG64DXSM:   {min(fast_s):8.2f} s  {n / min(fast_s) / 1e6:8.3f} M users/s: the "
              f"cryptographic generator costs {share:+.1%} of the numpy time, {share * min(numpy_s) / min(beam_s):+.1%}"
              f" of the Beam time")
        out.update(fast_numpy_users_per_s=n / min(fast_s), generator_share=share)
    return out


def _numpy_run(mechanism, dataset, seed, batch_size):
    start = time.perf_counter()
    result = run_local(mechanism, dataset, seed, batch_size)
    return time.perf_counter() - start, result
