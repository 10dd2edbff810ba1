"""``kvldp bench``: users/second of the Beam pipeline next to the pure-NumPy
local runner on the same data (generate -> perturb -> accumulate -> calibrate)."""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import numpy as np

from kvldp.bench import kernels as bench_kernels
from kvldp.bench import stream as bench_stream
from kvldp.bench import sweep as bench_sweep
from kvldp.bench.stream import StreamBenchConfig
from kvldp.mechanisms import registry
from kvldp.mechanisms.estimation.postprocess import RAW, postprocess
from kvldp.mechanisms.local import run_local
from kvldp.mechanisms.privacy.randomness import SimulationSeed, noise_generator_name
from kvldp.pipelines import mechanism_config, sources, sweep
from kvldp.pipelines.graphs import simulate_graph
from kvldp.pipelines.mechanism_config import MechanismConfig
from kvldp.pipelines.sources import DataConfig
from kvldp.plots.tables import read_estimates
from kvldp.runtime import jobs as runner
from kvldp.transforms.io import WriteEstimates


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """The mechanism, the synthetic users it runs on, and how many timed runs."""

    data: DataConfig
    mechanism: MechanismConfig
    repeats: int = 3
    sweep: str | None = None                  # a sweep's output directory
    mechanisms: tuple[str, ...] = ()          # the sweep's mechanisms
    sizes: tuple[int, ...] = (100_000, 1_000_000, 10_000_000)
    kernels: bool = False
    stock: bool = False                       # the sweep also runs each Beam job on stock Beam
    stream: StreamBenchConfig | None = None   # kvldp bench --stream: the streaming collector instead

    def __post_init__(self):
        for name in self.mechanisms:
            registry.factory(name)

    @classmethod
    def from_args(cls, args) -> BenchConfig:
        names = registry.names() if args.mechanisms == "all" else tuple(
            m.strip() for m in args.mechanisms.split(",") if m.strip())
        try:
            sizes = tuple(int(float(s)) for s in args.sizes.split(","))
        except ValueError:
            raise ValueError(f"--sizes takes comma-separated user counts, got {args.sizes!r}") from None
        live = None if args.stream is None else StreamBenchConfig(
            args.stream, args.mechanism, args.epsilon, args.keys, args.users, args.batch_size or 1_000,
            args.stream_rate, args.stream_seconds, kafka_bootstrap=args.stream_kafka_bootstrap,
            expansion_service=args.stream_expansion_service, seed=args.seed)
        return cls(DataConfig.from_args(args), MechanismConfig.from_args(args), args.repeats, args.sweep,
                   tuple(names), sizes, args.kernels, args.stock, live)


def _beam_run(config: BenchConfig, beam_args, dataset, mechanism, seed) -> tuple[float, np.ndarray, dict]:
    phases: dict = {}
    start = time.perf_counter()
    frequency = beam_frequencies(config.data, beam_args, dataset, mechanism, seed, phases)
    return time.perf_counter() - start, frequency, phases


def beam_frequencies(data: DataConfig, beam_args, dataset, mechanism, seed,
                     phases: dict | None = None) -> np.ndarray:
    """The simulate pipeline without the truth: frequency estimates in the
    order of the local runner's arrays (``mechanism.estimate_keys``; IOH: its chosen keys).

    ``phases`` (on the local runner) gets the job's split, in seconds:
    ``graph`` (the pipeline built, translated and fused: the first stage's
    start), ``stages`` (running them) and ``read`` (the estimates read back)."""
    start = time.perf_counter()
    out = runner.scratch_path(beam_args, "estimates.jsonl")
    p = runner.make_pipeline(beam_args)
    source = sources.user_source(p, data, dataset)
    run = simulate_graph(source, mechanism, seed, truth=False)
    run["records"] | "Write" >> WriteEstimates(out)
    runner.finish(p.run())
    records = read_estimates(out)
    frequency = in_key_order(records.column("key"), records.column("frequency"), mechanism.estimate_keys)
    if phases is not None and getattr(p.runner, "stages_ended", None) is not None:
        started, ended = p.runner.stages_started, p.runner.stages_ended
        phases.update(graph=started - start, stages=ended - started, read=time.perf_counter() - ended)
    return frequency


def in_key_order(keys, values, wanted) -> np.ndarray:
    """``values`` (one per key of ``keys``) in the order of ``wanted``
    (arrays, not a dict of d boxed numbers: 0.1 GB at d = 10^6)."""
    keys, wanted = np.asarray(keys, dtype=np.int64), np.asarray(wanted, dtype=np.int64)
    order = np.argsort(keys, kind="stable")
    pos = np.searchsorted(keys, wanted, sorter=order)
    found = pos < len(keys)
    at = order[np.where(found, pos, 0)] if len(keys) else pos
    found[found] = keys[at[found]] == wanted[found]
    if not found.all():
        raise KeyError(f"no estimate for key(s) {wanted[~found][:5].tolist()}")
    return np.asarray(values, dtype=np.float64)[at]


def run(config: BenchConfig, beam_args) -> dict:
    if config.sweep:
        return run_sweep(config)
    if config.stream is not None:
        return bench_stream.run(config.stream, beam_args)
    data = config.data
    seeds = sources.Seeds.of(data)
    dataset = sources.built_in_dataset(data, seeds.data)
    mechanism = config.mechanism.make(dataset.d, dataset, mechanism_config.resolve_ioh_keys(
        config.mechanism, data, beam_args, dataset.key_names, dataset, None))
    data = data.sized_for(mechanism, dataset.d)
    config = dataclasses.replace(config, data=data)
    crypto = not isinstance(seeds.perturb, SimulationSeed)
    numpy_s, beam_s, fast_s, beam_phases = [], [], [], []
    for _ in range(config.repeats):
        seconds, local = _numpy_run(mechanism, dataset, seeds.perturb, data.batch_size)
        numpy_s.append(seconds)
        if crypto:      # the same run with the fast generator: what the cryptographic one costs
            fast_s.append(_numpy_run(mechanism, dataset, SimulationSeed(seeds.perturb), data.batch_size)[0])
        seconds, beam_freq, phases = _beam_run(config, beam_args, dataset, mechanism, seeds.perturb)
        beam_s.append(seconds)
        beam_phases.append(phases)
    # the pipeline writes the raw output, whose frequencies the truncation correction may divide
    same = bool(np.array_equal(beam_freq, postprocess(local.estimates, RAW).frequency, equal_nan=True))  # null = null
    n = dataset.n_users
    numpy_rate, beam_rate = n / min(numpy_s), n / min(beam_s)
    print(f"{mechanism!r}, {data.dataset}, n={n:,}, batch={data.batch_size:,}, noise from "
          f"{noise_generator_name(seeds.perturb)}")
    print(f"  numpy local runner: {min(numpy_s):8.2f} s  {numpy_rate / 1e6:8.3f} M users/s")
    print(f"  beam pipeline:      {min(beam_s):8.2f} s  {beam_rate / 1e6:8.3f} M users/s")
    fastest = beam_phases[beam_s.index(min(beam_s))]
    if fastest:         # the local runner's split (another runner's job is timed whole)
        print(f"    of which graph:   {fastest['graph']:8.2f} s  (built and translated before the first stage), "
              f"stages {fastest['stages']:.2f} s")
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


def run_sweep(config: BenchConfig) -> dict:
    """``--sweep DIR``: ``bench_sweep`` over the mechanisms and sizes, and
    with ``--kernels`` the kernel floors and the peers."""
    out = Path(config.sweep)
    seed = config.data.seed if config.data.seed is not None else 1
    rows = bench_sweep.run_sweep(config.mechanisms, config.sizes, config.data.keys, seed,
                                 config.mechanism.epsilon, out, repeats=config.repeats, stock=config.stock)
    print(f"sweep: {out / 'bench.csv'}, {out / 'bench.png'}")
    result = {"rows": rows}
    if config.kernels:
        kernel_rows = bench_kernels.kernels(min(max(config.sizes), 1_000_000), config.data.keys,
                                            config.mechanism.epsilon, seed)
        for r in kernel_rows:
            print(f"kernel {r['oracle']}: kvldp {r['kvldp_users_per_s'] / 1e6:.2f} M/s, plain NumPy floor "
                  f"{r['floor_users_per_s'] / 1e6:.2f} M/s: kvldp takes {r['floor_over_kvldp']:.2f}x the floor's time")
        peer_rows = bench_kernels.peers(tuple(n for n in config.sizes if n <= 1_000_000), config.data.keys,
                                        config.mechanism.epsilon, seed, repeats=config.repeats)
        for r in peer_rows:
            print(f"{r['who']:28s} {r['oracle']} n={r['users']:>9,}: {r['seconds']:8.1f} s (whole command)"
                  + (f" FAILED {r['error']}" if r["error"] else ""))
        sweep.write_csv_atomically(out / "kernels.csv", list(kernel_rows[0]), kernel_rows)
        sweep.write_csv_atomically(out / "peers.csv", ["who", "oracle", "users", "seconds", "error"], peer_rows)
        result.update(kernels=kernel_rows, peers=peer_rows)
    return result
