"""``kvldp query``'s flags; the job is ``kvldp.pipelines.query``."""
from __future__ import annotations

import argparse

from kvldp.cli.units import path_arg


def add_arguments(parser: argparse.ArgumentParser):
    parser.add_argument("--counts", required=True, type=path_arg,
                        help="IOH counts file (OUTPUT.counts.avro of simulate/collect)")
    parser.add_argument("--target", required=True, help="the key asked about")
    parser.add_argument("--given", default="", help="conditions KEY=1 (holds) / KEY=0 (does not), comma-separated")
    parser.add_argument("--alpha", default=None, help="(alpha, beta) form: which keys are conditions, e.g. 101")
    parser.add_argument("--beta", default=None, help="(alpha, beta) form: held (1) or not (0), e.g. 001")
