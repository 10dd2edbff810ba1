"""Beam's own parser of pipeline options, to refuse a flag nobody knows.

Beam only logs "Discarding unparseable args" for a flag it does not know
and runs with the option missing (``--paddng 3`` ran with l = 1), so the
CLI checks every flag it leaves to Beam first (``cli/flags.py``).
Beam exposes no parser: ``PipelineOptions`` builds one from the private
``_BeamArgumentParser`` and each options class's ``_add_argparse_args``,
which is what ``parser`` does too. A Beam without that class gets the
public answer instead (``get_all_options(retain_unknown_options=True)``
against the known option names): coarser -- a stray word is not caught --
but never wrong about a flag Beam knows.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib

from apache_beam.options import pipeline_options
from apache_beam.options.pipeline_options import PipelineOptions

# Modules outside pipeline_options that define options of their runners: a
# runner imports its module only when it is built, after this check.
RUNNER_OPTION_MODULES = ("apache_beam.runners.render", "apache_beam.yaml.options",
                         "apache_beam.runners.dask.dask_runner")


def _import_runner_options() -> None:
    for module in RUNNER_OPTION_MODULES:
        with contextlib.suppress(ImportError):      # an optional runner that is not installed
            importlib.import_module(module)


def parser() -> argparse.ArgumentParser | None:
    """Beam's parser of every pipeline option, built as ``PipelineOptions``
    builds it (None on a Beam without its private parser class)."""
    parser_class = getattr(pipeline_options, "_BeamArgumentParser", None)
    if parser_class is None:
        return None
    _import_runner_options()
    parser = parser_class(allow_abbrev=False)
    subset = {}
    for cls in PipelineOptions.__subclasses__():
        subset.setdefault(str(cls), cls)
    for cls in subset.values():
        cls._add_argparse_args(parser)  # what PipelineOptions.get_all_options does
    return parser


def flags() -> list[str]:
    """Every ``--flag`` Beam knows."""
    beam = parser()
    if beam is not None:
        return [s for action in beam._actions for s in action.option_strings if s.startswith("--")]
    _import_runner_options()
    return [f"--{name}" for name in PipelineOptions([]).get_all_options()]


def unknown(args) -> list[str]:
    """The arguments of ``args`` Beam does not know, in order."""
    beam = parser()
    if beam is not None:
        return beam.parse_known_args(list(args))[1]
    _import_runner_options()
    known = set(PipelineOptions([]).get_all_options())
    found = PipelineOptions(list(args)).get_all_options(retain_unknown_options=True)
    return [f"--{name.split('=', 1)[0]}" for name in found if name not in known]
