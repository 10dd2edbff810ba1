"""Beam's state/timer introspection memoised per class (``kvldp/transforms/dofn_specs.py``):
the memo must give Beam's own answer for every DoFn, and ask Beam again
wherever the class alone does not decide it."""
from __future__ import annotations

import apache_beam as beam
from apache_beam.coders import VarIntCoder
from apache_beam.transforms import userstate
from apache_beam.transforms.timeutil import TimeDomain

from graph_dofns import kvldp_dofns
from kvldp.runtime import dofn_specs

COUNT = userstate.BagStateSpec("count", VarIntCoder())
TIMER = userstate.TimerSpec("flush", TimeDomain.WATERMARK)
COUNT_STATE, FLUSH_TIMER = beam.DoFn.StateParam(COUNT), beam.DoFn.TimerParam(TIMER)   # Beam's idiom: default arguments


class _Stateful(beam.DoFn):
    def process(self, element, count=COUNT_STATE):
        yield element


class _Timed(beam.DoFn):
    def process(self, element, timer=FLUSH_TIMER):
        yield element

    @userstate.on_timer(TIMER)
    def flush(self):
        yield 0


class _Plain(beam.DoFn):
    def process(self, element):
        yield element


class _BorrowsAStatefulProcess(beam.DoFn):
    """Its instance holds another DoFn's bound ``process``: the class alone does not decide."""

    def __init__(self):
        super().__init__()
        self.process = _Stateful().process


class _PropertyMakesAMethod(beam.DoFn):
    @property
    def stateful(self):
        return _Stateful().process

    def process(self, element):
        yield element


def _same(dofn) -> bool:
    return dofn_specs.get_dofn_specs(dofn) == dofn_specs._original(dofn)


def test_beam_asks_the_memo_only_while_it_is_applied():
    assert userstate.get_dofn_specs is dofn_specs._original
    with dofn_specs.SWAP.applied():
        assert userstate.get_dofn_specs is dofn_specs.get_dofn_specs
        assert userstate.is_stateful_dofn(_Stateful()) and not userstate.is_stateful_dofn(_Plain())
    assert userstate.get_dofn_specs is dofn_specs._original


def test_every_dofn_of_kvldps_graphs_gets_beams_answer(tmp_path):
    fns = kvldp_dofns(tmp_path)
    assert len(fns) > 40
    for fn in fns:
        assert _same(fn), fn
        assert _same(fn), fn      # the remembered answer too


def test_stateful_and_timer_dofns_keep_their_specs_for_every_instance():
    for cls in (_Stateful, _Timed, _Plain):
        first, second = cls(), cls()
        assert _same(first) and _same(second)
    states, timers = dofn_specs.get_dofn_specs(_Timed())
    assert timers == {TIMER} and not states
    assert dofn_specs.get_dofn_specs(_Stateful())[0] == {COUNT}


class _HoldsABoundMethod(beam.DoFn):
    """Holds a bound method as data (PrivKVM+'s later rounds hold ``Dataset.batch``)."""

    def __init__(self, method):
        super().__init__()
        self.rebuild = method

    def process(self, element):
        yield element


def test_held_bound_methods_are_keyed_by_their_function():
    stateless, stateful = _HoldsABoundMethod(_Plain().process), _HoldsABoundMethod(_Stateful().process)
    for _ in range(2):
        assert _same(stateless) and _same(stateful)
        assert dofn_specs.get_dofn_specs(stateful)[0] == {COUNT}
        assert dofn_specs.get_dofn_specs(_HoldsABoundMethod(_Stateful().process))[0] == {COUNT}   # another instance
        assert not dofn_specs.get_dofn_specs(_HoldsABoundMethod(_Plain().process))[0]


def test_a_second_instance_holding_the_same_bound_method_is_answered_from_the_memo(monkeypatch):
    """PrivKVM+'s later rounds each hold ``Dataset.batch`` bound to their
    dataset: Beam's walk (0.4 ms) runs once for them all, not per instance."""
    calls, beams = [], dofn_specs._original
    monkeypatch.setattr(dofn_specs, "_answers", {})
    monkeypatch.setattr(dofn_specs, "_original", lambda dofn: calls.append(dofn) or beams(dofn))
    first, second = _HoldsABoundMethod(_Plain().process), _HoldsABoundMethod(_Plain().process)
    assert dofn_specs.get_dofn_specs(first) == dofn_specs.get_dofn_specs(second) == (set(), set())
    assert calls == [first]


def test_what_the_class_does_not_decide_gets_beams_answer():
    borrowed = _BorrowsAStatefulProcess()
    assert dofn_specs.get_dofn_specs(borrowed)[0] == {COUNT}
    assert not dofn_specs._plain_class(_PropertyMakesAMethod)
    assert dofn_specs.get_dofn_specs(_PropertyMakesAMethod())[0] == {COUNT}
    wrapped = beam.Map(_Stateful().process).fn           # a bound method as a Map's function
    assert _same(wrapped)
    assert _same(beam.Map(len).fn)


def test_callers_may_change_the_sets_they_get():
    states, _ = dofn_specs.get_dofn_specs(_Stateful())
    states.clear()
    assert dofn_specs.get_dofn_specs(_Stateful())[0] == {COUNT}
