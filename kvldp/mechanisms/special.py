"""SciPy's special functions, imported on first use.

Importing ``scipy.special`` costs ~0.18 s (its array-API compatibility
layer), and four modules that every command imports use a handful of its
functions, only where estimates are post-processed or given intervals: so
every command paid it, ``--postprocess raw`` runs and ``advise`` included.
Callers write ``special.ndtr(x)``: the attribute is looked up when the
formula runs, and from then on is this module's own.
"""
from __future__ import annotations

import importlib


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    value = getattr(importlib.import_module("scipy.special"), name)
    globals()[name] = value
    return value
