"""The flags of the verbs that read users (``--dataset``/``--input``, the
ratings files' format, the batch size, ``--fast-rng``) and their argparse
types. ``pipelines.sources.DataConfig.from_args`` turns them into a config."""
from __future__ import annotations

import argparse

from kvldp.cli.units import fraction, parse_bytes, path_arg, positive_int
from kvldp.mechanisms.base import DEFAULT_BATCH_SIZE
from kvldp.mechanisms.sizing import DEFAULT_MEMORY_BUDGET
from kvldp.pipelines.sources import DATASETS, DEFAULT_MAX_REJECT_RATE


def add_dataset_args(parser: argparse.ArgumentParser, default: str | None = "synthetic-uu"):
    # one flag, two names, in every verb that reads users: --dataset for a built-in, --input for files
    parser.add_argument("--dataset", "--input", dest="dataset", default=default, metavar="NAME|PATH",
                        help=f"the users: one of {', '.join(DATASETS)}, or a ratings file/pattern (CSV, JSONL, "
                             "Avro); --input and --dataset are the same flag")
    parser.add_argument("--dataset-path", default=None, type=path_arg, help="where the clothing .mat file is")
    parser.add_argument("--users", type=positive_int, default=1_000_000, help="synthetic users")
    parser.add_argument("--keys", type=positive_int, default=100, help="synthetic keys d")
    parser.add_argument("--seed", type=int, default=None,
                        help="run seed (simulations/tests: visible to anyone who sees the command line); "
                             "default: --seed-file, else $KVLDP_SEED, else fresh from the OS CSPRNG")
    parser.add_argument("--seed-file", default=None, type=path_arg,
                        help="file holding the run seed as 32 hex digits (`kvldp seed FILE` writes one): "
                             "a reproducible real run without the seed on the command line")
    add_batch_args(parser)
    parser.add_argument("--resample-users", type=positive_int, default=None,
                        help="bootstrap a real dataset's users up to N (labelled in the output)")
    ratings = parser.add_argument_group("ratings files")
    ratings.add_argument("--input-format", choices=("csv", "jsonl", "avro"), default=None,
                         help="the ratings files' format (default: from the extension, .csv/.jsonl/.avro)")
    ratings.add_argument("--user-col", default="user", help="the column of user ids (default user)")
    ratings.add_argument("--item-col", default="item", help="the column of item ids (default item)")
    ratings.add_argument("--rating-col", default="rating", help="the column of ratings (default rating)")
    ratings.add_argument("--delimiter", type=delimiter_arg, default=",",
                         help="CSV field separator: one character, or tab (default ,)")
    ratings.add_argument("--encoding", default="utf-8",
                         help="text encoding of CSV/JSONL files (default utf-8); a row with bytes it cannot "
                              "decode goes to the dead letter")
    header = ratings.add_mutually_exclusive_group()
    header.add_argument("--has-header", dest="header", action="store_true", default=True,
                        help="the first CSV row names the columns (the default)")
    header.add_argument("--no-header", dest="header", action="store_false",
                        help="the first CSV row is data: columns are named by --column-names, by default "
                             "user,item,rating then their 0-based positions")
    ratings.add_argument("--column-names", type=names_arg, default=None,
                         help="comma-separated names of a headerless CSV file's columns")
    ratings.add_argument("--rating-range", type=parse_range, default=(-1.0, 1.0),
                         help="lo,hi of the ratings (mapped onto [-1, 1]); default -1,1")
    ratings.add_argument("--key-dictionary", default=None, type=path_arg,
                         help="file with one item id per line (index = key); default: the items in the data")
    ratings.add_argument("--shards", type=positive_int, default=16, help="user shards (= report batches) for files")
    ratings.add_argument("--max-reject-rate", type=fraction, default=DEFAULT_MAX_REJECT_RATE,
                         help="the job fails (after writing its dead letter) when more than this share of the "
                              f"rows is rejected (default {DEFAULT_MAX_REJECT_RATE:g}; 1 never fails)")
    ratings.add_argument("--dead-letter", default=None, type=path_arg,
                         help="where rejected rows (raw values, with reasons) go; default "
                              "INPUT_DIR/kvldp-rejected/OUTPUT_NAME.RUNID.rejected.jsonl (one per run; none "
                              "when nothing was rejected), beside the raw data and never beside reports or "
                              "estimates; a named file that exists is refused unless --overwrite")


def add_batch_args(parser: argparse.ArgumentParser):
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help="users per batch (default: as many as --memory-budget allows for the mechanism's "
                             f"report width, at most {DEFAULT_BATCH_SIZE:,})")
    parser.add_argument("--memory-budget", type=parse_bytes, default=DEFAULT_MEMORY_BUDGET,
                        help="memory one batch's perturbation may take, e.g. 512MiB, 2GiB (default 1GiB): "
                             "sets the batch size from the report width (a UE report over many keys is wide)")


def add_fast_rng_arg(parser: argparse.ArgumentParser):
    """``--fast-rng``, for the jobs that only simulate (never ``perturb``/``publish``)."""
    parser.add_argument("--fast-rng", action="store_true",
                        help="simulations only: draw the noise from PCG64DXSM (fast, not cryptographic) "
                             "instead of AES-CTR; the output names the generator")


def delimiter_arg(text: str) -> str:
    """``--delimiter``: one character; ``tab`` or ``\\t`` for a tab."""
    text = {"tab": "\t", "\\t": "\t"}.get(text, text)
    if len(text) != 1:
        raise argparse.ArgumentTypeError(f"must be one character (or tab), got {text!r}")
    return text


def names_arg(text: str) -> tuple[str, ...]:
    """A comma-separated list of column names."""
    names = tuple(n.strip() for n in text.split(","))
    if not all(names):
        raise argparse.ArgumentTypeError(f"an empty column name in {text!r}")
    return names


def parse_range(text: str) -> tuple[float, float]:
    """``--rating-range``: ``"lo,hi"`` with ``lo < hi``."""
    try:
        lo, hi = (float(x) for x in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be 'lo,hi', got {text!r}") from None
    if not lo < hi:
        raise argparse.ArgumentTypeError(f"needs lo < hi, got {text!r}")
    return lo, hi
