"""``kvldp seed``'s flags; the job is ``kvldp.pipelines.run_seed.run_seed_command``."""
from __future__ import annotations


def add_arguments(parser):
    parser.add_argument("path", help="file to create (refused if it exists), readable by its owner only")
