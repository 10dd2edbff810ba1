"""The mechanism on the command line: its flags (generated from the typed options,
``flags.py``), its typed options from the parsed arguments, IOH's chosen keys."""
from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np

from kvldp.datasets import Dataset
from kvldp.mechanisms import registry
from kvldp.mechanisms.params import AUTO
from kvldp.pipelines.flags import add_mechanism_flags, mechanism_flags, option_type
from kvldp.pipelines.sources import key_frequencies

AUTO_PADDING = AUTO


# ``--padding`` for a job that declares it by hand (advise): the generated
# flag's parser, a whole number ``l >= 1`` or ``auto``.
parse_padding = option_type("padding")


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
