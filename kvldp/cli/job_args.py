"""Flags several verbs share that are not the dataset's (``data_args.py``)
nor a mechanism's (``mechanism_args.py``): ``--overwrite``,
``--postprocess``, and a multi-round protocol's ``--round``/``--broadcast``
and ``--collection-id``."""
from __future__ import annotations

import argparse

from kvldp.cli.units import path_arg, positive_int
from kvldp.mechanisms.estimation import postprocess as pp
from kvldp.mechanisms.protocol import Collection
from kvldp.pipelines.postprocessing import postprocess_arg

OVERWRITE_HELP = ("replace outputs an earlier run left at the paths given (by default an existing output is "
                  "refused, before any compute)")


def add_overwrite_arg(parser) -> None:
    parser.add_argument("--overwrite", action="store_true", help=OVERWRITE_HELP)


HELP = ("post-processing of the calibrated estimates: auto, or FREQ[+shrink]. auto moves each estimate from "
        "the paper's towards empirical Bayes' by at most c standard errors, c chosen by estimates of the risk "
        "over all keys (SURE) and over the top 50 (never above the paper's); FREQ one of raw (the paper's "
        "estimator, clipped: the mechanism's own output), eb (empirical Bayes), norm-sub, project, base-cut "
        "(Wang et al.'s consistency); +shrink shrinks the means towards the pooled mean by empirical Bayes; "
        "'shrink' alone keeps the paper's frequencies. Every choice but raw writes likelihood-ratio 95 %% "
        "intervals (*_lo, *_hi) that cover each key's truth whatever the post-processing did. Default: "
        f"{pp.DEFAULT.name} (docs/postprocessing.md)")


def add_postprocess_arg(parser):
    parser.add_argument("--postprocess", type=postprocess_arg, default=pp.DEFAULT.name, metavar="auto|FREQ[+shrink]",
                        help=HELP)


def add_round_arguments(parser: argparse.ArgumentParser):
    rounds = parser.add_argument_group("multi-round protocols (privkvm, privkvm-vi, privkvm-plus, ks-grr, ks-adap)")
    rounds.add_argument("--round", type=positive_int, default=1, help="1-based round number")
    rounds.add_argument("--broadcast", default=None, type=path_arg,
                        help="the broadcast file written by the previous round's collect (rounds >= 2)")
    return rounds


def collection_id(text: str) -> str:
    try:
        return Collection(text.lower()).id
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None
