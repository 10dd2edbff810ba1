"""Beam's question "does this DoFn keep state or timers?", answered once per class.

``apache_beam.transforms.userstate.get_dofn_specs`` finds a DoFn's state and
timer specs by wrapping every bound method the instance has (~30 of them,
most inherited from ``DoFn``) and reading each one's signature with
``inspect.signature``: 0.4 ms a call. Beam asks it ~6 times per ParDo while it
builds and translates a graph and again on each worker for each stage it
sets up, so a job paid 0.09 s of its driver's time and as much on the
workers for answers that do not change (measured here, simulate of
PCKV-GRR at 10^6 users: 150 driver calls; the whole job ran 0.45 s).

The answer depends only on the bound methods ``dir(dofn)`` yields, and for
a plain instance those are its class's functions: an instance attribute
that shadows one with a value that is not a bound method hides it from
Beam's walk too, whatever the value (``CallableWrapperDoFn.process`` is the
wrapped function). So the answer is kept per (class, names the instance
shadows, the functions behind the bound methods it holds), computed by
Beam's own function the first time. A bound method's answer is its
function's signature (``MethodWrapper`` reads the defaults of
``inspect.signature``, which for a bound method is its ``__func__``'s minus
the first parameter), so an instance that holds one -- PrivKVM+'s later
rounds hold ``Dataset.batch`` bound to their dataset, 72 walks a job --
is keyed by that function. A class that makes attributes on access
(``__getattr__``, ``__getattribute__``, ``__slots__``, a property or any
other descriptor that is not a plain, class- or static method -- but
``DoFn``'s own properties, which answer booleans) is asked the original way
every time. ``tests/test_dofn_specs.py`` checks the
memo against Beam's function on every DoFn of kvldp's graphs and on
stateful, timer and bound-method DoFns.

Tweak ``memo_dofn_specs`` (``tweaks.py``): applied only while a command's
local job is built and run (``kvldp.runtime.tuned``, ``LocalRunner``) --
never on a remote worker; Beam's callers reach it through the module
attribute (``userstate.get_dofn_specs``, ``userstate.is_stateful_dofn``),
which is what is replaced then.
"""
from __future__ import annotations

import functools
import inspect
import types

from apache_beam.transforms import core, userstate

from kvldp.runtime.tweaks import Swap

_PLAIN_ATTRIBUTES = (types.FunctionType, classmethod, staticmethod, types.BuiltinFunctionType,
                     types.MethodDescriptorType, types.WrapperDescriptorType, types.MethodWrapperType,
                     types.ClassMethodDescriptorType, types.GetSetDescriptorType, types.MemberDescriptorType)

_original = userstate.get_dofn_specs
_answers: dict = {}          # setting a key is atomic; two threads that both miss just compute it twice


@functools.cache
def _plain_class(cls: type) -> bool:
    """Whether every attribute of ``cls`` is what it looks like: no attribute
    made on access, no slots that could hold a bound method."""
    for klass in cls.__mro__[:-1]:              # object's own are plain
        if {"__getattr__", "__getattribute__", "__slots__"} & vars(klass).keys():
            return False
    for name in dir(cls):
        value = inspect.getattr_static(cls, name)
        if (hasattr(type(value), "__get__") and not isinstance(value, _PLAIN_ATTRIBUTES)
                and value is not inspect.getattr_static(core.DoFn, name, None)):
            return False
    return True


def get_dofn_specs(dofn) -> tuple[set, set]:
    """``userstate.get_dofn_specs``, memoised per class (see the module doc)."""
    cls = type(dofn)
    own = getattr(dofn, "__dict__", None)
    if own is None or not _plain_class(cls):
        return _original(dofn)
    key = (cls, frozenset(name for name in own if hasattr(cls, name)),
           frozenset((name, v.__func__) for name, v in own.items() if isinstance(v, types.MethodType)))
    found = _answers.get(key)
    if found is None:
        found = _answers[key] = _original(dofn)
    states, timers = found
    return set(states), set(timers)             # callers own the sets they get, as from Beam's


SWAP = Swap((userstate, "get_dofn_specs", get_dofn_specs))
