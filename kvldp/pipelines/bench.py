"""``kvldp bench``: users/second of the Beam pipeline next to the pure-NumPy
local runner on the same data (generate -> perturb -> accumulate -> calibrate)."""
from __future__ import annotations

import argparse
import time

import numpy as np

from kvldp.datasets import SyntheticDataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.base import DEFAULT_BATCH_SIZE
from kvldp.mechanisms.local import run_local
from kvldp.pipelines import runner, sources
from kvldp.pipelines.graphs import simulate_graph
from kvldp.pipelines.report import read_estimates
from kvldp.transforms.io import WriteEstimates


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--mechanism", required=True)
    parser.add_argument("--epsilon", type=float, default=4.0)
    parser.add_argument("--users", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100)
    parser.add_argument("--padding", "-l", type=int, default=1)
    parser.add_argument("--dataset", default="synthetic-uu",
                        choices=("synthetic-uu", "synthetic-gg", "synthetic-multi"))
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs of each path; the best is reported (the first pays one-off warm-up)")


def _beam_run(args, beam_args, dataset, mechanism) -> tuple[float, np.ndarray]:
    out = runner.scratch_path(beam_args, "estimates.jsonl")
    start = time.perf_counter()
    p = runner.make_pipeline(beam_args)
    source = sources.user_source(p, args, dataset)
    run = simulate_graph(source.users, mechanism, args.seed, source.key_names, truth=False)
    run["records"] | "Write" >> WriteEstimates(out)
    p.run().wait_until_finish()
    seconds = time.perf_counter() - start
    records = sorted(read_estimates(out), key=lambda r: int(r["key"]))
    return seconds, np.array([np.nan if r["frequency"] is None else r["frequency"] for r in records])


def run(args, beam_args) -> dict:
    dataset = SyntheticDataset(args.dataset.split("-", 1)[1], n_users=args.users, d=args.keys, seed=args.seed)
    takes_padding = "padding" in registry.options_of(args.mechanism)
    mechanism = registry.make(args.mechanism, args.keys, args.epsilon, padding=args.padding if takes_padding else None)
    numpy_s, beam_s = [], []
    for _ in range(args.repeats):
        start = time.perf_counter()
        local = run_local(mechanism, dataset, args.seed, args.batch_size)
        numpy_s.append(time.perf_counter() - start)
        seconds, beam_freq = _beam_run(args, beam_args, dataset, mechanism)
        beam_s.append(seconds)
    same = bool(np.array_equal(beam_freq, local.estimates.frequency, equal_nan=True))   # null = null
    n = args.users
    numpy_rate, beam_rate = n / min(numpy_s), n / min(beam_s)
    print(f"{mechanism!r}, {args.dataset}, n={n:,}, batch={args.batch_size:,}")
    print(f"  numpy local runner: {min(numpy_s):8.2f} s  {numpy_rate / 1e6:8.3f} M users/s")
    print(f"  beam pipeline:      {min(beam_s):8.2f} s  {beam_rate / 1e6:8.3f} M users/s")
    print(f"  ratio beam/numpy:   {beam_rate / numpy_rate:8.2f}   identical estimates: {same}")
    return {"numpy_users_per_s": numpy_rate, "beam_users_per_s": beam_rate, "ratio": beam_rate / numpy_rate,
            "identical": same}
