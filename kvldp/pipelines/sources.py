"""Where a job's users come from: built-in datasets or ratings files, the key
dictionary, the seeds, and the ingest-side pre-passes over the raw data."""
from __future__ import annotations

import collections
import dataclasses
import functools
import re
from collections.abc import Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems

from kvldp.cli.units import path_arg
from kvldp.datasets import Dataset, SyntheticDataset, load_clothing, load_movielens_100k
from kvldp.mechanisms.base import DEFAULT_BATCH_SIZE, UserBatch
from kvldp.mechanisms.frequency.padding import merge_histograms, size_histogram
from kvldp.mechanisms.privacy.randomness import SimulationSeed, fresh_seed
from kvldp.mechanisms.sizing import DEFAULT_MEMORY_BUDGET, batch_size_for
from kvldp.pipelines import outputs, run_seed
from kvldp.runtime.jobs import (
    Progress,
    finish,
    make_pipeline,
    print_row_summary,
    read_array,
    save_array,
    scratch_path,
    spill_directory,
)
from kvldp.transforms.coders import UserBatchCoder  # noqa: F401  (registers the coder)
from kvldp.transforms.global_combine import CombineAll
from kvldp.transforms.key_names import key_names_in
from kvldp.transforms.rating_files import DEAD_LETTER, RatingsFormat
from kvldp.transforms.ratings import ReadRatings, ScanRatings
from kvldp.transforms.rounds import UserRecipes
from kvldp.transforms.spread import SpreadOut

DATASETS = ("synthetic-uu", "synthetic-gg", "synthetic-multi", "synthetic-corr", "clothing", "movielens-100k")


DEFAULT_MAX_REJECT_RATE = 0.05


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """Where a job's users come from: a built-in dataset (``DATASETS``) or a
    ratings file pattern, how ratings files are read, and the run seed.
    Built once from the command line (``from_args``); jobs and the functions
    below take it instead of parsed arguments."""

    dataset: str = "synthetic-uu"
    dataset_path: str | None = None          # where the clothing .mat file is
    users: int = 1_000_000                   # synthetic users
    keys: int = 100                          # synthetic d
    seed: int | None = None                  # None: fresh from the OS CSPRNG
    seed_origin: str | None = dataclasses.field(default=None, compare=False)   # flag, file, env (run_seed)
    batch_size: int | None = None            # None: from memory_budget and the report width (sized_for)
    memory_budget: int = DEFAULT_MEMORY_BUDGET   # bytes one batch's perturbation may take
    resample_users: int | None = None        # bootstrap a real dataset's users up to this many
    input_format: str | None = None          # csv, jsonl, avro; None: from the file name
    user_col: str = "user"
    item_col: str = "item"
    rating_col: str = "rating"
    delimiter: str = ","
    encoding: str = "utf-8"
    header: bool = True                      # the first CSV row names the columns
    column_names: tuple[str, ...] | None = None   # a headerless CSV file's columns
    rating_range: tuple[float, float] = (-1.0, 1.0)
    key_dictionary: str | None = None        # one item id per line; None: derived from the data
    shards: int = 16                         # user shards (= report batches) of ratings files
    fast_rng: bool = False                   # simulations only: non-cryptographic noise (randomness.py)
    dead_letter: str | None = None           # rejected rows; None: dead_letter_path's default
    max_reject_rate: float = DEFAULT_MAX_REJECT_RATE

    def __post_init__(self):
        for name in ("users", "keys", "batch_size", "shards"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(self, name)}")
        if self.resample_users is not None and self.resample_users < 1:
            raise ValueError(f"--resample-users must be >= 1, got {self.resample_users}")
        lo, hi = self.rating_range
        if not lo < hi:
            raise ValueError(f"--rating-range needs lo < hi, got {self.rating_range}")
        object.__setattr__(self, "rating_range", (float(lo), float(hi)))
        _ = self.ratings_format    # checks the file-format flags when the config is built

    @property
    def ratings_format(self) -> RatingsFormat:
        return RatingsFormat(self.input_format, self.user_col, self.item_col, self.rating_col, self.delimiter,
                             self.encoding, self.header, self.column_names)

    def sized_for(self, protocol, d: int, draw_counts: bool = False) -> DataConfig:
        """This config with a concrete ``batch_size``: the one given, else
        the largest whose perturbation fits ``memory_budget`` for this
        protocol's report width (``mechanisms.sizing``; the same for every
        round and invocation, and independent of anyone's data). Ratings
        files are batched by ``--shards``, a shard of more users than this
        in consecutive batches of at most this many (``split_shard``: a UE
        report at Book-Crossing's 340,556 items sets ~12,000 entries, and a
        shard of 6,600 users took 7 GB to perturb). A batch whose counts are
        drawn (``simulate --draw-counts``) makes no report: it holds its
        users and a few count arrays, and takes the default size."""
        if self.batch_size is not None:
            return self
        size = DEFAULT_BATCH_SIZE if draw_counts else batch_size_for(protocol, d, self.memory_budget)
        return dataclasses.replace(self, batch_size=size)

    def rating_scale(self, dataset: Dataset | None) -> tuple[float, float] | None:
        """The ratings' own scale (for means printed and written on it): a
        built-in dataset's, else the ``--rating-range`` the files were read
        with; ``None`` when that is the internal ``[-1, 1]`` anyway."""
        scale = dataset.rating_range if dataset is not None else self.rating_range
        return None if scale is None or tuple(scale) == (-1.0, 1.0) else tuple(map(float, scale))

    @property
    def sized_batch(self) -> int:
        """The batch size of a job that perturbs: set by ``sized_for`` first."""
        if self.batch_size is None:
            raise RuntimeError("the batch size is set from the mechanism (DataConfig.sized_for) before users "
                               "are batched")
        return self.batch_size

    @property
    def histogram_batch(self) -> int:
        """Users per batch of a pre-pass that only counts (no reports)."""
        return self.batch_size or DEFAULT_BATCH_SIZE

    @property
    def is_built_in(self) -> bool:
        return self.dataset in DATASETS

    @classmethod
    def from_args(cls, args, **overrides) -> DataConfig:
        """The dataset flags of ``add_dataset_args``; ``overrides`` that are
        not ``None`` win. A flag left ``None`` takes the field's default."""
        given = {f.name: getattr(args, f.name, None) for f in dataclasses.fields(cls)}
        found = run_seed.resolve(getattr(args, "seed", None), getattr(args, "seed_file", None))
        given.update(seed=found.value, seed_origin=found.origin)
        if given.get("dataset") and given["dataset"] not in DATASETS:
            given["dataset"] = path_arg(given["dataset"])      # a ratings file pattern
        given.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**{k: v for k, v in given.items() if v is not None})

    def dead_letter_path(self, output: str, run: str) -> str:
        """Where this run's rejected rows go. They are raw ratings, so by
        default they stay with the raw data: ``kvldp-rejected/`` in the
        input's directory, named after ``output`` and the run
        (``outputs.run_id``), so no other run truncates them; never under a
        report prefix, which is what is shipped to a collector."""
        if self.dead_letter:
            return self.dead_letter
        name = FileSystems.split(output.rstrip("/"))[1] or "output"
        return FileSystems.join(input_directory(self.dataset), "kvldp-rejected", f"{name}.{run}.rejected.jsonl")

    def claim_dead_letter(self, output: str, run: str, overwrite: bool, dry_run: bool = False) -> str | None:
        """Before any compute: this run's dead-letter file (None for a
        built-in dataset, which rejects nothing), writable, and a named one
        (``--dead-letter``) not an earlier run's unless ``overwrite``."""
        if self.is_built_in:
            return None
        path = self.dead_letter_path(output, run)
        if self.dead_letter:
            outputs.claim(path, "--dead-letter", overwrite, dry_run)
        else:
            outputs.check_writable(path, "--dead-letter")
        return path

    def check_inputs(self) -> None:
        """Before any pipeline: a ratings pattern must match a file, and a
        given key dictionary must exist."""
        if not self.is_built_in:
            files = matched(self.dataset)
            if not files:
                raise FileNotFoundError(f"--input {self.dataset!r} matches no file")
            for path in files:
                self.ratings_format.check_file(path)
        if self.key_dictionary and not FileSystems.exists(self.key_dictionary):
            raise FileNotFoundError(f"--key-dictionary {self.key_dictionary} does not exist")

    def reject_rate_failure(self, stats: dict, dead_letter: str | None) -> str | None:
        """After the run: why it failed when more than ``max_reject_rate`` of
        the rows were rejected (the dead letter is written by then), or when
        a ratings input gave no user at all, else None."""
        read, rejected = stats.get("rows_read", 0), stats.get("rows_rejected", 0)
        if not self.is_built_in and not read:
            return f"--input {self.dataset} holds no rating row: no user was perturbed"
        if not self.is_built_in and read == rejected:
            return (f"every one of the {read} rows of --input {self.dataset} was rejected: no user was perturbed; "
                    f"the reasons are in {dead_letter}")
        if read and rejected / read > self.max_reject_rate:
            return (f"{rejected} of {read} rows rejected ({rejected / read:.1%}), more than --max-reject-rate "
                    f"{self.max_reject_rate:.1%}: the reasons are in {dead_letter}; fix the input (--rating-range, "
                    "--key-dictionary, columns) or raise --max-reject-rate")
        return None

    def account_rows(self, stats: dict, dead_letter: str | None) -> str | None:
        """After the run: print ``rows read = accepted + rejected``, marked
        failed when ``reject_rate_failure`` says why; returns that reason."""
        failure = self.reject_rate_failure(stats, dead_letter)
        print_row_summary(stats, failed=failure is not None)
        return failure

    def read_ratings(self, dictionary: Sequence[str] | None, stable_ids: bool = True,
                     spill: str | None = None) -> ReadRatings:
        """The transform reading this config's ratings files (``stable_ids``,
        ``spill``: see ``ReadRatings``), in batches of at most ``batch_size``
        users once sized."""
        return ReadRatings(self.dataset, self.rating_range, dictionary, self.ratings_format, self.shards,
                           stable_ids, self.batch_size, spill)


class TooManyRejected(ValueError):
    """A job that rejected more of its input than ``--max-reject-rate``."""


def matched(pattern: str) -> list[str]:
    """The files a pattern (local or any Beam filesystem) matches."""
    try:
        return sorted(m.path for m in FileSystems.match([pattern])[0].metadata_list)
    except Exception:          # Beam raises BeamIOError for a pattern under a missing directory
        return []


def matches(pattern: str) -> bool:
    """Whether a file pattern (local or any Beam filesystem) matches a file."""
    return bool(matched(pattern))


def input_directory(pattern: str) -> str:
    """The directory a file pattern's matches live under: the part before
    the first wildcard, up to its last separator (``.`` for a bare name)."""
    fixed = re.split(r"[*?\[]", pattern, maxsplit=1)[0]
    if fixed.endswith("/"):
        return fixed.rstrip("/") or "/"
    return FileSystems.split(fixed)[0] or "."


def read_dictionary(path: str) -> list[str]:
    """A key dictionary: one item id per line (UTF-8), index = key. Ids are
    kept exactly, whitespace included (stripping it made ``"A"`` and ``"A "``
    one key); only the line terminators (``\\n``, ``\\r\\n``) and empty lines go."""
    with FileSystems.open(path) as fh:
        data = fh.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise ValueError(f"key dictionary {path} is not UTF-8 text (byte {data[err.start]:#04x} at offset "
                         f"{err.start}): one item id per line, UTF-8") from None
    names = [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]
    names = [name for name in names if name]
    if len(set(names)) != len(names):
        twice = sorted(name for name, count in collections.Counter(names).items() if count > 1)[:3]
        raise ValueError(f"key dictionary {path} lists a key twice: {', '.join(map(repr, twice))}")
    if not names:
        raise ValueError(f"key dictionary {path} is empty")
    return names


@dataclasses.dataclass
class Seeds:
    """The run's seeds: of the simulated data, and of the noise (a
    ``SimulationSeed`` with ``fast_rng``: PCG64DXSM instead of AES-CTR)."""

    data: int
    perturb: int

    @classmethod
    def from_arg(cls, seed: int | None, fast_rng: bool = False) -> Seeds:
        data, perturb = (fresh_seed(), fresh_seed()) if seed is None else (seed, seed)
        return cls(data, SimulationSeed(perturb) if fast_rng else perturb)

    @classmethod
    def of(cls, data: DataConfig) -> Seeds:
        return cls.from_arg(data.seed, data.fast_rng)


def built_in_dataset(data: DataConfig, data_seed: int) -> Dataset | None:
    """The named dataset, or ``None`` when ``--dataset`` is a file pattern."""
    dataset = _named_dataset(data, data_seed)
    n = data.resample_users
    if n:
        if not hasattr(dataset, "resampled"):
            raise ValueError("--resample-users applies to real datasets (clothing, movielens-100k)")
        dataset = dataset.resampled(n, data_seed)
    return dataset


def _named_dataset(data: DataConfig, data_seed: int) -> Dataset | None:
    name = data.dataset
    if name in ("synthetic-uu", "synthetic-gg", "synthetic-multi", "synthetic-corr"):
        return SyntheticDataset(name.split("-", 1)[1], n_users=data.users, d=data.keys, seed=data_seed)
    if name == "clothing":
        return load_clothing(data.dataset_path)
    if name == "movielens-100k":
        return load_movielens_100k()
    return None


@dataclasses.dataclass
class UserSource:
    """Users as a PCollection of ``UserBatch``, plus what the job needs about
    them; ``recipes``: a generated dataset's users again as batch recipes,
    for the rounds after the first (``transforms.rounds``)."""

    users: beam.PCollection
    key_names: beam.PCollection | Sequence[str]   # item ids in key order (key_names.key_names_in)
    dead_letter: beam.PCollection | None
    d: int
    recipes: UserRecipes | None = None


def derive_dictionary_and_sizes(data: DataConfig, beam_args) -> tuple[list[str], np.ndarray]:
    """The pre-pass over ratings files: the sorted distinct item ids and the
    users' set-size histogram (``mechanisms.padding``) in one light job
    (``ScanRatings``: memory grows with the distinct items and users, not
    with the rows)."""
    out, sizes = scratch_path(beam_args, "keys.txt"), scratch_path(beam_args, "set_sizes.npy")
    p = make_pipeline(beam_args)
    scan = p | "ScanRatings" >> ScanRatings(data.dataset, data.rating_range, data.ratings_format, data.shards,
                                            spill_directory(p))
    (scan["dictionary"] | "Join" >> beam.Map("\n".join)
     | "Write" >> beam.io.WriteToText(out, num_shards=1, shard_name_template=""))
    scan["sizes"] | "SaveSizes" >> beam.Map(save_array, sizes)
    with Progress():
        finish(p.run())
    with FileSystems.open(out) as fh:
        if not fh.read(2).strip(b"\r\n"):         # the joined ids of no item: an empty line
            raise ValueError(f"--input {data.dataset} holds no rating row kvldp can read (empty files, or every "
                             "row rejected: see the dead letter of a run with --max-reject-rate 1)")
    return read_dictionary(out), read_array(sizes)


def write_size_histogram(users: beam.PCollection, path: str, label: str = "SetSizes"):
    """Add a branch writing the set-size histogram of ``users`` to ``path``."""
    return sum_per_batch(users, size_histogram, path, label)


def sum_per_batch(users: beam.PCollection, per_batch, path: str, label: str):
    """Add a branch writing the sum of ``per_batch(UserBatch)`` arrays (of any
    lengths, ``merge_histograms``) to ``path`` as ``.npy``."""
    return (users
            | f"{label}Count" >> beam.Map(per_batch)
            | f"{label}Sum" >> CombineAll(merge_histograms)
            | f"{label}Save" >> beam.Map(save_array, path))


def users_prepass(data: DataConfig, beam_args, dictionary: Sequence[str], per_batch, name: str) -> np.ndarray:
    """One pre-pass job over a ratings file's users (ingest side): the sum of
    ``per_batch(UserBatch)`` over every batch."""
    path = scratch_path(beam_args, f"{name}.npy")
    p = make_pipeline(beam_args)
    sum_per_batch(user_source(p, data, None, dictionary, stable_ids=False).users, per_batch, path, name)
    with Progress():
        finish(p.run())
    return read_array(path)


def user_source(p: beam.Pipeline, data: DataConfig, dataset: Dataset | None,
                dictionary: Sequence[str] | None = None, stable_ids: bool = True) -> UserSource:
    """Generate a built-in dataset's batches on the workers, or read ratings
    (``dictionary``: the key dictionary for ratings files; ``stable_ids``:
    whether the job needs its users' stable ids, ``devices.needs_stable_ids``)."""
    if dataset is not None:
        specs = p | "BatchSpecs" >> SpreadOut(dataset.specs(data.sized_batch))
        users = specs | "MakeUsers" >> beam.MapTuple(dataset.batch).with_output_types(UserBatch)
        names = key_names_in(p, dataset.key_names)
        # a generated dataset pickles as its parameters: its recipes are cheaper than its users
        recipes = UserRecipes(specs, dataset.batch) if dataset.generated else None
        return UserSource(users, names, None, dataset.d, recipes)
    read = p | "ReadRatings" >> data.read_ratings(dictionary, stable_ids, spill_directory(p))
    return UserSource(typed_users(read["users"]), read["dictionary"], read[DEAD_LETTER], len(dictionary))


def typed_users(users):
    """``users`` declared as ``UserBatch``es, so the runner stores them with
    ``UserBatchCoder`` where it keeps them between rounds (10 B instead of
    24 B per single-pair user)."""
    return users | "Users" >> beam.Map(lambda batch: batch).with_output_types(UserBatch)


def key_dictionary_and_sizes(data: DataConfig, beam_args) -> tuple[list[str], np.ndarray | None]:
    """The key dictionary of a ratings-file dataset and, when a pre-pass runs
    to derive it, the users' set-size histogram (``None`` with a given
    ``--key-dictionary``: no pass has read the data yet)."""
    if data.key_dictionary:
        return read_dictionary(data.key_dictionary), None
    return derive_dictionary_and_sizes(data, beam_args)


def key_frequencies(data: DataConfig, beam_args, dataset: Dataset | None, dictionary) -> np.ndarray:
    """How many users hold each key (ingest side: it sees raw data)."""
    if dataset is not None:
        return merge_histograms(_key_counts(users, dataset.d) for users in dataset.batches(data.histogram_batch))
    return users_prepass(data, beam_args, dictionary, functools.partial(_key_counts, d=len(dictionary)), "KeyCounts")


def _key_counts(users, d: int) -> np.ndarray:
    return np.bincount(users.keys, minlength=d)
