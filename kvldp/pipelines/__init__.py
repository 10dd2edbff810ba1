"""The jobs behind the ``kvldp`` command: each verb's typed config and the
Beam graph it runs (``graphs.py`` for the shared ones), with where a job's
users come from (``sources.py``), what it writes (``outputs.py``,
``manifest.py``) and the perturbing side's devices (``devices.py``). The
command line itself is ``kvldp.cli``.

Importing this package changes nothing of Beam's or of the process: the
command's start (``kvldp.runtime.start``) sets the process up for a local
job, and the local runner's tuning lives in ``kvldp.runtime``."""
