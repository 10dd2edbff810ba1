"""What a kvldp process prints of Beam's logs and its own notes, set up
once by the command (``cli.main``) and by each worker process of a sweep
(``sweep``): Beam's warnings, without the two that mislead an operator,
and kvldp's notes (``kvldp.*``, INFO) on stderr."""
from __future__ import annotations

import logging
import sys

from kvldp.runtime import failures
from kvldp.runtime import jobs as runner


def _not_a_sink_replacing_its_target(record: logging.LogRecord) -> bool:
    # kvldp refuses an existing output unless --overwrite, and then says itself what it replaced
    return not str(record.msg).startswith("Deleting %d existing files in target path")


def set_up_logging() -> None:
    logging.getLogger("apache_beam").setLevel(logging.WARNING)
    logging.getLogger(runner.InMemoryWorkersNotice.LOGGER).addFilter(runner.InMemoryWorkersNotice())
    logging.getLogger("apache_beam.io.filebasedsink").addFilter(_not_a_sink_replacing_its_target)
    failures.quiet_worker_tracebacks()
    ours = logging.getLogger("kvldp")
    if not ours.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        ours.addHandler(handler)
        ours.setLevel(logging.INFO)
        ours.propagate = False
