"""Tweak ``zlib_pickles``: while a ``LocalRunner`` job with in-process
workers runs, Beam's pickler compresses with zlib, its other codec
(``pickler.dumps(use_zlib=True)``), instead of bz2 at level 9.

A worker unpickles every DoFn of a stage, pickles it again with its
windowing and unpickles that (``bundle_processor._create_pardo_operation``),
and the driver pickles each once more to translate the graph: ~165
compressions in a PrivKVM+ job, each allocating bz2's 7.6 MB of work space
for a 2 KB payload (0.23 ms, against 0.025 ms for zlib). During a job
``loads`` reads either codec (a bz2 stream begins ``BZh``, a zlib one
``x``); what is pickled during a job -- the stages' DoFns, the workers'
coders -- is unpickled during it. Payloads made outside a job, or for
subprocess workers (``multi_processing``, which run Beam's own ``loads``),
stay bz2.
"""
from __future__ import annotations

import base64

from apache_beam.internal import pickler

from kvldp.runtime.tweaks import Swap

_beam_dumps, _beam_loads = pickler.dumps, pickler.loads


def dumps(o, enable_trace=True, use_zlib=False, **kwargs):
    return _beam_dumps(o, enable_trace=enable_trace, use_zlib=True, **kwargs)


def loads(encoded, enable_trace=True, use_zlib=False):
    return _beam_loads(encoded, enable_trace=enable_trace, use_zlib=use_zlib or is_zlib_payload(encoded))


def is_zlib_payload(encoded) -> bool:
    """Whether Beam's base64 payload holds a zlib stream (first byte ``x``,
    deflate with a 32 KiB window) rather than bz2 (``BZh``)."""
    return base64.b64decode(encoded[:4])[:1] == b"x"


SWAP = Swap((pickler, "dumps", dumps), (pickler, "loads", loads))
