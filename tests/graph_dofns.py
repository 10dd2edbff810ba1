"""The DoFns of kvldp's graphs, for the tests of Beam's per-ParDo memos
(``test_dofn_specs.py``, ``test_yield_check.py``)."""
from __future__ import annotations

import apache_beam as beam

from kvldp.mechanisms.kv.pckv import PCKVUE
from kvldp.mechanisms.kv.privkvm import PrivKVMPlus
from kvldp.pipelines import sources
from kvldp.pipelines.graphs import simulate_graph
from kvldp.transforms.io import ReadReports, WriteEstimates
from kvldp.transforms.ratings import ReadRatings


def dofns_of(p: beam.Pipeline) -> list:
    """Every ParDo's DoFn in ``p``."""
    fns = []

    class DoFns(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            if isinstance(node.transform, beam.ParDo):
                fns.append(node.transform.fn)

    p.visit(DoFns())
    return fns


def kvldp_dofns(tmp_path) -> list:
    """The DoFns of simulate's graph for a one-round mechanism and a
    protocol with data-dependent rounds, and of the ratings and reports readers."""
    data = sources.DataConfig("synthetic-uu", users=100, keys=10, seed=1, batch_size=50)
    dataset = sources.built_in_dataset(data, 1)
    fns = []
    for protocol in (PCKVUE(10, 2.0), PrivKVMPlus(10, 2.0)):
        p = beam.Pipeline()
        run = simulate_graph(sources.user_source(p, data, dataset), protocol, 1)
        run["records"] | WriteEstimates(str(tmp_path / "e.jsonl"))
        fns += dofns_of(p)
    p = beam.Pipeline()
    p | "Ratings" >> ReadRatings(str(tmp_path / "*.csv"), (1.0, 5.0))
    p | "Reports" >> ReadReports(str(tmp_path / "*.avro"), PCKVUE(2, 2.0), 0, {})
    return fns + dofns_of(p)
