"""What every job shares: the pipeline factory, datasets, user sources, metrics."""
from __future__ import annotations

import argparse
import dataclasses
import functools
import io
import logging
import os
import sys
import tempfile
import uuid
import warnings
from collections.abc import Sequence

import apache_beam as beam
import numpy as np
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import (
    DirectOptions,
    GoogleCloudOptions,
    PipelineOptions,
    StandardOptions,
)
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

from kvldp.datasets import Dataset, SyntheticDataset, load_clothing, load_movielens_100k
from kvldp.mechanisms import registry
from kvldp.mechanisms.base import DEFAULT_BATCH_SIZE
from kvldp.mechanisms.padding import merge_histograms, size_histogram
from kvldp.mechanisms.params import AUTO, whole_or_auto
from kvldp.mechanisms.randomness import fresh_seed
from kvldp.pipelines.flags import add_mechanism_flags, mechanism_flags
from kvldp.transforms.ratings import DEAD_LETTER, ReadRatings

DATASETS = ("synthetic-uu", "synthetic-gg", "synthetic-multi", "synthetic-corr", "clothing", "movielens-100k")


SAFE_RUNNING_MODE = "in_memory"


class _InMemoryWorkersNotice(logging.Filter):
    """Drops Beam's notice that ``in_memory`` with 2 workers has no
    parallelism: its ParallelBundleManager does run the partitions of a stage
    on 2 embedded workers in threads (2 workers measured 1.3x faster than 1,
    DESIGN.md), so the notice would mislead on every job."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("If direct_num_workers is not equal to 1")


logging.getLogger("apache_beam.runners.portability.fn_api_runner.fn_runner").addFilter(_InMemoryWorkersNotice())


def make_pipeline(beam_args: Sequence[str]) -> beam.Pipeline:
    """A pipeline with every Beam option passed through.

    Without ``--runner`` it runs on the in-process FnApiRunner (what
    DirectRunner falls back to) so a local batch job never tries to download
    the Prism binary (DESIGN.md), in ``in_memory`` mode with two workers.
    ``multi_threading`` (this CLI's default before) flushes its data plane
    from a timer thread in the middle of an element, and the runner then
    decodes half an element: a runaway allocation, ``Unknown type tag``, or
    silently lost batches (``shared/repro/beam_timed_flush.py``). A user who
    asks for it gets it, with a warning.
    """
    options = PipelineOptions(list(beam_args))
    if options.view_as(StandardOptions).runner is not None:
        return beam.Pipeline(options=options)
    direct = options.view_as(DirectOptions)
    if not any(a.startswith("--direct_num_workers") for a in beam_args):
        direct.direct_num_workers = min(2, os.cpu_count() or 1)
    if not any(a.startswith("--direct_running_mode") for a in beam_args):
        direct.direct_running_mode = SAFE_RUNNING_MODE
    elif direct.direct_running_mode == "multi_threading":
        warnings.warn("--direct_running_mode multi_threading can corrupt elements in Beam's local runner "
                      "(a timed flush splits an element: runaway memory, 'Unknown type tag' or lost batches); "
                      f"the default, {SAFE_RUNNING_MODE}, is safe", RuntimeWarning, stacklevel=2)
    return beam.Pipeline(runner=FnApiRunner(), options=options)


AUTO_PADDING = AUTO


def parse_padding(text: str):
    """``--padding``: a whole number ``l >= 1`` or ``auto`` (advise's flag)."""
    try:
        l = whole_or_auto(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"padding {err}") from None
    if l != AUTO and l < 1:
        raise argparse.ArgumentTypeError(f"padding length l must be >= 1, got {l}")
    return l


def add_mechanism_args(parser: argparse.ArgumentParser, single: bool = True):
    """``--mechanism``/``--epsilon`` (unless ``single`` is false: a sweep names
    several) and every mechanism's options, generated from their typed
    declarations (``kvldp.pipelines.flags``)."""
    if single:
        parser.add_argument("--mechanism", required=True, choices=registry.names(),
                            help="the registered mechanism (kvldp.mechanisms.registry)")
        parser.add_argument("--epsilon", type=float, required=True, help="total privacy budget per user")
    opts = parser.add_argument_group("mechanism options (each mechanism takes the ones that apply)")
    # a sweep takes --top as its list of top-t sets (and KS's t from the largest)
    add_mechanism_flags(opts, exclude=() if single else ("top",))
    opts.add_argument("--ioh-top", type=int, default=None,
                      help="IOH: use the top-d most frequent keys of the data (default 5; d <= 10)")


def add_dataset_args(parser: argparse.ArgumentParser, default: str | None = "synthetic-uu"):
    parser.add_argument("--dataset", default=default,
                        help=f"one of {', '.join(DATASETS)}, or a ratings file/pattern (CSV, JSONL, Avro)")
    parser.add_argument("--dataset-path", default=None, help="where the clothing .mat file is")
    parser.add_argument("--users", type=int, default=1_000_000, help="synthetic users")
    parser.add_argument("--keys", type=int, default=100, help="synthetic keys d")
    parser.add_argument("--seed", type=int, default=None,
                        help="run seed (simulations/tests); default: fresh from the OS CSPRNG")
    parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE, help="users per batch")
    parser.add_argument("--resample-users", type=int, default=None,
                        help="bootstrap a real dataset's users up to N (labelled in the output)")
    ratings = parser.add_argument_group("ratings files")
    ratings.add_argument("--input-format", choices=("csv", "jsonl", "avro"), default=None)
    ratings.add_argument("--user-col", default="user")
    ratings.add_argument("--item-col", default="item")
    ratings.add_argument("--rating-col", default="rating")
    ratings.add_argument("--rating-range", default="-1,1", help="lo,hi of the ratings (mapped onto [-1, 1])")
    ratings.add_argument("--key-dictionary", default=None,
                         help="file with one item id per line (index = key); default: the items in the data")
    ratings.add_argument("--shards", type=int, default=16, help="user shards (= report batches) for files")


def parse_range(text: str) -> tuple[float, float]:
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise SystemExit(f"--rating-range must be 'lo,hi', got {text!r}") from None
    if not lo < hi:
        raise SystemExit(f"--rating-range needs lo < hi, got {text!r}")
    return lo, hi


def read_dictionary(path: str) -> list[str]:
    with FileSystems.open(path) as fh:
        names = [line.strip() for line in fh.read().decode("utf-8").splitlines() if line.strip()]
    if len(set(names)) != len(names):
        raise SystemExit(f"key dictionary {path} lists a key twice")
    if not names:
        raise SystemExit(f"key dictionary {path} is empty")
    return names


@dataclasses.dataclass
class Seeds:
    data: int
    perturb: int

    @classmethod
    def from_arg(cls, seed: int | None) -> Seeds:
        if seed is None:
            return cls(fresh_seed(), fresh_seed())
        return cls(seed, seed)


def built_in_dataset(args, data_seed: int) -> Dataset | None:
    """The named dataset, or ``None`` when ``--dataset`` is a file pattern."""
    dataset = _named_dataset(args, data_seed)
    n = getattr(args, "resample_users", None)
    if n:
        if not hasattr(dataset, "resampled"):
            raise ValueError("--resample-users applies to real datasets (clothing, movielens-100k)")
        dataset = dataset.resampled(n, data_seed)
    return dataset


def _named_dataset(args, data_seed: int) -> Dataset | None:
    name = args.dataset
    if name in ("synthetic-uu", "synthetic-gg", "synthetic-multi", "synthetic-corr"):
        return SyntheticDataset(name.split("-", 1)[1], n_users=args.users, d=args.keys,
                                seed=data_seed)
    if name == "clothing":
        return load_clothing(args.dataset_path)
    if name == "movielens-100k":
        return load_movielens_100k()
    return None


@dataclasses.dataclass
class UserSource:
    """Users as a PCollection of ``UserBatch``, plus what the job needs about them."""

    users: beam.PCollection
    key_names: beam.PCollection          # a single list of item ids
    dead_letter: beam.PCollection | None
    d: int


def scratch_path(beam_args: Sequence[str], name: str) -> str:
    """A fresh path for an intermediate file both the workers and this
    process can reach: under ``--temp_location`` when given (remote
    runners), else in a local temporary directory."""
    temp = PipelineOptions(list(beam_args)).view_as(GoogleCloudOptions).temp_location
    if temp:
        return FileSystems.join(temp, f"kvldp-{uuid.uuid4().hex}", name)
    return os.path.join(tempfile.mkdtemp(prefix="kvldp-"), name)


def derive_dictionary_and_sizes(args, beam_args) -> tuple[list[str], np.ndarray]:
    """The pre-pass over ratings files: the sorted distinct item ids and the
    users' set-size histogram (``mechanisms.padding``) in one job. The
    histogram costs nothing extra: ``ReadRatings`` assembles the users
    anyway, and with the derived dictionary the main job accepts exactly the
    same rows, so it is the histogram of the users the main job perturbs."""
    out, sizes = scratch_path(beam_args, "keys.txt"), scratch_path(beam_args, "set_sizes.npy")
    p = make_pipeline(beam_args)
    read = p | "ReadRatings" >> ReadRatings(
        args.dataset, parse_range(args.rating_range), None, args.input_format,
        args.user_col, args.item_col, args.rating_col, args.shards)
    (read["dictionary"] | "Join" >> beam.Map("\n".join)
     | "Write" >> beam.io.WriteToText(out, num_shards=1, shard_name_template=""))
    write_size_histogram(read["users"], sizes)
    p.run().wait_until_finish()
    return read_dictionary(out), read_array(sizes)


def write_size_histogram(users: beam.PCollection, path: str, label: str = "SetSizes"):
    """Add a branch writing the set-size histogram of ``users`` to ``path``."""
    return sum_per_batch(users, size_histogram, path, label)


def sum_per_batch(users: beam.PCollection, per_batch, path: str, label: str):
    """Add a branch writing the sum of ``per_batch(UserBatch)`` arrays (of any
    lengths, ``merge_histograms``) to ``path`` as ``.npy``."""
    return (users
            | f"{label}Count" >> beam.Map(per_batch)
            | f"{label}Sum" >> beam.CombineGlobally(merge_histograms)
            | f"{label}Save" >> beam.Map(_save_array, path))


def users_prepass(args, beam_args, dictionary: Sequence[str], per_batch, name: str) -> np.ndarray:
    """One pre-pass job over a ratings file's users (ingest side): the sum of
    ``per_batch(UserBatch)`` over every batch."""
    path = scratch_path(beam_args, f"{name}.npy")
    p = make_pipeline(beam_args)
    sum_per_batch(user_source(p, args, None, dictionary).users, per_batch, path, name)
    p.run().wait_until_finish()
    return read_array(path)


def read_array(path: str) -> np.ndarray:
    with FileSystems.open(path) as fh:
        return np.load(io.BytesIO(fh.read()))


def user_source(p: beam.Pipeline, args, dataset: Dataset | None,
                dictionary: Sequence[str] | None = None) -> UserSource:
    """Generate a built-in dataset's batches on the workers, or read ratings
    (``dictionary``: the key dictionary for ratings files)."""
    if dataset is not None:
        users = (p
                 | "BatchSpecs" >> beam.Create(dataset.specs(args.batch_size))
                 | "SpreadBatches" >> beam.Reshuffle()
                 | "MakeUsers" >> beam.MapTuple(dataset.batch))
        names = p | "KeyNames" >> beam.Create([dataset.key_names])
        return UserSource(users, names, None, dataset.d)
    read = p | "ReadRatings" >> ReadRatings(
        args.dataset, parse_range(args.rating_range), dictionary, args.input_format,
        args.user_col, args.item_col, args.rating_col, args.shards)
    return UserSource(read["users"], read["dictionary"], read[DEAD_LETTER], len(dictionary))


def key_dictionary_and_sizes(args, beam_args) -> tuple[list[str], np.ndarray | None]:
    """The key dictionary of a ratings-file dataset and, when a pre-pass runs
    to derive it, the users' set-size histogram (``None`` with a given
    ``--key-dictionary``: no pass has read the data yet)."""
    if args.key_dictionary:
        return read_dictionary(args.key_dictionary), None
    return derive_dictionary_and_sizes(args, beam_args)


def counters(result) -> dict[str, int]:
    """The ``kvldp`` counters of a finished pipeline."""
    out: dict[str, int] = {}
    try:
        for c in result.metrics().query()["counters"]:
            if c.key.metric.namespace == "kvldp":
                value = c.committed if c.committed is not None else c.attempted
                out[c.key.metric.name] = out.get(c.key.metric.name, 0) + int(value or 0)
    except Exception as err:  # some runners do not report metrics
        print(f"(metrics unavailable: {err})", file=sys.stderr)
    return out


def print_row_summary(stats: dict[str, int], out=None):
    """``rows read = accepted + rejected`` for jobs that read ratings files."""
    out = out or sys.stdout
    if "rows_read" not in stats:
        return
    read, acc, rej = stats.get("rows_read", 0), stats.get("rows_accepted", 0), stats.get("rows_rejected", 0)
    status = "ok" if read == acc + rej else "MISMATCH"
    print(f"rows read {read} = accepted {acc} + rejected {rej} [{status}]", file=out)


# Options that also serve the job when the mechanism does not take them:
# --top sets the accuracy summary's top-t set, --coverage the choice of
# --padding auto. They are passed to a mechanism only if it declares them.
JOB_ROLES = ("top", "coverage")


def mechanism_options(args, ioh_keys: Sequence[int] | None = None, padding: int | None = None):
    """The typed options of ``--mechanism`` from the command line.

    ``ioh_keys``: IOH's chosen keys as dictionary indices (``--ioh-keys``
    names them); ``padding``: the resolved padding length, overriding
    ``--padding`` (``pipelines.padding.resolve_padding`` turns ``auto`` into
    a number on the ingest side; a job that has not resolved ``auto`` gets a
    clear error). Every other option flag the mechanism does not declare is
    an error."""
    declared = set(registry.options_of(args.mechanism))
    given = {name: getattr(args, name, None) for name in mechanism_flags()}
    given["ioh_keys"] = ioh_keys
    if padding is not None:
        given["padding"] = padding
    for name in JOB_ROLES:
        if name not in declared:
            given[name] = None
    if given.get("padding") == AUTO and "padding" in declared:
        raise ValueError("--padding auto is chosen from the raw data by the ingest side (simulate, perturb); "
                         "this job cannot see the data: give l explicitly (collect: the reports' padding)")
    return registry.options(args.mechanism, **given)


def make_mechanism(args, d: int, dataset: Dataset | None = None, ioh_keys: Sequence[int] | None = None,
                   padding: int | None = None):
    """The registered mechanism named by ``--mechanism`` with its typed
    options (the dataset's padding by default)."""
    if padding is None and getattr(args, "padding", None) is None and "padding" in registry.options_of(args.mechanism):
        padding = dataset.default_padding if dataset is not None else 1
    return registry.make(args.mechanism, d, args.epsilon, mechanism_options(args, ioh_keys, padding))


def takes_ioh_keys(args) -> bool:
    return "ioh_keys" in registry.options_of(args.mechanism)


def named_keys(names_text: str, key_names: Sequence[str]) -> list[int]:
    index = {k: i for i, k in enumerate(key_names)}
    wanted = [k.strip() for k in names_text.split(",") if k.strip()]
    unknown = [k for k in wanted if k not in index]
    if unknown:
        raise ValueError(f"IOH keys {unknown} are not in the key dictionary")
    return [index[k] for k in wanted]


def key_frequencies(args, beam_args, dataset: Dataset | None, dictionary) -> np.ndarray:
    """How many users hold each key (ingest side: it sees raw data)."""
    if dataset is not None:
        return merge_histograms(_key_counts(users, dataset.d) for users in dataset.batches(args.batch_size))
    return users_prepass(args, beam_args, dictionary, functools.partial(_key_counts, d=len(dictionary)), "KeyCounts")


def _key_counts(users, d: int) -> np.ndarray:
    return np.bincount(users.keys, minlength=d)


def _save_array(array, path: str):
    buf = io.BytesIO()
    np.save(buf, array)
    with FileSystems.create(path) as fh:
        fh.write(buf.getvalue())


def resolve_ioh_keys(args, beam_args, key_names, dataset: Dataset | None, dictionary) -> list[int] | None:
    """IOH's chosen keys: ``--ioh-keys`` by name, else the ``--ioh-top`` most
    frequent ones; ``None`` for other mechanisms (which reject the flags)."""
    if not takes_ioh_keys(args):
        if args.ioh_keys or args.ioh_top:
            raise ValueError(f"{args.mechanism} does not take --ioh-keys/--ioh-top")
        return None
    if args.ioh_keys:
        return named_keys(args.ioh_keys, key_names)
    top = args.ioh_top or min(5, len(key_names))
    freq = key_frequencies(args, beam_args, dataset, dictionary)
    return [int(k) for k in np.argsort(-freq, kind="stable")[:top]]
