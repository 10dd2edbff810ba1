"""Reading ratings (the client / ingest side): ``ReadRatings`` and dead letters.

CSV, JSON Lines or Avro files, local or ``gs://`` (Beam ``FileSystems``),
parsed in chunks straight into NumPy (``transforms/rating_files.py``), validated, normalised into
``[-1, 1]`` and grouped per user into ``UserBatch``es. Users are assigned to
``shards`` by a stable hash of their id and a shard's users are sorted by
id, so a batch's content -- and with it its id and its random stream --
never depends on element order. Invalid rows go to the ``dead_letter``
output with a reason; counters record rows read, accepted and rejected.
Raw values appear in dead letters: this module never runs on the collector.

Grouping a shard's rows needs every row of the input, so on the local
runner (whose GroupByKey holds its input in memory) the rows wait in files
of a scratch directory instead (``spill``, ``transforms/spill.py``): a 5M-row
PCKV-GRR ingest peaked at 1.36 GB through the runner's grouping and at
0.49 GB through the files (PCKV-UE: 1.51 -> 0.93 GB), the same reports bit
for bit.
"""
from __future__ import annotations

import itertools
import json
import math
import zlib
from collections.abc import Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.io import fileio

from kvldp.mechanisms.base import UserBatch
from kvldp.mechanisms.privacy.memo import user_uid
from kvldp.runtime import tally
from kvldp.transforms.coders import ArrowArray, NDArray
from kvldp.transforms.global_combine import CombineAll
from kvldp.transforms.key_names import CreateKeyNames
from kvldp.transforms.rating_files import (
    DEAD_LETTER,
    ParseRatingFileFn,
    RatingChunk,
    RatingsFormat,
    dead_row,
    id_column,
)
from kvldp.transforms.spill import SpilledGroupByKey


def normalise(ratings: np.ndarray, rating_range: tuple[float, float]) -> np.ndarray:
    """Map ``[lo, hi]`` linearly onto ``[-1, 1]`` (a chunk's rows outside it,
    up to 1e308, are mapped too and then rejected: no overflow warning for them)."""
    lo, hi = rating_range
    with np.errstate(over="ignore", invalid="ignore"):
        return 2.0 * (ratings - lo) / (hi - lo) - 1.0


def stable_shard(user: str, shards: int) -> int:
    """Shard of a user id: CRC-32, stable across processes (unlike ``hash``)."""
    return zlib.crc32(user.encode("utf-8")) % shards


def take(column, rows: np.ndarray):
    """``column[rows]`` for a NumPy or an Arrow column (``rows``: indices or a mask)."""
    if isinstance(column, pa.Array):
        rows = np.flatnonzero(rows) if rows.dtype == bool else rows
        return column.take(pa.array(rows, type=pa.int64()))
    return column[rows]


def distinct_users(users: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """``(the distinct user ids, each row's index among them)``, in no
    particular order: one hash pass in Arrow. (``np.unique`` sorted the ids
    as fixed-width strings first: 24 of a 50,000-row chunk's 30 ms.)"""
    encoded = id_column(users).dictionary_encode()
    return encoded.dictionary, encoded.indices.to_numpy(zero_copy_only=False).astype(np.intp)


def sorted_distinct_users(users: pa.Array) -> tuple[pa.Array, np.ndarray]:
    """``distinct_users`` with the ids sorted (by code point: UTF-8's byte
    order, as ``np.unique`` sorts them): a shard's users in id order."""
    distinct, row_user = distinct_users(users)
    order = np.asarray(pc.sort_indices(distinct), dtype=np.intp)
    rank = np.empty(len(order), dtype=np.intp)
    rank[order] = np.arange(len(order))
    return distinct.take(pa.array(order, type=pa.int64())), rank[row_user]


def _utf8_buffers(ids: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """``(offsets, bytes)`` of a string array: id ``i`` is ``bytes[offsets[i]:offsets[i + 1]]``."""
    ids = id_column(ids)
    if ids.offset:
        ids = pa.concat_arrays([ids])          # a slice: its offsets start past 0
    offsets = np.frombuffer(ids.buffers()[1], dtype=np.int32, count=len(ids) + 1)
    data = ids.buffers()[2]
    return offsets, (np.frombuffer(data, dtype=np.uint8) if data is not None else np.zeros(0, np.uint8))


def user_shards(distinct: pa.Array, shards: int) -> np.ndarray:
    """``stable_shard`` of each of ``distinct`` user ids, straight from the
    array's UTF-8 bytes (no ``str`` per id)."""
    offsets, data = _utf8_buffers(distinct)
    view = memoryview(data)
    return np.fromiter((zlib.crc32(view[a:b]) % shards for a, b in itertools.pairwise(offsets.tolist())),
                       dtype=np.int64, count=len(offsets) - 1)


def user_parts(ids: pa.Array, parts: int) -> np.ndarray:
    """A stable partition of user ids by their last four bytes, vectorised:
    where any partition will do (the pre-pass only bounds what one group
    holds), a CRC-32 per id (``user_shards``) was a fifth of its time."""
    offsets, data = _utf8_buffers(ids)
    ends, lengths = offsets[1:].astype(np.int64), np.diff(offsets)
    mixed = np.zeros(len(lengths), dtype=np.uint64)
    for back in range(1, 5):
        byte = np.where(lengths >= back, data[np.maximum(ends - back, 0)] if len(data) else 0, 0)
        mixed = mixed * np.uint64(257) + byte.astype(np.uint64)
    return (mixed % np.uint64(parts)).astype(np.int64)



@beam.typehints.with_output_types(tuple[int, RatingChunk])
class ValidateAndShardFn(beam.DoFn):
    """Vectorised checks (NaN, range, unknown key), normalisation, sharding.

    Emits ``(shard, chunk)`` with keys as dictionary indices and values in
    ``[-1, 1]``; failures go to the dead letter with the reason.
    """

    def __init__(self, rating_range: tuple[float, float], shards: int):
        lo, hi = rating_range
        if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
            raise ValueError(f"rating range must be two finite numbers lo < hi, got {rating_range}")
        self._range, self._shards = (float(lo), float(hi)), int(shards)
        self._rejected = tally.counter("rows_rejected")
        self._index: tuple[Sequence[str], pa.Array] | None = None

    def _keys(self, items: pa.Array, dictionary: Sequence[str]) -> np.ndarray:
        """Each item's index in the dictionary, -1 where it is not in it: an
        Arrow hash lookup, its table built once per dictionary side input
        (per chunk, a dict of d entries was built for every 50,000 rows)."""
        if self._index is None or self._index[0] is not dictionary:
            self._index = (dictionary, pa.array(list(dictionary), type=pa.string()))
        found = pc.index_in(items, value_set=self._index[1])
        return found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)

    def process(self, chunk, dictionary: Sequence[str]):
        users, items = id_column(chunk["users"]), id_column(chunk["items"])
        keys = self._keys(items, dictionary)
        r = chunk["ratings"]
        lo, hi = self._range
        # the last reason that applies wins: NaN over out of range over unknown key
        checks = ((~np.isfinite(r), "value is NaN or infinite"),
                  ((r < lo) | (r > hi), f"value outside the declared rating range [{lo:g}, {hi:g}]"),
                  (keys < 0, "unknown key: item not in the key dictionary"))
        bad = np.zeros(len(r), dtype=bool)
        for failed, _ in checks:
            bad |= failed
        for j in np.flatnonzero(bad):
            self._rejected.inc()
            reason = next(reason for failed, reason in checks if failed[j])
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, dead_row(
                chunk["source"], chunk["lines"][j], reason,
                {"user": users[j].as_py(), "item": items[j].as_py(), "rating": _finite_or_str(r[j])}))
        # hash each distinct user once: a chunk holds many rows per user
        distinct, row_user = distinct_users(users)
        user_shard = user_shards(distinct, self._shards)
        rows = np.flatnonzero(~bad)
        shard = user_shard[row_user[rows]]
        by_shard = np.argsort(shard, kind="stable")        # each shard's rows, in file order
        bounds = np.searchsorted(shard[by_shard], np.arange(self._shards + 1))
        sub = {"lines": chunk["lines"], "users": users, "items": items, "keys": keys,
               "values": normalise(r, self._range)}
        # users with a rejected row travel to their shard too: there, a user none of whose rows
        # survives is counted (it sends no report, so it is not in n)
        touched = np.unique(row_user[bad])
        touched_shard = user_shard[touched]
        for s in np.flatnonzero((np.diff(bounds) > 0) | (np.bincount(touched_shard, minlength=self._shards) > 0)):
            mine = rows[by_shard[bounds[s]:bounds[s + 1]]]
            out = RatingChunk({k: take(v, mine) for k, v in sub.items()}, source=chunk["source"])
            out["rejected_users"] = take(distinct, touched[touched_shard == s])
            yield int(s), out


def _finite_or_str(x: float):
    return float(x) if math.isfinite(x) else str(x)


def split_shard(users: UserBatch, shards: int, max_users: int | None):
    """Shard ``users.batch_id`` (of ``shards``) as batches of at most
    ``max_users`` consecutive users: part ``k`` is batch ``shard + k *
    shards``, so every batch id is distinct and a shard that fits keeps its
    own id (and so its noise and its users' groups)."""
    n = users.n_users
    if not max_users or n <= max_users:
        yield users
        return
    for k, start in enumerate(range(0, n, max_users)):
        yield users.rows(start, min(n, start + max_users), batch_id=users.batch_id + k * shards)


@beam.typehints.with_output_types(UserBatch)
class AssembleUsersFn(beam.DoFn):
    """``(shard, chunks) -> UserBatch`` sorted by user id; a key a user holds
    twice is rejected (every row of it: which one is right is unknowable).
    ``stable_ids``: each user's stable 64-bit id (``memo.user_uid``, a
    BLAKE2b of the id string, ~2 us a user) for what recognises a device
    across collections (the longitudinal mode, the ledger); others go
    without. ``max_users``: a shard of more users comes out as consecutive
    batches of at most that many (``split_shard``), so a batch's reports fit
    the memory budget whatever the report's width (``mechanisms.sizing``)."""

    def __init__(self, stable_ids: bool = True, max_users: int | None = None, shards: int = 1):
        self._stable_ids, self._max_users, self._shards = stable_ids, max_users, shards
        self._accepted = tally.counter("rows_accepted")
        self._rejected = tally.counter("rows_rejected")
        self._users = tally.counter("users_assembled")
        self._lost = tally.counter("users_all_rejected")

    def process(self, element):
        shard, chunks = element
        chunks = list(chunks)
        cat = {k: np.concatenate([c[k] for c in chunks]) for k in ("lines", "keys", "values")}
        users = pa.concat_arrays([id_column(c["users"]) for c in chunks])
        items = pa.concat_arrays([id_column(c["items"]) for c in chunks])
        sources = np.concatenate([np.full(len(c["lines"]), c["source"], dtype=object) for c in chunks])
        names, user_idx = sorted_distinct_users(users)
        d_span = int(cat["keys"].max()) + 1 if len(cat["keys"]) else 1
        flat = user_idx.astype(np.int64) * d_span + cat["keys"]
        order = np.argsort(flat, kind="stable")
        flat_sorted = flat[order]
        dup_sorted = np.zeros(len(flat), dtype=bool)
        same = flat_sorted[1:] == flat_sorted[:-1]
        dup_sorted[1:] |= same
        dup_sorted[:-1] |= same
        dup = np.zeros(len(flat), dtype=bool)
        dup[order] = dup_sorted
        for j in np.flatnonzero(dup):
            self._rejected.inc()
            yield beam.pvalue.TaggedOutput(DEAD_LETTER, dead_row(
                sources[j], cat["lines"][j], "duplicate key for one user",
                {"user": users[j].as_py(), "item": items[j].as_py()}))
        keep = order[~dup_sorted]
        self._accepted.inc(len(keep))
        held_by = user_idx[keep]
        present = np.unique(held_by)
        self._users.inc(len(present))
        rejected = [id_column(c["rejected_users"]) for c in chunks if "rejected_users" in c]
        seen = pc.count_distinct(pa.concat_arrays([names, *rejected])).as_py()
        self._lost.inc(seen - len(present))
        if not len(present):
            return
        sizes = np.bincount(np.searchsorted(present, held_by), minlength=len(present))
        ids = user_uid(take(names, present).to_pylist()) if self._stable_ids else None
        users = UserBatch(np.concatenate([[0], np.cumsum(sizes)]), cat["keys"][keep], cat["values"][keep],
                          batch_id=int(shard), user_ids=ids)
        yield from split_shard(users, self._shards, self._max_users)


class ReadRatings(beam.PTransform):
    """``pattern -> {"users": UserBatch, "dead_letter": dict, "dictionary": [str]}``.

    ``key_dictionary``: the public list of item ids (index = key); ``None``
    derives it from the data (sorted distinct items), which is convenient for
    experiments but tells the collector which items anyone rated.
    ``stable_ids``: give each user its stable id (``AssembleUsersFn``);
    ``max_batch_users``: split a shard into batches of at most this many;
    ``spill``: a directory where the rows wait for their shard's grouping
    (``spill.SpilledGroupByKey``; ``None``: in the runner's GroupByKey).
    """

    def __init__(self, pattern: str, rating_range=(-1.0, 1.0), key_dictionary: Sequence[str] | None = None,
                 ratings_format: RatingsFormat = RatingsFormat(), shards: int = 16, stable_ids: bool = True,  # noqa: B008 (frozen)
                 max_batch_users: int | None = None, spill: str | None = None, label: str | None = None):
        super().__init__(label)
        if shards < 1:
            raise ValueError("shards must be >= 1")
        self._pattern, self._range, self._dictionary = pattern, tuple(rating_range), key_dictionary
        self._parse = ParseRatingFileFn(ratings_format)
        self._shards = shards
        self._validate = ValidateAndShardFn(self._range, shards)
        self._stable_ids, self._max_users, self._spill = stable_ids, max_batch_users, spill

    def expand(self, pbegin):
        parsed = (pbegin
                  | "Match" >> fileio.MatchFiles(self._pattern)
                  | "Open" >> fileio.ReadMatches()
                  | "Parse" >> beam.ParDo(self._parse).with_outputs(DEAD_LETTER, main="rows"))
        # rows: chunk dicts; dictionary: [item ids] (index = key)
        if self._dictionary is not None:
            dictionary = pbegin | "Dictionary" >> CreateKeyNames(self._dictionary)
        else:
            dictionary = (parsed.rows
                          | "Items" >> SortedDistinctItems())
        valid = parsed.rows | "Validate" >> beam.ParDo(
            self._validate, beam.pvalue.AsSingleton(dictionary)).with_outputs(DEAD_LETTER, main="sharded")
        # sharded: (shard, chunk) -> users: UserBatch per shard
        users = (valid.sharded
                 | "GroupShards" >> SpilledGroupByKey(self._spill)
                 | "Assemble" >> beam.ParDo(AssembleUsersFn(self._stable_ids, self._max_users, self._shards))
                 .with_outputs(DEAD_LETTER, main="users"))
        dead = ((parsed[DEAD_LETTER], valid[DEAD_LETTER], users[DEAD_LETTER])
                | "DeadLetters" >> beam.Flatten())
        return {"users": users.users, DEAD_LETTER: dead, "dictionary": dictionary}


def distinct_items(chunk) -> list[str]:
    """The distinct item ids of a chunk."""
    return pc.unique(id_column(chunk["items"])).to_pylist()


class ItemUnionFn(beam.CombineFn):
    """Lists of item ids -> the sorted distinct ids of them all (a set: memory ∝ the distinct items)."""

    def create_accumulator(self) -> set:
        return set()

    def add_input(self, accumulator: set, items) -> set:
        accumulator.update(items)
        return accumulator

    def merge_accumulators(self, accumulators) -> set:
        merged = set()
        for accumulator in accumulators:
            merged |= accumulator
        return merged

    def extract_output(self, accumulator: set) -> list[str]:
        return sorted(accumulator)


class SortedDistinctItems(beam.PTransform):
    """``RatingChunk``s -> one element, the sorted distinct item ids: each
    chunk's made distinct in Arrow, the sets merged by a combiner (Beam's
    ``Distinct`` took one element per distinct item per chunk through a
    grouping: 1.5 M elements for 5 M rows)."""

    def expand(self, chunks):
        return (chunks
                | "ChunkItems" >> beam.Map(distinct_items)
                | "Union" >> CombineAll(ItemUnionFn()))


def _valid_rating_rows(chunk: dict, rating_range) -> RatingChunk:
    """The rows of a parsed chunk whose rating is finite and in range."""
    lo, hi = rating_range
    r = chunk["ratings"]
    ok = np.isfinite(r) & (r >= lo) & (r <= hi)
    return RatingChunk(users=take(id_column(chunk["users"]), ok), items=take(id_column(chunk["items"]), ok))


def _user_counts_by_shard(chunk: dict, shards: int):
    """``(part, (distinct users, their row counts))`` of one chunk (``user_parts``)."""
    users, row_user = distinct_users(chunk["users"])
    counts = np.bincount(row_user, minlength=len(users))
    shard = user_parts(users, shards)
    for s in np.unique(shard):
        m = shard == s
        yield int(s), (take(users, m), counts[m])


def _shard_size_histogram(element) -> np.ndarray:
    """The set sizes of one shard's users: their row counts summed over chunks."""
    _, parts = element
    parts = list(parts)
    users = pa.concat_arrays([id_column(u) for u, _ in parts])
    counts = np.concatenate([c for _, c in parts])
    _, owner = distinct_users(users)
    return np.bincount(np.bincount(owner, weights=counts).astype(np.int64))


class ScanRatings(beam.PTransform):
    """The light pre-pass over ratings files: ``pattern -> {"dictionary":
    [sorted item ids], "sizes": the users' set-size histogram}``.

    Memory grows with the distinct items and users, never with the rows:
    items are made distinct chunk by chunk, and a user's rows are counted
    per chunk and the counts summed per part of the users (``ReadRatings``, which
    assembles every user's pairs, holds every row). The rows counted, and
    whose items make the dictionary, are those with a finite rating in
    range (an item only a rejected row names is not published); a key a user holds twice (which the
    main job rejects) counts twice here, so ``sizes`` can exceed the main
    job's by those rare users. ``spill``: as ``ReadRatings``'s, for the
    grouping of the counts by part."""

    def __init__(self, pattern: str, rating_range=(-1.0, 1.0), ratings_format: RatingsFormat | None = None,
                 shards: int = 16, spill: str | None = None, label: str | None = None):
        super().__init__(label)
        self._pattern, self._range, self._shards, self._spill = pattern, tuple(rating_range), shards, spill
        self._parse = ParseRatingFileFn(ratings_format or RatingsFormat())

    def expand(self, pbegin):
        rows = (pbegin
                | "Match" >> fileio.MatchFiles(self._pattern)
                | "Open" >> fileio.ReadMatches()
                | "Parse" >> beam.ParDo(self._parse).with_outputs(DEAD_LETTER, main="rows"))
        valid = rows.rows | "InRange" >> beam.Map(_valid_rating_rows, self._range).with_output_types(RatingChunk)
        dictionary = (valid
                      | "Items" >> SortedDistinctItems())
        sizes = (valid
                 | "CountRows" >> beam.FlatMap(_user_counts_by_shard, self._shards)
                 .with_output_types(tuple[int, tuple[ArrowArray, NDArray]])
                 | "GroupShards" >> SpilledGroupByKey(self._spill)
                 | "ShardSizes" >> beam.Map(_shard_size_histogram).with_output_types(NDArray)
                 | "SumSizes" >> CombineAll(_sum_histograms))
        return {"dictionary": dictionary, "sizes": sizes}


def _sum_histograms(histograms) -> np.ndarray:
    out = np.zeros(1, dtype=np.int64)
    for h in histograms:
        if len(h) > len(out):
            out = np.pad(out, (0, len(h) - len(out)))
        out[:len(h)] += h
    return out


def write_dead_letters(dead, path: str):
    """Rejected rows (with reasons) as JSON Lines. Client/ingest side only."""
    return (dead
            | "DeadToJson" >> beam.Map(lambda r: json.dumps(r, default=str))
            | "WriteDead" >> beam.io.WriteToText(path, num_shards=1, shard_name_template=""))
