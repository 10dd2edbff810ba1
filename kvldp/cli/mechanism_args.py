"""The mechanism on the command line: its flags (generated from the typed
options, ``flags.py``), from which a job builds its
``kvldp.pipelines.mechanism_config.MechanismConfig``."""
from __future__ import annotations

import argparse

from kvldp.cli.flags import add_job_flags, add_mechanism_flags, option_type
from kvldp.mechanisms import registry
from kvldp.mechanisms.kv.longitudinal import LongitudinalOptions

# ``--padding`` for a job that declares it by hand (advise): the generated
# flag's parser, a whole number ``l >= 1`` or ``auto``.
parse_padding = option_type("padding")


def add_mechanism_args(parser: argparse.ArgumentParser, single: bool = True, epsilon: float | None = None,
                       mechanism: str | None = None):
    """``--mechanism``/``--epsilon`` (unless ``single`` is false: a sweep names
    several; ``epsilon``/``mechanism``: defaults, else the flags are required)
    and every mechanism's options, generated from their typed declarations
    (``kvldp.cli.flags``)."""
    if single:
        parser.add_argument("--mechanism", required=mechanism is None, default=mechanism, choices=registry.names(),
                            help="the registered mechanism (kvldp.mechanisms.registry)"
                                 + (f" (default {mechanism})" if mechanism else ""))
        parser.add_argument("--epsilon", type=float, required=epsilon is None, default=epsilon,
                            help="total privacy budget per user"
                                 + (f" (default {epsilon:g})" if epsilon is not None else ""))
    opts = parser.add_argument_group("mechanism options (each mechanism takes the ones that apply)")
    # a sweep takes --top as its list of top-t sets (and KS's t from the largest)
    add_mechanism_flags(opts, exclude=() if single else ("top",))
    opts.add_argument("--ioh-top", type=int, default=None,
                      help="IOH: use the top-d most frequent keys of the data (default 5; d <= 10)")


def add_longitudinal_args(parser: argparse.ArgumentParser):
    """``--longitudinal --eps-inf A --eps-1 B --second-layer …``, generated
    from ``longitudinal.LongitudinalOptions``."""
    group = parser.add_argument_group(
        "longitudinal mode (repeated collections; mechanisms/kv/longitudinal.py)",
        "An unchanged state sends the same memoised permanent report (eps_inf) in every collection; --eps-1 "
        "adds an instantaneous layer per report. --epsilon is eps_inf. The device secrets derive from the run "
        "seed: give the same --seed-file (or $KVLDP_SEED) to every collection.")
    add_job_flags(group, LongitudinalOptions)
