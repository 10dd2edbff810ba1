"""Beam's question "what are this function's arguments and defaults?", answered once per function.

``apache_beam.transforms.core.get_function_args_defaults`` reads a
function's ``inspect.signature`` (~30 us). Beam asks it of every DoFn
method it may call -- ``process``, ``start_bundle``, ``finish_bundle``,
``setup``, ``teardown`` and the rest, through ``DoFn.get_function_arguments``
-- whenever it builds a ``ParDo``, checks its side inputs, translates it, and
again on the worker for each stage it sets up: ~1,300 times while
PrivKVM+'s ten-round graph is built and translated, for a few dozen
distinct functions.

The answer depends only on the function (its parameters and their default
values) and, for a bound method, that it is bound (the first parameter is
dropped), so it is kept per function object and bound-ness. It is held
weakly: a lambda made for one graph is forgotten with the graph. What is
not a plain function or a method bound to one (a builtin, a
``functools.partial``, a callable instance) is asked the original way every
time. Each caller gets lists of its own, as from Beam's function.

Tweak ``memo_argspecs`` (``tweaks.py``): applied only while a command's
local job is built and run (``kvldp.runtime.tuned``, ``LocalRunner``);
Beam's callers look the function up as a module global of
``apache_beam.transforms.core``, which is what is replaced then.
"""
from __future__ import annotations

import types
import weakref

from apache_beam.transforms import core

from kvldp.runtime.tweaks import Swap

_original = core.get_function_args_defaults
_answers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def get_function_args_defaults(f) -> tuple[list, list]:
    """``core.get_function_args_defaults``, memoised per function (module docstring)."""
    bound = isinstance(f, types.MethodType)
    function = f.__func__ if bound else f
    if type(function) is not types.FunctionType:
        return _original(f)
    found = _answers.get(function)
    if found is None or bound not in found:
        answer = _original(f)
        found = _answers.setdefault(function, {})
        found[bound] = answer
    args, defaults = found[bound]
    return list(args), list(defaults)


SWAP = Swap((core, "get_function_args_defaults", get_function_args_defaults))
