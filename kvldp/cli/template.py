"""The Dataflow Flex Templates of ``kvldp collect`` (batch) and ``kvldp
stream`` (streaming), generated from their flags.

``deploy/dataflow/metadata.json`` (collect) and ``stream-metadata.json``
list one template parameter per flag of the job -- its own and every
mechanism's typed options -- with its help text and a validation regex, so
a new mechanism's options reach the templates without editing them.
``python -m kvldp.cli.template [collect|stream]`` prints one; a test
checks the committed files are current. ``template_argv`` turns the
launcher's ``--name=value`` parameters back into CLI flags.
"""
from __future__ import annotations

import argparse
import json
import sys

from kvldp.cli import commands as cli
from kvldp.cli.flags import job_flags, mechanism_flags
from kvldp.cli.units import DURATION_PATTERN, parse_duration, positive_int
from kvldp.mechanisms.kv.longitudinal import LongitudinalOptions
from kvldp.mechanisms.params import floats, whole_or_auto

COMMAND = "collect"
TEMPLATES = {
    "collect": ("metadata.json", "Collector side of a kvldp key-value LDP mechanism: report files -> calibrated "
                "per-key estimates (and, for multi-round protocols, the next round's broadcast)."),
    "stream": ("stream-metadata.json", "Continuous kvldp collector (streaming): report messages from a Pub/Sub "
               "subscription -> calibrated estimates per event-time window and pane, dead letters with reasons."),
}
NUMBER = r"^-?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$"
WHOLE = r"^[0-9]+$"
POSITIVE = r"^0*[1-9][0-9]*$"
NUMBERS = r"^-?[0-9.eE+-]+(,-?[0-9.eE+-]+)*$"


def _regex(action: argparse.Action, option_meta: dict | None) -> str | None:
    if action.choices:
        return "^(" + "|".join(map(str, action.choices)) + ")$"
    parse = (option_meta or {}).get("parse") or action.type
    if parse is whole_or_auto:
        return r"^([0-9]+|auto)$"
    if parse is positive_int:
        return POSITIVE
    if parse is parse_duration:
        return DURATION_PATTERN.replace("\\s*", "")
    if getattr(parse, "pattern", None):
        return parse.pattern
    if parse is int or (option_meta or {}).get("whole"):
        return WHOLE
    if parse is float:
        return NUMBER
    if parse is floats:
        return NUMBERS
    return None


# the stream's Kafka source runs on Flink (deploy/flink): the Dataflow template reads Pub/Sub, which it needs
NOT_ON_DATAFLOW = {"kafka_bootstrap", "kafka_topic", "kafka_group", "expansion_service"}
REQUIRED_ON_DATAFLOW = {"stream": {"subscription"}}


def parameters(command: str = COMMAND) -> list[dict]:
    """One template parameter per flag of ``kvldp COMMAND`` (the Kafka source's
    excepted)."""
    options = {name: flag.meta for name, flag in {**mechanism_flags(), **job_flags(LongitudinalOptions)}.items()}
    sub = cli.subcommand_parser(cli.parser(), command)
    out = []
    for action in sub._actions:
        if not action.option_strings or action.dest == "help" or action.dest in NOT_ON_DATAFLOW:
            continue
        required = action.required or action.dest in REQUIRED_ON_DATAFLOW.get(command, ())
        param = {"name": action.dest, "label": action.dest.replace("_", " ").capitalize(),
                 "helpText": (action.help or action.dest).replace("%%", "%"), "isOptional": not required}
        regex = _regex(action, options.get(action.dest))
        if regex:
            param["regexes"] = [regex]
        out.append(param)
    return out


def metadata(command: str = COMMAND) -> dict:
    out = {"name": f"kvldp {command}", "description": TEMPLATES[command][1]}
    if command == "stream":
        out["streaming"] = True          # Dataflow shows the streaming options and launches a streaming job
    return {**out, "parameters": parameters(command)}


def template_argv(argv, command: str = COMMAND) -> list[str]:
    """``--key_dictionary=x`` (a template parameter) -> ``--key-dictionary=x``;
    Beam's own options (``--temp_location``, …) pass unchanged."""
    sub = cli.subcommand_parser(cli.parser(), command)
    flag_of = {a.dest: next(s for s in a.option_strings if s.startswith("--"))
               for a in sub._actions if any(s.startswith("--") for s in a.option_strings)}
    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        dest = name[2:] if name.startswith("--") else None
        out.append(f"{flag_of[dest]}{eq}{value}" if dest in flag_of else arg)
    return [command, *out]


if __name__ == "__main__":
    json.dump(metadata(sys.argv[1] if len(sys.argv) > 1 else COMMAND), sys.stdout, indent=2)
    sys.stdout.write("\n")
