"""Reproduction: what Beam's Python SDK spends building and translating a
graph of many ParDos, by function (stock apache-beam, no kvldp).

    python repro_graph_costs.py [--pardos 74] [--rounds 3]

Builds ``--pardos`` ParDos of DoFn subclasses (each with a ``process`` and a
``setup``), translates the pipeline to its runner proto as every runner does
(``Pipeline.to_runner_api``), and prints, for each of five functions, how
often it was called and the time spent inside it, next to the whole build.
The functions are wrapped only to be counted; the numbers are Beam's own.
"""
import argparse
import collections
import functools
import threading
import time

import apache_beam as beam
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.transforms import core, userstate
from apache_beam.typehints import decorators

spent = collections.Counter()
calls = collections.Counter()
depth = threading.local()


def timed(name, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if getattr(depth, name, 0):
            return fn(*args, **kwargs)
        setattr(depth, name, 1)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start
            calls[name] += 1
            setattr(depth, name, 0)
    return wrapper


core.get_function_args_defaults = timed("core.get_function_args_defaults", core.get_function_args_defaults)
userstate.get_dofn_specs = timed("userstate.get_dofn_specs", userstate.get_dofn_specs)
if hasattr(core, "_check_fn_use_yield_and_return"):
    core._check_fn_use_yield_and_return = timed("core._check_fn_use_yield_and_return",
                                                core._check_fn_use_yield_and_return)
decorators.IOTypeHints._make_origin = classmethod(timed(
    "IOTypeHints._make_origin", decorators.IOTypeHints.__dict__["_make_origin"].__func__))
PipelineOptions.view_as = timed("PipelineOptions.view_as", PipelineOptions.view_as)


class Step(beam.DoFn):
    def __init__(self, index):
        self.index = index

    def setup(self):
        self.offset = self.index

    def process(self, element):
        yield element + self.offset


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pardos", type=int, default=74, help="ParDos in the graph (kvldp's PrivKVM+: 74)")
    args = parser.parse_args()
    start = time.perf_counter()
    p = beam.Pipeline(options=PipelineOptions(["--direct_num_workers=2", "--direct_running_mode=in_memory"]))
    pcoll = p | beam.Create([1, 2, 3]).with_output_types(int)
    for i in range(args.pardos):
        pcoll = pcoll | f"Step{i}" >> beam.ParDo(Step(i)).with_output_types(int)
    built = time.perf_counter()
    p.to_runner_api()
    done = time.perf_counter()
    print(f"apache-beam {beam.__version__}: {args.pardos} ParDos built in {built - start:.3f} s, "
          f"translated in {done - built:.3f} s")
    for name, seconds in spent.most_common():
        print(f"  {name:45s} {calls[name]:6d} calls  {seconds * 1000:8.1f} ms  "
              f"({seconds * 1e6 / calls[name]:.0f} us a call)")


if __name__ == "__main__":
    main()
