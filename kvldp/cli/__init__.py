"""The ``kvldp`` command line: its verbs (``commands.py`` registers them,
each verb's flags in ``<verb>.py``: ``simulate.py``, ``perturb.py``, …), the
flags they share (``units.py``, ``flags.py``, ``mechanism_args.py``,
``data_args.py``, ``job_args.py``) and the Dataflow templates made from
them (``template.py``). A verb parses its flags into its job's typed config
and makes one call into ``kvldp.pipelines``; what the process prints is the
runtime's (``kvldp.runtime.console``, ``failures``)."""
