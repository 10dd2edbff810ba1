"""What crosses between stages, and what it costs (issue 17: ``simulate``
at d = 10^6 peaked at 1.80 GB, over the 1 GiB budget; ingest pickled its
row chunks ~150 times per million rows only to measure them).

Four costs, each paid once per stage or per copy: Beam's element-size
sampling pickled untyped elements -- report batches, row chunks, the
d-sized states, estimates and tables -- whole, just to measure them; every
unpickled copy of a synthetic dataset rebuilt its own per-key arrays; a
synthetic domain's key names were a list of d strings per caller; a count
model held its shared symbol distributions once per key.
"""
from __future__ import annotations

import pickle

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.coders import typecoders

from kvldp.datasets import SyntheticDataset
from kvldp.datasets.base import NumberedKeys
from kvldp.mechanisms.base import Estimates, Reports, UserBatch
from kvldp.mechanisms.kv.pckv import PCKVUE
from kvldp.mechanisms.protocol import ProtocolState
from kvldp.pipelines import sources
from kvldp.pipelines.graphs import simulate_graph
from kvldp.schemas.estimate_table import EstimateTable
from kvldp.transforms import coders as kvldp_coders
from kvldp.transforms.coders import ArrayPayloadCoder, ArrowArray, NDArray, UserBatchCoder
from kvldp.transforms.io import ReadReports
from kvldp.transforms.rating_files import RatingChunk
from kvldp.transforms.ratings import ReadRatings


def _state(d: int, n: int = 5_000, seed: int = 1) -> ProtocolState:
    """PCKV-UE's state after counts of the size it collects (drawn directly:
    what is measured here is the state's size, not its estimates)."""
    mechanism = PCKVUE(d, 2.0)
    counts = mechanism.new_round_counts(0)
    counts[0] = n
    counts[1:] = np.random.default_rng(seed).binomial(n, 0.1, size=len(counts) - 1)
    return mechanism.advance(0, mechanism.initial_state(), counts)


def test_the_size_estimate_reads_the_arrays_without_pickling(monkeypatch):
    state = _state(50_000)
    encoded = len(ArrayPayloadCoder().encode(state))

    def refuse(*args, **kwargs):
        raise AssertionError("the size estimate pickled the element")

    monkeypatch.setattr(kvldp_coders.pickle, "dumps", refuse)
    estimate = ArrayPayloadCoder().get_impl().estimate_size(state)
    assert 0.5 * encoded < estimate < 2.0 * encoded


def test_the_coder_round_trips_a_state():
    state = _state(2_000)
    back = ArrayPayloadCoder().decode(ArrayPayloadCoder().encode(state))
    assert back == state
    for name in ("frequency", "mean", "frequency_se", "mean_se", "frequency_raw", "mean_raw"):
        np.testing.assert_array_equal(getattr(back.estimates, name), getattr(state.estimates, name))
    assert list(back.estimates.mean_status) == list(state.estimates.mean_status)


def test_every_array_payload_of_the_simulation_is_declared_for_the_coder():
    for kind in (Reports, ProtocolState, Estimates, EstimateTable, NDArray, ArrowArray):
        assert isinstance(typecoders.registry.get_coder(kind), ArrayPayloadCoder)
    # NumPy's and Arrow's own arrays keep Beam's coder: kvldp's steps declare them as its own hints
    for kind in (np.ndarray, pa.Array):
        assert not isinstance(typecoders.registry.get_coder(kind), ArrayPayloadCoder)
    data = sources.DataConfig("synthetic-uu", users=100, keys=10, seed=1, batch_size=50)
    dataset = sources.built_in_dataset(data, 1)
    p = beam.Pipeline()
    source = sources.user_source(p, data, dataset)
    run = simulate_graph(source, PCKVUE(10, 2.0), 1)
    typed = []

    class Types(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            typed.extend((node.full_label, out.element_type) for out in node.outputs.values())

    p.visit(Types())
    wanted = {"Protocol/Round1/Perturb": Reports, "Protocol/Round1/Collect/Accumulate": NDArray,
              "Protocol/Round1/Collect/Calibrate": ProtocolState, "Estimates": Estimates, "ToTable": EstimateTable,
              "SumTruth": NDArray}
    for label, kind in wanted.items():
        found = [t for name, t in typed if name == label or name.startswith(label + "/")]
        assert kind in found, f"{label}: {found}"
    assert run["records"].element_type is EstimateTable


def _element_types(p: beam.Pipeline) -> dict:
    typed = {}

    class Types(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            for tag, out in node.outputs.items():
                typed[(node.full_label, tag)] = out.element_type

    p.visit(Types())
    return typed


def test_the_ingest_and_collect_graphs_declare_their_payloads(tmp_path):
    p = beam.Pipeline()
    read = p | "Read" >> ReadRatings(str(tmp_path / "*.csv"), (1.0, 5.0), key_dictionary=["a", "b"])
    reports = p | "Reports" >> ReadReports(str(tmp_path / "*.avro"), PCKVUE(2, 2.0), 0, {})
    types = _element_types(p)
    assert types[("Read/Parse/ParDo(ParseRatingFileFn)", None)] is RatingChunk
    assert read["users"].element_type is UserBatch
    assert reports.element_type is Reports
    assert isinstance(typecoders.registry.get_coder(RatingChunk), ArrayPayloadCoder)
    assert isinstance(typecoders.registry.get_coder(UserBatch), UserBatchCoder)
    assert types[("Read/Validate/ParDo(ValidateAndShardFn)", None)] == beam.typehints.Tuple[int, RatingChunk]


def test_copies_of_a_synthetic_dataset_share_their_key_arrays():
    dataset = SyntheticDataset("gg", n_users=1_000, d=20_000, seed=4)
    copy = pickle.loads(pickle.dumps(dataset))
    assert copy.key_means is dataset.key_means and copy.key_probs is dataset.key_probs
    with pytest.raises(ValueError):
        copy.key_means[0] = 0.0          # shared, so nobody may write them
    other = SyntheticDataset("gg", n_users=1_000, d=20_000, seed=5)
    assert not np.array_equal(other.key_means, dataset.key_means)
    # the users themselves are what they were
    a, b = dataset.batch(3, 0, 500), copy.batch(3, 0, 500)
    np.testing.assert_array_equal(a.keys, b.keys)
    np.testing.assert_array_equal(a.values, b.values)


def test_numbered_key_names_are_a_recipe_not_a_list():
    names = SyntheticDataset("uu", n_users=10, d=1_000_000, seed=1).key_names
    assert isinstance(names, NumberedKeys)
    assert len(pickle.dumps(names)) < 100
    assert len(names) == 1_000_000 and names[0] == "0" and names[-1] == "999999"
    assert names[5:8] == ["5", "6", "7"] and names[999_998:] == ["999998", "999999"]
    assert "123" in names and "0123" not in names and "1000000" not in names and 5 not in names
    assert names.index("42") == 42
    small = NumberedKeys(4)
    assert small == ["0", "1", "2", "3"] and small != ["0", "1", "2"]
    assert ["0", "1", "2", "3"] == small        # noqa: SIM300  (the list on the left: the reflected comparison)
    assert list(small) == ["0", "1", "2", "3"] and "\n".join(small) == "0\n1\n2\n3"


def test_a_count_model_keeps_and_pickles_one_column_per_shared_distribution():
    d = 200_000
    model = _state(d, n=2_000).estimates.count_model
    assert model.holder_plus.shape == (3, d) and model.holder_plus.strides[1] == 0
    size = len(pickle.dumps(model))
    counts_bytes = model.counts.nbytes
    assert size < counts_bytes * 1.2     # the three (3, d) distributions as copies would add 3x the counts
    back = pickle.loads(pickle.dumps(model))
    for name in ("holder_plus", "holder_minus", "non_holder"):
        np.testing.assert_array_equal(getattr(back, name), getattr(model, name))
    np.testing.assert_array_equal(back.counts, model.counts)
    assert (back.total, back.total_variance, back.independent_total) == (model.total, model.total_variance,
                                                                         model.independent_total)
