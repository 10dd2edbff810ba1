"""Command-line flags generated from the mechanisms' typed options, and the
check that every flag is known to kvldp or to Beam.

``mechanism_flags`` walks the registry: each options field becomes one
``--flag`` (``params.flag_name``), its help the field's documentation, its
range, and the mechanisms that take it with their defaults. A field several
mechanisms declare must mean one thing: the same declaration
(help, parser, range), or generating the flags fails.
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib

from kvldp.mechanisms import registry
from kvldp.mechanisms.params import AUTO, check_value, describe, flag_name, range_text
from kvldp.runtime import beam_flags


@dataclasses.dataclass
class Flag:
    name: str                 # the options field (= argparse dest)
    meta: dict
    takers: list              # [(mechanism, default)]

    @property
    def help(self) -> str:
        rng = range_text(self.meta)
        takers = "; ".join(f"{m} (default {d!r})" if d is not None else m for m, d in self.takers)
        return f"{self.meta['help']}{f' (allowed: {rng})' if rng else ''}. Taken by: {takers}"


def _same(a: dict, b: dict) -> bool:
    keys = ("help", "low", "high", "low_open", "high_open", "choices", "whole", "short", "parse")
    return all(a.get(k) == b.get(k) for k in keys)


def mechanism_flags() -> dict[str, Flag]:
    """Every option field of every registered mechanism, by field name."""
    out: dict[str, Flag] = {}
    for name in registry.names():
        for f in dataclasses.fields(registry.options_type(name)):
            meta = describe(f)
            flag = out.setdefault(f.name, Flag(f.name, meta, []))
            if not _same(flag.meta, meta):
                raise ValueError(f"{flag_name(f.name)} is declared differently by {name} and by "
                                 f"{flag.takers[0][0]}: one option name must mean one thing")
            flag.takers.append((name, f.default))
    return out


def option_type(name: str):
    """The argparse ``type`` of option ``name``: parse, then check against
    its declaration (a job that declares the flag by hand, as advise does
    ``--padding``, reuses it)."""
    return _argparse_type(mechanism_flags()[name])


def _argparse_type(flag: Flag):
    parse = flag.meta.get("parse") or str

    def convert(text):
        """Parse and check against the declaration now, before any job starts."""
        try:
            value = parse(text)
        except ValueError as err:
            raise argparse.ArgumentTypeError(f"{flag_name(flag.name)} {err}") from None
        try:
            for v in value if isinstance(value, tuple) else [value]:
                if v != AUTO:
                    check_value(flag.name, v, flag.meta)
        except ValueError as err:
            raise argparse.ArgumentTypeError(str(err)) from None
        return value
    convert.__name__ = flag.name
    return convert


def add_mechanism_flags(group, exclude=()) -> list[str]:
    """Add one flag per option field (default ``None``: the mechanism's own)."""
    added = []
    for flag in mechanism_flags().values():
        if flag.name in exclude:
            continue
        names = [flag_name(flag.name)] + ([flag.meta["short"]] if flag.meta.get("short") else [])
        kwargs = {"type": _argparse_type(flag), "default": None, "help": flag.help, "dest": flag.name}
        if flag.meta.get("choices"):
            kwargs["choices"] = flag.meta["choices"]
        if flag.meta.get("metavar"):
            kwargs["metavar"] = flag.meta["metavar"]
        group.add_argument(*names, **kwargs)
        added.append(flag.name)
    return added


def job_flags(options_type) -> dict[str, Flag]:
    """The flags of a job-level options class (``longitudinal.LongitudinalOptions``):
    one per field, as for the mechanisms' options."""
    return {f.name: Flag(f.name, describe(f), []) for f in dataclasses.fields(options_type)}


def add_job_flags(group, options_type) -> list[str]:
    """Add one flag per field of ``options_type`` (default ``None``: the
    class's own). A boolean field is a switch that also takes a value
    (``--longitudinal`` or ``--longitudinal=true``, as a template launcher
    passes it)."""
    added = []
    for f in dataclasses.fields(options_type):
        flag = Flag(f.name, describe(f), [])
        rng = range_text(flag.meta)
        kwargs = {"type": _argparse_type(flag), "default": None, "dest": f.name,
                  "help": f"{flag.meta['help']}{f' (allowed: {rng})' if rng else ''}"}
        if isinstance(f.default, bool):
            kwargs.update(nargs="?", const=True, metavar="true|false")
        elif flag.meta.get("choices"):
            kwargs["choices"] = flag.meta["choices"]
        group.add_argument(flag_name(f.name), **kwargs)
        added.append(f.name)
    return added


def option_strings(parser: argparse.ArgumentParser) -> list[str]:
    return [s for action in parser._actions for s in action.option_strings if s.startswith("--")]


def portable_runner_flags(beam_args) -> set[str]:
    """The flags the job server of a portable job describes (its runner's
    options, which Beam's Python SDK learns only from it), else none."""
    which = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    which.add_argument("--runner", default="")
    which.add_argument("--job_endpoint", default=None)
    found = which.parse_known_args(list(beam_args))[0]
    runner, endpoint = found.runner.rsplit(".", 1)[-1], found.job_endpoint
    if runner not in ("PortableRunner", "FlinkRunner") or not endpoint or endpoint == "embed":
        return set()
    from kvldp.runtime import portable
    try:
        return portable.job_server_flags(endpoint)
    except portable.UnsupportedRunner:
        return set()           # the runner check says what is wrong with the endpoint


def check_beam_args(beam_args, ours: argparse.ArgumentParser) -> None:
    """Refuse anything in ``beam_args`` (what kvldp's parser left over) that
    Beam does not know either: Beam would only log "Unparseable argument"
    and run with the option silently missing (``--paddng 3`` ran with l = 1)."""
    unknown = beam_flags.unknown(beam_args)
    if unknown:
        runner_flags = portable_runner_flags(beam_args)
        unknown = [a for a in unknown if a.split("=", 1)[0] not in runner_flags]
    if not unknown:
        return
    arg = unknown[0]
    name = arg.split("=", 1)[0]
    if not name.startswith("-"):
        raise ValueError(f"unrecognized argument {arg!r}")
    known = option_strings(ours) + beam_flags.flags()
    close = difflib.get_close_matches(name, known, n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    raise ValueError(f"unrecognized argument {name}{hint}; run with --help for kvldp's flags, any other --flag "
                     "must be a Beam pipeline option")
