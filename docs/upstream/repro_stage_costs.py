"""Reproduction: the fixed cost of a stage on Beam's in-process FnApiRunner
(stock apache-beam, no kvldp), and how much of it is empty partitions,
empty stages, the bundle processor's threads and bz2 pickles.

    python repro_stage_costs.py [--rounds 10] [--workers 2] [--repeats 3]

Runs a multi-round graph shaped like an iterative protocol: per round a
Map over a few elements with the previous round's result as a singleton
side input, then ``CombineGlobally(sum)``. Every round after the first
gets no input (the protocol "stopped"), as an adaptive algorithm's later
rounds do. Prints the job's time, the number of stages, how many bundles
Beam ran with no input, the ExecutionTreeCreator threads it started, and
the time spent in bz2 compression, each counted by wrapping Beam's
function (the wrappers only count).
"""
import argparse
import bz2
import collections
import threading
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.runners.portability.fn_api_runner import FnApiRunner, fn_runner

counts = collections.Counter()
lock = threading.Lock()

_process_bundle = fn_runner.BundleManager.process_bundle


def process_bundle(self, inputs, *args, **kwargs):
    # the manager's inputs: buffers (a whole stage) or, per partition, lists of encoded chunks
    empty = not any(any(part) for buffer in inputs.values()
                    for part in (buffer.partition(1) if hasattr(buffer, "partition") else [buffer]))
    with lock:
        counts["bundles"] += 1
        counts["bundles without input"] += empty
    return _process_bundle(self, inputs, *args, **kwargs)


fn_runner.BundleManager.process_bundle = process_bundle
_compress = bz2.compress


def compress(data, compresslevel=9):
    start = time.perf_counter()
    try:
        return _compress(data, compresslevel)
    finally:
        with lock:
            counts["bz2 compressions"] += 1
            counts["bz2 ms"] += (time.perf_counter() - start) * 1000


bz2.compress = compress
_thread_start = threading.Thread.start


def thread_start(self):
    if self.name.startswith("ExecutionTreeCreator"):
        with lock:
            counts["ExecutionTreeCreator threads"] += 1
    return _thread_start(self)


threading.Thread.start = thread_start


def step(x, previous, round_index):
    return x + (previous or 0) if round_index == 0 else x


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for _ in range(args.repeats):
        counts.clear()
        options = PipelineOptions([f"--direct_num_workers={args.workers}", "--direct_running_mode=in_memory"])
        p = beam.Pipeline(runner=FnApiRunner(), options=options)
        users = p | "Users" >> beam.Create(range(20))
        previous = p | "Start" >> beam.Create([0])
        for r in range(args.rounds):
            # later rounds keep only what the first round left: nothing
            kept = users if r == 0 else users | f"Stopped{r}" >> beam.Filter(lambda x: False)
            mapped = kept | f"Perturb{r}" >> beam.Map(step, beam.pvalue.AsSingleton(previous), r)
            previous = mapped | f"Combine{r}" >> beam.CombineGlobally(sum)
        start = time.perf_counter()
        result = p.run()
        result.wait_until_finish()
        seconds = time.perf_counter() - start
        print(f"apache-beam {beam.__version__}, {args.rounds} rounds, {args.workers} workers: {seconds:.3f} s; "
              + ", ".join(f"{k} {v:.0f}" for k, v in sorted(counts.items())))


if __name__ == "__main__":
    main()
