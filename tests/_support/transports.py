"""A scenario's ``transport:`` section for a test that runs a team on ZeroMQ and on NATS."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from bus.backends.nats import NatsServer

__all__ = ["transport_section"]


@contextmanager
def transport_section(kind: str, placement: str) -> Iterator[str]:
    """The section for ``kind`` (``zmq``: a broker the run starts on a free port; ``nats``:
    this test's own ``nats-server -js`` on a free port, stopped after), with ``placement``
    (the ``  nodes:`` lines)."""
    if kind == "zmq":
        yield f"transport:\n  kind: zmq\n  broker: tcp://127.0.0.1:0\n{placement}"
        return
    server = NatsServer().start()
    try:
        yield f"transport:\n  kind: nats\n  url: {server.url}\n{placement}"
    finally:
        server.stop()
