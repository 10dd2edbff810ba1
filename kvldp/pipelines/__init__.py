"""The jobs behind the ``kvldp`` command.

Importing this package changes nothing of Beam's or of the process: the
command's start (``kvldp.runtime.start``) sets the process up for a local
job, and the local runner's tuning lives in ``kvldp.runtime``."""
