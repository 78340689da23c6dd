"""The wire protocol between nodes and the broker: msgspec msgpack, never pickle.

A ZeroMQ message carries one or more frames (the broker's ROUTER adds the node's identity
in front), each a msgpack array whose first element says what it is, decoded into one of
the tagged structs below. Several frames for one peer go as one message (a reply with the
DONE its request made, a DONE with data), which costs the peer one wake-up, not several.
Two decoders, one per direction, so each side accepts only what it should receive; anything
else (bad msgpack, unknown tag, wrong types, a priority out of range) is a malformed frame:
counted, logged and dropped by the receiver, which keeps running.

Data frames carry a batch of messages and a per-link sequence number. The receiver takes
them strictly in order: a repeated number is a duplicate (dropped), a skipped one is a gap
(reported with a NACK, and the sender resends from there). Heartbeats carry the sender's
last data sequence number, so a lost *last* frame is noticed too. A data frame is settled
(DONE) when the receiver is finished with every message in it; until then the sender keeps
it, which is what makes credit, resending and ``node_lost`` accounting possible.

An envelope travels as the array ``[topic, payload, priority, id, session_id,
correlation_id, causation_id, trace, created, hops, source]`` (``Envelope``'s own field
order, without ``context`` and ``reply``), with ``created`` moved from the sender's
monotonic clock to the broker's wall clock, and back on arrival.
"""

from __future__ import annotations

from typing import Any

import msgspec

from bus._envelope import Envelope

__all__ = [
    "DEFAULT_MAX_FRAME",
    "PROTOCOL",
    "Bye",
    "DataDown",
    "DataUp",
    "Done",
    "Hello",
    "Interest",
    "InterestAck",
    "ItemDown",
    "ItemUp",
    "Lost",
    "LostEntry",
    "Nack",
    "Ping",
    "Pong",
    "ReplyDown",
    "ReplyUp",
    "Reset",
    "Subs",
    "SubsAck",
    "Welcome",
    "array_header",
    "down_decoder",
    "up_decoder",
]

#: Bumped on any incompatible change; a broker refuses a HELLO of another version.
#: 2: a message may carry several frames.
PROTOCOL = 2
#: Default limit for one frame. The application checks it (counted as ``oversized``);
#: ZeroMQ's ``MAXMSGSIZE`` is set to twice this as the hard stop that protects memory.
DEFAULT_MAX_FRAME = 1 << 20


class Hello(msgspec.Struct, array_like=True, tag=1):
    """node -> broker: join (or re-join after a reset) with its subscriptions."""

    version: int
    node: str
    incarnation: int
    credit: int
    subs_version: int
    subs: list[tuple[str, str]]


class Welcome(msgspec.Struct, array_like=True, tag=2):
    """broker -> node: joined; the broker's heartbeat settings and frame limit."""

    broker: str
    heartbeat: float
    liveness: int
    max_frame: int


class Subs(msgspec.Struct, array_like=True, tag=3):
    """node -> broker: the node's full set of (subscription name, pattern) pairs now.

    Answered with SUBS_ACK once every other node has applied the interest it changed."""

    version: int
    subs: list[tuple[str, str]]


class Interest(msgspec.Struct, array_like=True, tag=4):
    """broker -> node: the patterns other nodes serve that this node does not serve itself.

    The node answers INTEREST_ACK with the version once ``has_remote`` reflects it."""

    version: int
    patterns: list[str]


class ItemUp(msgspec.Struct, array_like=True):
    """One message a node publishes. ``env`` stays raw in the broker (never decoded)."""

    topic: str
    env: msgspec.Raw
    request: bool = False


class DataUp(msgspec.Struct, array_like=True, tag=5):
    seq: int
    items: list[ItemUp]


class ItemDown(msgspec.Struct, array_like=True):
    """One message for a node: deliver to ``names`` only (all matching when ``None``);
    ``reply_to`` names the requesting node when the message is a request."""

    env: Envelope
    names: list[str] | None = None
    reply_to: str | None = None


class DataDown(msgspec.Struct, array_like=True, tag=5):
    seq: int
    items: list[ItemDown]


class Done(msgspec.Struct, array_like=True, tag=7):
    """Either way: these data frames are settled (every message handled or dead-lettered)."""

    seqs: list[int]


class LostEntry(msgspec.Struct, array_like=True):
    env: Envelope
    subscriber: str
    reason: str


class Lost(msgspec.Struct, array_like=True, tag=8):
    """broker -> publishing node: nobody can take these; dead-letter them there."""

    entries: list[LostEntry]


class ReplyUp(msgspec.Struct, array_like=True, tag=9):
    """node -> broker -> node: a request's answer. The broker forwards the frame as is."""

    to: str
    request_id: int
    ok: bool
    value: msgspec.Raw
    error_type: str | None = None
    error: str | None = None


class ReplyDown(msgspec.Struct, array_like=True, tag=9):
    to: str
    request_id: int
    ok: bool
    value: Any
    error_type: str | None = None
    error: str | None = None


class Ping(msgspec.Struct, array_like=True, tag=10):
    """node -> broker heartbeat: the node's send time and its last data sequence number."""

    t1: int
    last_seq: int


class Pong(msgspec.Struct, array_like=True, tag=11):
    """broker -> node: NTP-style times (t1 echoed, t2 received, t3 sent) and last seq."""

    t1: int
    t2: int
    t3: int
    last_seq: int


class Nack(msgspec.Struct, array_like=True, tag=12):
    """Either way: a gap; resend data frames from ``expected`` on."""

    expected: int


class Bye(msgspec.Struct, array_like=True, tag=13):
    """node -> broker: leaving cleanly; hand whatever it has not settled to others."""


class Reset(msgspec.Struct, array_like=True, tag=14):
    """broker -> node: it does not know this node (restarted, or declared it lost)."""

    reason: str


class InterestAck(msgspec.Struct, array_like=True, tag=15):
    version: int


class SubsAck(msgspec.Struct, array_like=True, tag=16):
    """broker -> node: the subscriptions of this SUBS/HELLO version are visible everywhere."""

    version: int


Up = Hello | Subs | DataUp | Done | ReplyUp | Ping | Nack | Bye | InterestAck
Down = Welcome | Interest | DataDown | Done | Lost | ReplyDown | Pong | Nack | Reset | SubsAck


def up_decoder() -> msgspec.msgpack.Decoder[Up]:
    return msgspec.msgpack.Decoder(Up)


def down_decoder() -> msgspec.msgpack.Decoder[Down]:
    return msgspec.msgpack.Decoder(Down)


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` elements, for frames built from pieces."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")
