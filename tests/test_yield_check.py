"""Beam's yield-and-return source check memoised per function (``kvldp/transforms/yield_check.py``):
the memo must give Beam's own answer for every DoFn, ParDo must still warn
where Beam would, and the source is read once per function."""
from __future__ import annotations

import functools
import logging

import apache_beam as beam
from apache_beam.transforms import core

from graph_dofns import kvldp_dofns
from kvldp.runtime import yield_check


class _YieldsAndReturns(beam.DoFn):
    def process(self, element):
        if element:
            return [element]
        yield element


class _Yields(beam.DoFn):
    def process(self, element):
        yield element


def test_par_do_asks_the_memo_only_while_it_is_applied():
    assert core._check_fn_use_yield_and_return is yield_check._original
    with yield_check.SWAP.applied():
        assert core._check_fn_use_yield_and_return is yield_check.uses_yield_and_return
    assert core._check_fn_use_yield_and_return is yield_check._original


def test_every_dofn_of_kvldps_graphs_gets_beams_answer(tmp_path):
    fns = kvldp_dofns(tmp_path)
    assert len(fns) > 40
    for fn in [*fns, _YieldsAndReturns(), _Yields()]:
        for _ in range(2):          # the remembered answer too
            assert yield_check.uses_yield_and_return(fn.process) == yield_check._original(fn.process), fn
    assert yield_check.uses_yield_and_return(_YieldsAndReturns().process)
    assert not yield_check.uses_yield_and_return(_Yields().process)


def test_par_do_still_warns_for_every_dofn_that_yields_and_returns(caplog):
    with yield_check.SWAP.applied(), caplog.at_level(logging.WARNING, logger=core.__name__):
        beam.ParDo(_YieldsAndReturns())
        beam.ParDo(_YieldsAndReturns())
        beam.ParDo(_Yields())
    warned = [r for r in caplog.records if "yield and return" in r.getMessage()]
    assert len(warned) == 2


def test_the_source_is_read_once_per_function(monkeypatch):
    calls, beams = [], yield_check._original
    monkeypatch.setattr(yield_check, "_answers", {})
    monkeypatch.setattr(yield_check, "_original", lambda fn: calls.append(fn) or beams(fn))
    with yield_check.SWAP.applied():
        for _ in range(3):
            beam.ParDo(_Yields())
            beam.Map(lambda x: x)       # CallableWrapperDoFn: one wrapper function for every Map
    assert len(calls) == 2
    # no code object (a partial): asked every time
    partial = functools.partial(lambda x, y: x, y=1)
    yield_check.uses_yield_and_return(partial)
    yield_check.uses_yield_and_return(partial)
    assert calls[2:] == [partial, partial]
