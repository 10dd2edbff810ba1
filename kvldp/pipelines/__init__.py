"""The jobs behind the ``kvldp`` command.

Importing this package sets the C heap up for the in-process local runner
(one glibc arena for all threads, and a batch's temporaries kept in the
heap: ``allocator.py``) -- first, before pyarrow's or Beam's imports start
threads, after which the arena limit could not be set -- and
then imports Beam without its one notice about a base install.

kvldp installs Beam without the gcp extra (``setup.py``), and Beam's
BigQuery shim then logs "apitools not found, and bigquery client libraries
are not available …" through the root logger at import, which also hands
the root logger a stderr handler of its own (``logging.basicConfig``). A
job that touches no BigQuery has nothing to learn from it; while Beam is
imported, a handler of this package takes that one record and passes any
other to where it would have gone.
"""
import logging

from kvldp.pipelines.allocator import set_up_heap

set_up_heap()

BEAM_BASE_INSTALL_NOTICE = "apitools not found, and bigquery client libraries are not available"


class _WithoutBaseInstallNotice(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        if not record.getMessage().startswith(BEAM_BASE_INSTALL_NOTICE):
            for handler in self.others or [logging.lastResort]:
                if handler is not None and record.levelno >= handler.level:
                    handler.handle(record)


def _import_beam() -> None:
    root = logging.getLogger()
    quiet = _WithoutBaseInstallNotice()
    quiet.others, saved = list(root.handlers), list(root.handlers)
    root.handlers = [quiet]
    try:
        import apache_beam  # noqa: F401
    finally:
        root.handlers = saved


_import_beam()
