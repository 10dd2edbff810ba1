"""How far an Avro container expands when decoded, checked before decoding.

fastavro decompresses each block of a container whole. A message of 18.5 KB
(a report column of 512 MB of zeros, zstandard) made the stream's message
check use 4.6 GB and 19 s (issue 42): at Pub/Sub's 10 MB limit one device
could exhaust the collector's memory, and the job would fail again on each
restart, reading the same message. Honest report data is noise: a block of
it expands 1-5 times. ``check_expansion`` walks the container's framing
(Avro spec, "Object Container Files": a header, then blocks of ``count,
size, data, sync``) and decompresses each block only up to
``max(FLOOR, RATIO x its compressed size)`` bytes, refusing the body past
that, so checking costs at most that much memory per block.
"""
from __future__ import annotations

import io
import sys
import zlib

if sys.version_info >= (3, 14):
    from compression import zstd
else:
    from backports import zstd  # what fastavro decodes zstandard with before Python 3.14

MAGIC = b"Obj\x01"
SYNC_BYTES = 16
RATIO = 100               # an honest block expands 1-5 times (random bits, bit-packed or delta-coded)
FLOOR = 16 << 20          # bytes any block may expand to


def _long(fh) -> int:
    """An Avro long: zig-zag, base-128 varint."""
    shift = result = 0
    while True:
        byte = fh.read(1)
        if not byte:
            raise ValueError("the container ends inside a number")
        result |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return (result >> 1) ^ -(result & 1)
        shift += 7
        if shift > 63:
            raise ValueError("a number longer than 10 bytes")


def _bytes(fh) -> bytes:
    n = _long(fh)
    data = fh.read(n) if n >= 0 else b""
    if n < 0 or len(data) != n:
        raise ValueError("the container ends inside a field")
    return data


def _codec(fh) -> str:
    if fh.read(4) != MAGIC:
        raise ValueError("not an Avro container")
    meta = {}
    while (count := _long(fh)) != 0:
        for _ in range(abs(count)):
            if count < 0:
                _long(fh)                       # a negative count is followed by the block's size in bytes
            key = _bytes(fh).decode("utf-8", "replace")       # the key is read first (a[k] = v reads v first)
            meta[key] = _bytes(fh)
    fh.read(SYNC_BYTES)
    return meta.get("avro.codec", b"null").decode("utf-8", "replace")


def _expanded(codec: str, data: bytes, limit: int) -> int:
    """Bytes ``data`` decompresses to, reading at most ``limit + 1``."""
    if codec == "null":
        return len(data)
    if codec == "deflate":
        return len(zlib.decompressobj(-15).decompress(data, limit + 1))
    if codec == "zstandard":
        return len(zstd.ZstdDecompressor().decompress(data, max_length=limit + 1))
    raise ValueError(f"codec {codec!r}: kvldp writes zstandard (reads deflate and null)")


def check_expansion(body: bytes, ratio: int = RATIO, floor: int = FLOOR) -> None:
    """Raise ``ValueError`` if a block of the Avro container ``body`` would
    decompress past ``max(floor, ratio x its compressed size)`` bytes."""
    fh = io.BytesIO(body)
    codec = _codec(fh)
    while fh.tell() < len(body):
        _long(fh)                                   # the block's record count
        data = _bytes(fh)
        limit = max(floor, ratio * len(data))
        if _expanded(codec, data, limit) > limit:
            raise ValueError(f"a block of {len(data):,} bytes expands past {limit:,} bytes "
                             f"({ratio} times, at least {floor >> 20} MiB): no honest report batch does")
        fh.read(SYNC_BYTES)
