"""A free loopback port for the real components the tests start (the Pub/Sub
emulator, Flink's job server and REST endpoint, a fake job service)."""
from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    with contextlib.closing(socket.socket()) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
