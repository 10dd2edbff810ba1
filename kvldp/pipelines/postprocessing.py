"""``--postprocess``: which post-processing the collector applies to the
calibrated estimates before writing them (``kvldp.mechanisms.estimation.postprocess``)."""
from __future__ import annotations

import argparse

from kvldp.mechanisms.estimation import postprocess as pp

PATTERN = r"^(auto|(raw|eb|norm-sub|project|base-cut)(\+shrink)?|shrink)$"


def postprocess_arg(text: str) -> str:
    """A post-processing's name, checked now (before any job starts)."""
    try:
        return pp.PostProcess.parse(text).name
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


postprocess_arg.pattern = PATTERN          # the Flex Template's validation regex (template.py)


def postprocess_list(text: str) -> tuple[str, ...]:
    """``raw,norm-sub,eb+shrink`` -> the names, each checked, in order, once."""
    names = [postprocess_arg(t.strip()) for t in str(text).split(",") if t.strip()]
    if not names:
        raise argparse.ArgumentTypeError("--postprocess needs at least one post-processing")
    return tuple(dict.fromkeys(names))
