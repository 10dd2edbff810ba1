"""Type hints' origins named by their frames (``kvldp/transforms/hint_origins.py``):
the same frames as Beam's, outermost first, the same message and "based on"
parts, no source lines; the one error that shows them still points at the
declaration; a Beam with another ``_make_origin`` keeps its own."""
from __future__ import annotations

import re

import apache_beam as beam
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.typehints import decorators
from apache_beam.typehints.decorators import IOTypeHints

from kvldp.runtime import hint_origins

_FRAME = re.compile(r'^\s*File "')
_STRUCTURE = {"", "based on:", "and:"}


def _declared():
    return IOTypeHints.empty().with_output_types(int).with_input_types(str)


def _both(monkeypatch):
    """``_declared()``'s hints made by kvldp's ``_make_origin`` and by
    Beam's, from the same line."""
    made = []
    for implementation in (classmethod(hint_origins._make_origin), hint_origins._beams):
        monkeypatch.setattr(decorators.IOTypeHints, "_make_origin", implementation)
        made.append(_declared())
    return made


def test_applied_only_while_a_tuned_job_runs():
    assert decorators.IOTypeHints.__dict__["_make_origin"] is hint_origins._beams
    with hint_origins.SWAP.applied():
        assert decorators.IOTypeHints.__dict__["_make_origin"].__func__ is hint_origins._make_origin
    assert decorators.IOTypeHints.__dict__["_make_origin"] is hint_origins._beams


def test_origin_names_beams_frames_without_their_source_lines(monkeypatch):
    ours, beams = _both(monkeypatch)
    assert ours == beams                                   # the hints themselves are equal
    assert ours.origin, "an origin is recorded"
    # Beam's lines are ours plus each frame's source line (and 3.11's ^^^ markers) after it
    assert [line for line in beams.origin if _FRAME.match(line) or line.strip() in _STRUCTURE
            or line.lstrip().startswith("IOTypeHints[")] == ours.origin
    frames = [line for line in ours.origin if _FRAME.match(line)]
    assert all(not line.strip() or _FRAME.match(line) or line.strip() in _STRUCTURE
               or line.lstrip().startswith("IOTypeHints[") for line in ours.origin)
    # the declaring call is the innermost frame before the base's part, named by file, line and function
    innermost = ours.origin[ours.origin.index("based on:") - 2]
    assert innermost.startswith(f'File "{__file__}", line ') and innermost.endswith(" in _declared")
    assert len([line for line in frames if not line.startswith(" ")]) == decorators.TRACEBACK_LIMIT


def test_message_lines_come_first():
    typed = IOTypeHints.empty()._replace(origin=IOTypeHints._make_origin([], msg=["a message"]))
    assert typed.origin[0] == "a message" and _FRAME.match(typed.origin[1])


def test_type_violation_still_points_at_the_declaration():
    """The one error message that prints an origin (a side input's type
    violation) names the line that declared the hint."""
    def declared_side_input_type(side):
        return beam.Map(lambda x, side: x, side=side).with_input_types(int, side=str)
    p = test_pipeline.TestPipeline()
    side = beam.pvalue.AsSingleton(p | "Side" >> beam.Create([1]).with_output_types(int))
    main = p | beam.Create([1]).with_output_types(int)
    with hint_origins.SWAP.applied(), pytest.raises(Exception, match="Type hint violation") as error:
        _ = main | declared_side_input_type(side)
    assert re.search(rf'File "{re.escape(__file__)}", line \d+, in declared_side_input_type', str(error.value))


def test_a_beam_with_another_make_origin_keeps_its_own(monkeypatch):
    def other(cls, bases, tb=True, msg=(), extra=None):
        return []
    monkeypatch.setattr(hint_origins, "_beams", classmethod(other))
    assert not hint_origins._installable()        # so its SWAP replaces nothing
