"""IOH plumbing: bit packing, the packed and sparse report forms,
validation, construction and the MovieLens-100k loader (SPEC.md §2).
"""
import math

import numpy as np
import pytest

from ioh_helpers import ue_params
from kvldp.mechanisms.base import ReportBatch, UserBatch
from kvldp.mechanisms.kv.ioh import IOH, MAX_IOH_KEYS, PackedReportBatch, bit_sums, pack_positions, packed_width
from kvldp.mechanisms.privacy import randomness
from kvldp.mechanisms.registry import make


# =====================================================================
# 1. Plumbing: packing, both report forms, validation
# =====================================================================
@pytest.mark.parametrize("n_cells", [1, 3, 8, 9, 13, 16, 27, 81, 100, 243])
def test_pack_positions_and_bit_sums_round_trip(n_cells):
    """Random sparse rows (some empty, some full) -> packed rows equal to
    np.packbits of the dense rows, width ceil(n_cells/8), zero padding;
    bit_sums equals the bincount of the positions (chunked or not)."""
    rng = np.random.default_rng(n_cells)
    n = 50
    dense = rng.random((n, n_cells)) < rng.uniform(0, 1, (n, 1))
    dense[0] = False
    dense[1] = True
    _, positions = np.nonzero(dense)
    offsets = np.concatenate([[0], np.cumsum(dense.sum(axis=1))])
    width = packed_width(n_cells)
    assert width == math.ceil(n_cells / 8)
    want = np.packbits(np.pad(dense, ((0, 0), (0, 8 * width - n_cells))), axis=1)
    for chunk in (7, 4096):
        packed = pack_positions(offsets, positions, n_cells, chunk_rows=chunk)
        assert packed.shape == (n, width) and packed.dtype == np.uint8
        np.testing.assert_array_equal(packed, want)
    unpacked = np.unpackbits(packed, axis=1)
    assert not unpacked[:, n_cells:].any()
    for chunk in (3, 8192):
        np.testing.assert_array_equal(bit_sums(packed, n_cells, chunk_rows=chunk),
                                      np.bincount(positions, minlength=n_cells))


def test_bit_sums_count_past_a_blocks_uint16_sums():
    """A block's column sums are taken in uint16: more rows than 65,535 with
    every bit set must still count every row (the blocks are cut there)."""
    rows = 70_001
    bits = np.full((rows, 1), 0xFF, dtype=np.uint8)
    np.testing.assert_array_equal(bit_sums(bits, 8), np.full(8, rows))
    np.testing.assert_array_equal(bit_sums(bits, 5, chunk_rows=100_000), np.full(5, rows))


@pytest.mark.parametrize("variant", ["oue", "sue"])
@pytest.mark.parametrize("run", [3, 50, 1 << 20])
def test_packed_reports_equal_the_packed_sparse_reports(monkeypatch, variant, run):
    """The packed form is packed a run of set bits at a time (rows shared by
    two runs ORed), the kept cells' bits set last: the same bits as packing
    the oracle's sorted positions, from the same draws."""
    monkeypatch.setattr(randomness, "GAP_STEP", run)
    mech = IOH(4, 1.0, variant, ioh_keys=[0, 1, 3])
    assert not mech.sparse
    users = UserBatch.single_pair(np.arange(600) % 4, np.linspace(-1, 1, 600))
    reports = mech.perturb(users, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    cells = mech.cells(users, rng)
    offsets, positions = mech.oracle.perturb(cells, rng)
    np.testing.assert_array_equal(reports.bits, pack_positions(offsets, positions, 27))


@pytest.mark.parametrize("variant", ["oue", "sue"])
def test_accumulate_packed_and_sparse_forms_agree(variant):
    """The client's sparse set positions, sent as a ReportBatch or packed,
    give identical counts; counts merge in any order."""
    mech = IOH(4, 1.0, variant, ioh_keys=[0, 1, 3])
    rng = np.random.default_rng(8)
    cells = rng.integers(0, 27, 3000)
    offsets, positions = mech.oracle.perturb(cells, rng)
    sparse = ReportBatch(offsets, positions, np.ones(len(positions)))
    packed = PackedReportBatch(pack_positions(offsets, positions, 27), 27)
    a = mech.accumulate(mech.new_counts(), sparse)
    b = mech.accumulate(mech.new_counts(), packed)
    np.testing.assert_array_equal(a, b)
    assert a[0] == 3000 and a[1:].sum() == len(positions)
    np.testing.assert_array_equal(a[1:], np.bincount(positions, minlength=27))
    halves = [PackedReportBatch(packed.bits[:1000], 27), PackedReportBatch(packed.bits[1000:], 27)]
    parts = [mech.accumulate(mech.new_counts(), h) for h in halves]
    np.testing.assert_array_equal(mech.merge(parts[::-1]), a)


def test_accumulate_rejects_foreign_reports():
    mech = IOH(3, 1.0)
    assert mech.n_cells == 27 and mech.counts_size == 28 and mech.report_domain == 27
    with pytest.raises(ValueError):
        mech.accumulate(mech.new_counts(), PackedReportBatch(np.zeros((2, 2), np.uint8), 9))
    with pytest.raises(ValueError):
        mech.accumulate(mech.new_counts(), PackedReportBatch(np.zeros((2, 4), np.uint8), 28))
    with pytest.raises(ValueError):
        PackedReportBatch(np.zeros((2, 3), np.uint8), 27)             # 27 cells need 4 bytes
    with pytest.raises(ValueError):
        PackedReportBatch(np.zeros(4, np.uint8), 27)
    for bad in (27, -1):
        with pytest.raises(ValueError):
            mech.accumulate(mech.new_counts(), ReportBatch([0, 1, 2], [3, bad], [1, 1]))
    with pytest.raises(TypeError):
        mech.accumulate(mech.new_counts(), np.zeros((2, 4), np.uint8))
    counts = mech.accumulate(mech.new_counts(), PackedReportBatch(np.zeros((5, 4), np.uint8), 27))
    assert counts[0] == 5 and not counts[1:].any()
    assert PackedReportBatch(np.ones((2, 4)), 27).equals(PackedReportBatch(np.ones((2, 4), np.uint8), 27))


@pytest.mark.parametrize("kwargs", [
    dict(d=5, variant="grr"), dict(d=5, variant="OUE"),
    dict(d=12, ioh_keys=list(range(MAX_IOH_KEYS + 1))), dict(d=5, ioh_keys=[]),
    dict(d=5, ioh_keys=[0, 2, 0]), dict(d=5, ioh_keys=[0, 5]), dict(d=5, ioh_keys=[-1, 2]),
    dict(d=0), dict(d=3, epsilon=0.0),
])
def test_constructor_validation(kwargs):
    kwargs = {"epsilon": 1.0, **kwargs}
    with pytest.raises(ValueError):
        IOH(**kwargs)


def test_constructor_defaults_and_registry():
    assert IOH(2, 1.0).ioh_keys == [0, 1] and IOH(7, 1.0).ioh_keys == [0, 1, 2]
    assert IOH(1, 1.0).n_cells == 3
    assert IOH(12, 1.0, ioh_keys=list(range(MAX_IOH_KEYS))).n_cells == 3 ** MAX_IOH_KEYS
    for variant in ("oue", "sue"):
        mech = make(f"ioh-{variant}", 6, 1.5, ioh_keys=[4, 0])
        assert isinstance(mech, IOH) and mech.variant == variant and mech.name == f"ioh-{variant}"
        assert mech.estimate_keys == [4, 0] and mech.n_cells == 9
        p, q = ue_params(variant, 1.5)
        assert (mech.p, mech.q) == (pytest.approx(p, rel=1e-15), pytest.approx(q, rel=1e-15))


# =====================================================================
# 2. MovieLens-100k
# =====================================================================
def test_movielens_100k_loader():
    import importlib.util

    if importlib.util.find_spec("recbole") is None:
        pytest.skip("MovieLens-100k ships with recbole==1.2.1, which is not installed")
    from kvldp.datasets import load_movielens_100k

    data = load_movielens_100k()
    u = data.users
    assert data.n_users == 943 and data.d == 1682 and len(u.keys) == 100_000
    assert set(np.unique(u.values).tolist()) == {-1.0, -0.5, 0.0, 0.5, 1.0}
    assert u.sizes.min() >= 20                        # every ML-100k user rated >= 20 movies
    assert u.keys.min() == 0 and u.keys.max() == 1681
    flat = u.owners * data.d + u.keys
    assert len(np.unique(flat)) == len(flat)          # distinct keys per user
    ids = [int(k) for k in data.key_names]
    assert ids == sorted(ids) and len(set(ids)) == 1682
