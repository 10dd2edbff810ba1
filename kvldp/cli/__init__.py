"""The ``kvldp`` command line: its verbs (``commands.py``), the flags they
share (``units.py``, ``flags.py``, ``mechanism_args.py``), and what the
process prints (``console.py``, ``failures.py``). A verb parses its flags
into its job's typed config and makes one call into ``kvldp.pipelines``."""
