"""The ``kvldp`` command's start: the process set up for a local job, then the command.

This is the console script's entry point (``setup.py``) and ``python -m
kvldp``'s. It imports neither Beam nor pyarrow before it has set up the
process, because glibc fixes its arena limit the first time a second
thread allocates and their imports start threads (``process.py``). What it
sets up is process-wide, so it happens only here, in the command's own
process, and only for a job on the in-process runner: a command line that
names a ``--runner`` or streams gets the process as Python leaves it, and
so does every worker of a remote runner (they never run this module) and
every program that imports kvldp.
"""
from __future__ import annotations

import logging
import sys
import warnings

# Beam's BigQuery shim logs this through the root logger when Beam is
# installed without its gcp extra (setup.py's base install), at every import.
BEAM_BASE_INSTALL_NOTICE = "apitools not found, and bigquery client libraries are not available"


def _without_base_install_notice(record: logging.LogRecord) -> bool:
    return not record.getMessage().startswith(BEAM_BASE_INSTALL_NOTICE)


def main(argv: list[str] | None = None) -> int:
    from kvldp.runtime import process, tweaks  # neither imports Beam

    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        chosen = tweaks.active() if tweaks.runs_locally(argv) else frozenset()
    except ValueError as err:           # a KVLDP_BEAM_TWEAKS naming no tweak
        print(f"kvldp: error: {err}", file=sys.stderr)
        return 2
    process.set_up(chosen)
    logging.getLogger().addFilter(_without_base_install_notice)
    # Google's client libraries warn at import about the Python and grpcio they run on (Beam 2.62's
    # grpcio < 1.66, the floor of kvldp's range): notes for their maintainers, not for an operator's job
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"google\.")
    with process.private_tempdir():
        from kvldp.cli import commands as cli
        process.settle(chosen)
        return cli.main(argv)
