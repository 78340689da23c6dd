"""What NATS carries for this transport: the envelope, answers, directory entries, sync acks.

Every part encodes and decodes through the one set of msgspec codecs here, so the wire
format has a single definition (the envelope's fields in order, as an array, plus what only
the transport reads). JetStream's own replies (``+ACK``, ``-NAK``, ack subjects) are here too.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bus._decode import UntrustedDecoder
from bus._envelope import Envelope

__all__ = [
    "ACK",
    "TERM",
    "WPI",
    "Answer",
    "NodeEntry",
    "SyncAck",
    "Wire",
    "consumer_of",
    "decode_answer",
    "decode_json",
    "decode_node",
    "decode_sync",
    "decode_wire",
    "delivered",
    "encode",
    "envelope_of",
]

ACK = b"+ACK"
TERM = b"+TERM"
WPI = b"+WPI"


class Wire(msgspec.Struct, array_like=True, gc=False):
    """An envelope on the wire, plus what only the transport reads."""

    topic: str
    payload: Any
    priority: int
    id: int
    session_id: str | None
    correlation_id: int
    causation_id: int | None
    trace: str | None
    created: int  # wall-clock ns (monotonic clocks differ between processes)
    hops: int
    source: str | None
    origin: str  # the publishing node: its DLQ subject
    skip: list[str] | None = None  # groups the publisher served locally
    only: list[str] | None = None  # a redrive: for these groups only
    reply: str | None = None  # a request: where the answer goes


class Answer(msgspec.Struct, array_like=True):
    ok: bool
    value: Any
    error_type: str | None = None
    error: str | None = None
    topic: str = ""


class NodeEntry(msgspec.Struct):
    """A node's record in the directory bucket."""

    node: str
    version: int
    subs: list[tuple[str, str]]
    host: str
    pid: int


class SyncAck(msgspec.Struct, array_like=True):
    node: str
    version: int


encode = msgspec.msgpack.Encoder().encode
# Everything read from NATS may come from any client of the server: decoded through the
# bus's one untrusted path, so every failure is a ``DecodeError`` the reader counts.
decode_wire = UntrustedDecoder[Wire](Wire, what="NATS message").decode
decode_answer = UntrustedDecoder[Answer](Answer, what="NATS answer").decode
decode_node = UntrustedDecoder[NodeEntry](NodeEntry, what="NATS directory entry").decode
decode_sync = UntrustedDecoder[SyncAck](SyncAck, what="NATS sync ack").decode
decode_json = UntrustedDecoder[Any](format="json", what="JetStream reply").decode


def envelope_of(wire: Wire, mono_to_wall: int) -> Envelope:
    """The envelope a wire message carries, its creation time back on this process's
    monotonic clock (``mono_to_wall``: wall-clock ns minus monotonic ns here)."""
    return Envelope(
        wire.topic,
        wire.payload,
        wire.priority,
        wire.id,
        wire.session_id,
        wire.correlation_id,
        wire.causation_id,
        wire.trace,
        wire.created - mono_to_wall,
        wire.hops,
        wire.source,
    )


def consumer_of(ack: str) -> str:
    """The consumer named in a JetStream ack subject."""
    tokens = ack.split(".")
    return tokens[3] if len(tokens) == 9 else tokens[5]


def delivered(ack: str) -> int:
    """The delivery count in a JetStream ack subject (``$JS.ACK.<stream>.<consumer>.<n>...``
    or, with a domain and account hash, two tokens later)."""
    tokens = ack.split(".")
    return int(tokens[4] if len(tokens) == 9 else tokens[6])
