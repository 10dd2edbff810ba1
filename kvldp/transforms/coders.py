"""Coders for kvldp's elements, registered with Beam on import for kvldp's
own types only (``NDArray`` and ``ArrowArray`` name the NumPy and Arrow
arrays kvldp's steps make, so that no other pipeline's ``np.ndarray`` or
``pa.Array`` changes coder when kvldp is imported).

``UserBatchCoder``: a compact coder for ``UserBatch``.

Multi-round protocols read the users once per round, so the runner keeps
the encoded users between rounds. Beam's default (pickle) stored every
array at its in-memory width: 24 B per single-pair user (int64 offsets and
keys, float64 values), and the local runner's buffers and their copies
took a multi-round job to 1.36 GB at 10^7 users (issue 17). Here offsets
travel as per-user sizes and every integer array in the smallest unsigned
type that holds it (1 + 1 + 8 B for a single-pair user over <= 256 keys);
floats are kept bit for bit, and every array decodes to its original dtype,
so estimates do not change. The encoding walks the dataclass's fields, so a
field added to ``UserBatch`` is carried without touching this module. An
integer array of consecutive values travels as its first value and length:
a synthetic batch's stable user ids (``arange(start, stop)``, which the
longitudinal mode derives device secrets from) then cost nothing per user.

``ArrayPayloadCoder``: pickle for the array-carrying elements (reports,
count arrays, protocol states, estimates, estimate tables), with a size
estimate read off their arrays instead of pickling them. Beam's output
counters estimate the byte size of the first ten elements of every
PCollection in every bundle, then about seven per doubling, and the pickle
coder does it by encoding the element whole; at d = 10^6 that pickled a 20 MB
report batch 30 times, and a 150-210 MB state, estimates and table once each
only to measure them, which was 0.4 GB of ``simulate``'s peak (issue 17).
"""
from __future__ import annotations

import abc
import dataclasses
import json
import pickle
import struct
import sys

import numpy as np
import pyarrow as pa
from apache_beam import coders

from kvldp.mechanisms.base import Estimates, Reports, UserBatch
from kvldp.mechanisms.protocol import ProtocolState
from kvldp.schemas.estimate_table import EstimateTable

_HEADER = struct.Struct("<I")
_UNSIGNED = (np.uint8, np.uint16, np.uint32)


def _narrowest(a: np.ndarray) -> np.ndarray:
    """Integers in the smallest unsigned type that holds them all (as they
    are when negative or too wide); anything else unchanged."""
    if a.dtype.kind not in "iu" or a.size == 0 or a.min() < 0:
        return a
    top = int(a.max())
    for t in _UNSIGNED:
        if top <= np.iinfo(t).max:
            return a.astype(t)
    return a


def _is_range(a: np.ndarray) -> bool:
    """Integers ``a[0], a[0] + 1, …`` (at least two of them)."""
    return a.dtype.kind in "iu" and a.ndim == 1 and a.size >= 2 and bool(np.all(np.diff(a) == 1))


class UserBatchCoder(coders.Coder):
    """``UserBatch`` <-> bytes: a JSON header (each field's kind, stored and
    original dtype, length) then the arrays' little-endian bytes."""

    def encode(self, batch: UserBatch) -> bytes:
        fields, blobs = [], []
        for f in dataclasses.fields(batch):
            value = getattr(batch, f.name)
            if value is None:
                fields.append([f.name, "none"])
            elif isinstance(value, np.ndarray) and _is_range(value):
                # consecutive integers (a synthetic batch's user ids): the first one and the count
                fields.append([f.name, "range", value.dtype.str, int(value[0]), int(value.size)])
            elif isinstance(value, np.ndarray):
                original = value.dtype
                stored = np.diff(value) if f.name == "offsets" else value
                stored = _narrowest(np.ascontiguousarray(stored))
                stored = stored.astype(stored.dtype.newbyteorder("<"), copy=False)
                fields.append([f.name, "sizes" if f.name == "offsets" else "array", stored.dtype.str,
                               original.str, int(stored.size)])
                blobs.append(stored.tobytes())
            else:
                fields.append([f.name, "int", int(value)])
        header = json.dumps(fields, separators=(",", ":")).encode()
        return b"".join([_HEADER.pack(len(header)), header, *blobs])

    def decode(self, data: bytes) -> UserBatch:
        (size,) = _HEADER.unpack_from(data)
        pos = _HEADER.size + size
        values = {}
        for field in json.loads(data[_HEADER.size:pos]):
            name, kind = field[0], field[1]
            if kind == "none":
                values[name] = None
            elif kind == "int":
                values[name] = field[2]
            elif kind == "range":
                dtype = np.dtype(field[2])
                values[name] = np.arange(field[4], dtype=dtype) + np.array(field[3], dtype=dtype)
            else:
                stored, original, n = np.dtype(field[2]), np.dtype(field[3]), field[4]
                array = np.frombuffer(data, stored, n, pos)
                pos += array.nbytes
                if kind == "sizes":
                    out = np.zeros(n + 1, dtype=original)
                    np.cumsum(array, out=out[1:])
                    values[name] = out
                else:
                    values[name] = array.astype(original)      # a copy: writable, native order
        return UserBatch(**values)

    def estimate_size(self, batch: UserBatch) -> int:
        # Beam sizes sampled elements for its metrics; Coder's default encodes the whole batch to measure it
        return estimated_size(batch)

    def is_deterministic(self) -> bool:
        return True

    def to_type_hint(self):
        return UserBatch


coders.registry.register_coder(UserBatch, UserBatchCoder)


def estimated_size(value, depth: int = 0) -> int:
    """Roughly the bytes ``value`` pickles to, without pickling it: its
    arrays' ``nbytes``, through dataclass fields, tuples and dicts (a few
    levels deep), and the shallow size of anything else."""
    if isinstance(value, np.ndarray) or isinstance(getattr(value, "nbytes", None), int):
        return value.nbytes              # an array, NumPy's or Arrow's
    if depth < 4 and dataclasses.is_dataclass(value) and not isinstance(value, type):
        return 64 + sum(estimated_size(getattr(value, f.name), depth + 1) for f in dataclasses.fields(value))
    if depth < 4 and isinstance(value, tuple):
        return 16 + sum(estimated_size(v, depth + 1) for v in value)
    if depth < 4 and isinstance(value, dict):
        return 64 + sum(estimated_size(v, depth + 1) for v in value.values())
    if isinstance(value, (list, range)):
        return 8 * len(value) + 64     # key names: pointers; their strings are shared and small
    return sys.getsizeof(value)


class ArrayPayloadCoder(coders.Coder):
    """Pickle, as Beam's default coder, with ``estimated_size`` as the size
    estimate (``Coder.estimate_size``: what Beam's element-size metrics and
    Dataflow's monitoring read; nothing depends on it being exact)."""

    def encode(self, value) -> bytes:
        return pickle.dumps(value, pickle.HIGHEST_PROTOCOL)

    def decode(self, data: bytes):
        return pickle.loads(data)

    def estimate_size(self, value) -> int:
        return estimated_size(value)

    def is_deterministic(self) -> bool:
        return False

    def to_type_hint(self):
        return object

    def __eq__(self, other):
        return type(self) is type(other)

    def __hash__(self):
        return hash(type(self))


class NDArray(abc.ABC):  # noqa: B024  (a type hint: nothing to implement)
    """The type hint of a PCollection of NumPy arrays made by kvldp's steps
    (count arrays, histograms): every ``np.ndarray`` is one (a virtual
    subclass, so Beam's runtime type check passes), and the hint is kvldp's,
    so its coder is registered without touching ``np.ndarray``'s."""


NDArray.register(np.ndarray)


class ArrowArray(abc.ABC):  # noqa: B024
    """``NDArray``'s counterpart for Arrow arrays (``pa.Array``)."""


ArrowArray.register(pa.Array)


def register_payload_type(kind: type) -> type:
    """Use ``ArrayPayloadCoder`` wherever a step declares ``kind`` as its output type."""
    coders.registry.register_coder(kind, ArrayPayloadCoder)
    return kind


# Declared as the output type of the steps that make them (``.with_output_types``).
PAYLOAD_TYPES = (Reports, ProtocolState, Estimates, EstimateTable, NDArray, ArrowArray)
for _type in PAYLOAD_TYPES:
    register_payload_type(_type)
