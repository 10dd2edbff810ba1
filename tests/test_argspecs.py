"""Beam's argument specs memoised per function (``kvldp/transforms/argspecs.py``):
the memo must give Beam's own answer for every method of every DoFn of
kvldp's graphs, bound or not, read each function's signature once, hand
out lists of its own, and forget a function nobody holds."""
from __future__ import annotations

import functools
import gc
import weakref

import apache_beam as beam
from apache_beam.transforms import core

from graph_dofns import kvldp_dofns
from kvldp.runtime import argspecs

_METHODS = ("process", "start_bundle", "finish_bundle", "setup", "teardown", "process_batch")


class _WithDefaults(beam.DoFn):
    def process(self, element, side=beam.DoFn.SideInputParam, window=beam.DoFn.WindowParam, *args, k=3):
        yield element


def _methods(fn):
    for name in _METHODS:
        method = getattr(fn, name, None)
        if method is not None:
            yield method
            yield getattr(type(fn), name)          # the function itself: self is an argument


def test_beams_callers_ask_the_memo_only_while_it_is_applied():
    assert core.get_function_args_defaults is argspecs._original
    with argspecs.SWAP.applied():
        assert core.get_function_args_defaults is argspecs.get_function_args_defaults
    assert core.get_function_args_defaults is argspecs._original


def test_every_method_of_kvldps_dofns_gets_beams_answer(tmp_path):
    fns = [*kvldp_dofns(tmp_path), _WithDefaults(), beam.Map(lambda x, y=2: x).fn]
    assert len(fns) > 40
    checked = 0
    for fn in fns:
        for method in _methods(fn):
            for _ in range(2):          # the remembered answer too
                assert argspecs.get_function_args_defaults(method) == argspecs._original(method), (fn, method)
            checked += 1
    assert checked > 300
    args, defaults = argspecs.get_function_args_defaults(_WithDefaults().process)
    assert args == ["element", "side", "window"] and defaults == [beam.DoFn.SideInputParam, beam.DoFn.WindowParam]


def test_each_function_is_read_once_and_each_caller_gets_its_own_lists(monkeypatch):
    calls, beams = [], argspecs._original
    monkeypatch.setattr(argspecs, "_answers", argspecs.weakref.WeakKeyDictionary())
    monkeypatch.setattr(argspecs, "_original", lambda f: calls.append(f) or beams(f))
    for _ in range(3):
        argspecs.get_function_args_defaults(_WithDefaults().process)     # a new bound method each time
        argspecs.get_function_args_defaults(_WithDefaults.process)
    assert len(calls) == 2
    first = argspecs.get_function_args_defaults(_WithDefaults().process)
    first[0].append("mine")
    assert argspecs.get_function_args_defaults(_WithDefaults().process) == beams(_WithDefaults().process)
    # neither a function nor a method of one (a partial, a builtin): asked every time
    partial = functools.partial(lambda x, y: x, y=1)
    for f in (partial, partial, len, len):
        assert argspecs.get_function_args_defaults(f) == beams(f)
    assert calls[2:] == [partial, partial, len, len]


def test_a_function_nobody_holds_is_forgotten():
    def make():
        return lambda element, extra=1: element

    fn = make()
    argspecs.get_function_args_defaults(fn)
    remembered = fn in argspecs._answers
    gone = weakref.ref(fn)
    del fn
    gc.collect()
    assert remembered and gone() is None
    assert not [f for f in argspecs._answers if f.__code__ is make().__code__]
