"""A grouping whose values wait on disk (``transforms/spill.py``): the same
groups as Beam's GroupByKey, ratings read through it give the same users,
and it is what the local runner's ingest uses."""
from __future__ import annotations

import json
import pickle
from pathlib import Path

import apache_beam as beam
import numpy as np
import pytest

from kvldp.mechanisms.base import UserBatch
from kvldp.runtime import jobs as runner
from kvldp.runtime import tally
from kvldp.runtime.jobs import make_pipeline, scratch_scope, spill_directory
from kvldp.transforms.rating_files import DEAD_LETTER
from kvldp.transforms.ratings import ReadRatings, ScanRatings
from kvldp.transforms.spill import SPILLED_BYTES, SPILLED_FILES, SpilledGroupByKey, SpilledValues


def _run_grouping(tmp_path, directory, elements):
    out = tmp_path / f"groups-{directory is not None}.pkl"
    p = make_pipeline([])
    (p | beam.Create(elements).with_output_types(beam.typehints.KV[int, np.ndarray])
     | SpilledGroupByKey(None if directory is None else str(directory))
     | beam.Map(lambda kv: (kv[0], sorted(v.tobytes() for v in kv[1])))
     | beam.combiners.ToList()
     | beam.Map(lambda groups, path=str(out): Path(path).write_bytes(pickle.dumps(sorted(groups)))))
    result = p.run()
    result.wait_until_finish()
    return pickle.loads(out.read_bytes()), result


def test_spilled_groups_are_the_groups_of_a_group_by_key(tmp_path):
    rng = np.random.default_rng(3)
    elements = [(int(k), rng.integers(0, 1000, rng.integers(1, 50))) for k in rng.integers(0, 7, 60)]
    spilled, result = _run_grouping(tmp_path, tmp_path / "spill", elements)
    plain, _ = _run_grouping(tmp_path, None, elements)
    assert spilled == plain and len(spilled) == len({k for k, _ in elements})
    # one file a value, each holding that value's encoding
    assert len(list((tmp_path / "spill").iterdir())) == len(elements)
    counted = {r.key.metric.name: r.committed for r in result.metrics().query()["counters"]}
    assert counted[SPILLED_FILES] == len(elements)


def test_spilled_values_are_read_each_time_they_are_walked_and_pickle_as_paths(tmp_path):
    coder = beam.coders.registry.get_coder(np.ndarray)
    paths = []
    for i in range(3):
        path = tmp_path / f"{i}.bin"
        path.write_bytes(coder.encode(np.arange(i + 1)))
        paths.append(str(path))
    values = SpilledValues(paths, coder)
    assert [v.tolist() for v in values] == [[0], [0, 1], [0, 1, 2]] == [v.tolist() for v in values]
    assert len(values) == 3 and len(pickle.dumps(values)) < 1000


def _csv(tmp_path) -> Path:
    rng = np.random.default_rng(8)
    rows = [f"u{u},i{k},{1 + (u * k) % 5}" for u in range(400) for k in rng.choice(12, 1 + u % 5, replace=False)]
    rows += ["x1,i1,3", "x1,i1,4",          # a key held twice: both rows rejected
             "u5,i2,9", "u6,zz,3", "u7,i3,nan", "u8,i4"]
    path = tmp_path / "r.csv"
    path.write_text("user,item,rating\n" + "\n".join(rows) + "\n")
    return path


def _read(tmp_path, path, spill, dictionary):
    name = "spilled" if spill else "plain"
    users_out, dead_out = tmp_path / f"{name}-users.pkl", tmp_path / f"{name}-dead.json"
    p = make_pipeline([])
    read = p | ReadRatings(str(path), (1.0, 5.0), dictionary, shards=4, max_batch_users=30,
                           spill=str(tmp_path / name) if spill else None)
    (read["users"] | "Users" >> beam.combiners.ToList()
     | "KeepUsers" >> beam.Map(lambda b, out=str(users_out): Path(out).write_bytes(pickle.dumps(b))))
    (read[DEAD_LETTER] | "Dead" >> beam.combiners.ToList()
     | "KeepDead" >> beam.Map(lambda d, out=str(dead_out): Path(out).write_text(json.dumps(d, default=str))))
    result = p.run()
    result.wait_until_finish()
    batches = sorted(pickle.loads(users_out.read_bytes()), key=lambda b: b.batch_id)
    dead = sorted(json.dumps(d, sort_keys=True) for d in json.loads(dead_out.read_text()))
    return batches, dead, {r.key.metric.name: r.committed for r in result.metrics().query()["counters"]}


@pytest.mark.parametrize("dictionary", [None, [f"i{k}" for k in range(12)]])
def test_ratings_read_through_spilled_shards_are_the_same_users(tmp_path, dictionary):
    path = _csv(tmp_path)
    spilled, spilled_dead, counts = _read(tmp_path, path, True, dictionary)
    plain, plain_dead, plain_counts = _read(tmp_path, path, False, dictionary)
    assert [b.batch_id for b in spilled] == [b.batch_id for b in plain] and len(spilled) > 4
    for a, b in zip(spilled, plain, strict=True):
        assert isinstance(a, UserBatch)
        for field in ("offsets", "keys", "values", "user_ids"):
            assert np.array_equal(getattr(a, field), getattr(b, field)), field
    assert spilled_dead == plain_dead and len(spilled_dead) == 5 + (dictionary is not None)
    spill_counts = {name: counts.pop(name) for name in (SPILLED_FILES, SPILLED_BYTES)}
    assert counts == plain_counts and counts["rows_read"] == 1206 and counts["users_assembled"] == 400
    assert spill_counts[SPILLED_FILES] > 0 and spill_counts[SPILLED_BYTES] > 1206 * 8


def test_the_light_pre_pass_counts_the_same_through_spilled_shards(tmp_path):
    path = _csv(tmp_path)
    seen = {}
    for spill in (str(tmp_path / "spill"), None):
        out = tmp_path / f"scan-{spill is not None}.pkl"
        p = make_pipeline([])
        scan = p | ScanRatings(str(path), (1.0, 5.0), shards=4, spill=spill)
        ((scan["dictionary"], scan["sizes"]) | beam.Flatten() | beam.combiners.ToList()
         | beam.Map(lambda found, o=str(out): Path(o).write_bytes(pickle.dumps(found))))
        p.run().wait_until_finish()
        dictionary, sizes = sorted(pickle.loads(out.read_bytes()), key=lambda v: isinstance(v, np.ndarray))
        seen[spill is not None] = (dictionary, sizes.tolist())
    assert seen[True] == seen[False] and seen[True][0] == sorted([f"i{k}" for k in range(12)] + ["zz"])
    assert sum(seen[True][1]) == 401           # every user with a row in range (x1 counts here)


def test_the_local_runner_spills_in_a_scratch_directory_and_no_other_runner_does(tmp_path):
    with scratch_scope():
        directory = spill_directory(make_pipeline([]))
        assert directory is not None and Path(directory).parent.is_dir()
        Path(directory).mkdir()
        (Path(directory) / "x.bin").write_bytes(b"raw rows")
        assert spill_directory(beam.Pipeline(runner="DirectRunner")) is None
        assert spill_directory(make_pipeline(["--runner", "PortableRunner"])) is None
    assert not Path(directory).exists() and not Path(directory).parent.exists()


def test_the_ingest_counts_its_spilled_files(tmp_path, capsys, monkeypatch):
    """``perturb`` on the local runner reads a ratings file through spilled
    shards, and its scratch directory is gone when it ends. (Its temporary
    directory is the test's own: in the shared one, another xdist worker's
    job made ``kvldp-*`` directories meanwhile, and CI failed on them.)"""
    from kvldp.cli import commands as cli

    path = _csv(tmp_path)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(runner.tempfile, "tempdir", str(scratch))
    before = set(scratch.glob("kvldp-*"))
    before_files = tally.tally(tally.PROCESS).get(SPILLED_FILES, 0)
    cli.main(["perturb", "--mechanism", "pckv-grr", "--epsilon", "2", "--input", str(path),
              "--rating-range", "1,5", "--seed", "3", "--output", str(tmp_path / "out" / "R.avro")])
    assert tally.tally(tally.PROCESS).get(SPILLED_FILES, 0) > before_files
    assert "rows read 1206 = accepted 1201 + rejected 5 [ok]" in capsys.readouterr().out.replace(",", "")
    assert set(scratch.glob("kvldp-*")) <= before


def test_a_spill_that_cannot_be_written_names_the_directory_and_what_to_do(tmp_path):
    """A full or unwritable TMPDIR fails the job with the directory and the fix, not a bare OSError."""
    from kvldp.transforms.context import ElementError
    from kvldp.transforms.spill import SpillFn

    blocked = tmp_path / "file-not-a-directory"
    blocked.write_text("")
    fn = SpillFn(str(blocked / "spill"), beam.coders.registry.get_coder(np.ndarray))
    with pytest.raises(ElementError, match=r"spilling a group's value to .*file-not-a-directory.*set TMPDIR"):
        list(fn.process((1, np.arange(3))))
