"""Beam's question "does this DoFn's ``process`` both yield and return?", answered once per function.

``ParDo.__init__`` asks ``apache_beam.transforms.core.
_check_fn_use_yield_and_return(fn.process)`` of every ParDo it makes (to
warn about https://github.com/apache/beam/issues/22969): it reads the
method's source with ``inspect.getsourcelines``, which tokenises the whole
definition, and scans its lines -- ~0.3 ms a ParDo. The same few functions
are asked again and again: PrivKVM+'s ten-round graph makes 74 ParDos of a
dozen functions, and the check was ~20 % of building it (0.100-0.118 s ->
0.078-0.087 s per build, best of 6, at 10^6 users, measured here).

The answer depends only on the function's source, so it is kept per code
object (two closures of one ``def`` share theirs); what has no code object
(a builtin, a ``functools.partial``, a callable instance) is asked the
original way every time. Beam's check also logs "Process method returned
None" for such a method: with the memo that is logged once per function, not
once per ParDo. ``ParDo`` still logs its own warning for every ParDo whose
answer is yes. ``tests/test_yield_check.py`` checks the memo against Beam's
function on every DoFn of kvldp's graphs.

Tweak ``memo_yield_check`` (``tweaks.py``): applied only while a command's
local job is built and run (``kvldp.runtime.tuned``, ``LocalRunner``);
``ParDo.__init__`` looks the function up as a module global, which is what
is replaced then.
"""
from __future__ import annotations

from apache_beam.transforms import core

from kvldp.runtime.tweaks import Swap

_original = getattr(core, "_check_fn_use_yield_and_return", None)
_answers: dict = {}          # setting a key is atomic; two threads that both miss just compute it twice


def _code_of(fn):
    return getattr(getattr(fn, "__func__", fn), "__code__", None)


def uses_yield_and_return(fn) -> bool:
    """``core._check_fn_use_yield_and_return``, memoised per code object."""
    code = _code_of(fn)
    if code is None:
        return _original(fn)
    found = _answers.get(code)
    if found is None:
        found = _answers[code] = _original(fn)
    return found


# a Beam without the check has nothing to memoise
SWAP = Swap(*([(core, "_check_fn_use_yield_and_return", uses_yield_and_return)] if _original is not None else []))
