"""The one room for engineering under kvldp's jobs: the local runner, the
process it runs in, and running a job on any runner.

Everything here that touches Beam beyond its public API is a *tweak*
(``tweaks.py``: what each replaces, what it was measured to save, the Beam
releases it was tested on), applied only around a job on kvldp's own
in-process runner on a tested Beam, and never with ``KVLDP_STOCK_BEAM=1``.
Importing any of these modules changes nothing.

* ``tweaks.py`` -- the gate: which tweaks apply here, and ``Swap``, the one
  way an attribute of Beam's is replaced for the length of a job;
* ``local_runner.py`` -- ``LocalRunner`` (Beam's in-process FnApiRunner) and
  the tweaks around a local job (``tuned``, ``make_runner``);
* ``options.py`` -- ``JobOptions``, pipeline options whose views are kept;
* ``bundle_setup.py``, ``pickles.py``, ``argspecs.py``, ``dofn_specs.py``,
  ``yield_check.py`` -- one tweak each;
* ``process.py`` and ``start.py`` -- the C heap and the garbage collector,
  set up by the ``kvldp`` command's start for a local job;
* running a job on any runner: ``jobs.py`` (the pipeline factory, scratch
  paths, progress), ``tally.py`` (in-process counters), ``portable.py``
  (Flink's job-server pairs), ``extras.py`` (what needs an optional
  extra), ``console.py`` and ``failures.py`` (what the process prints).

Importing this package imports neither Beam nor pyarrow (``start.py``
needs the heap set up before they start threads).
"""
