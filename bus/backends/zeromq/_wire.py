"""The wire protocol: msgspec msgpack, never pickle.

Two kinds of link, each with its own messages:

* **Control**, node <-> broker (the node's DEALER, the broker's ROUTER): joining, the
  directory of who serves what where, subscription barriers, heartbeats and clock samples.
  No message data ever goes through the broker.
* **Data**, publisher -> receiver, direct (the publisher's DEALER per peer, connected to
  the receiver's ROUTER): batches of messages and the receiver's DONE, replies and NACKs
  coming back on the same link. Two processes, one hop each way.

A ZeroMQ message carries one or more frames (a ROUTER adds the peer's identity in front),
each a msgpack array whose first element says what it is, decoded into one of the tagged
structs below. Each receiving side has its own decoder and accepts only what it should
receive; anything else (bad msgpack, unknown tag, wrong types) is a malformed frame:
counted, logged and dropped by the receiver, which keeps running.

Data frames carry a batch and a per-link sequence number. The receiver takes them strictly
in order: a repeated number is a duplicate (dropped), a skipped one is a gap (answered with
a NACK, and the publisher resends from there). While frames are unsettled the publisher
sends a LINK_PING each heartbeat with its last and its first unsettled sequence numbers,
so a lost *last* frame, a lost NACK and a lost DONE are all repaired. A frame is settled
(DONE) when the receiver is finished with every message in it; until then the publisher
keeps it, which is what makes credit, resending and ``node_lost`` accounting possible.

An envelope travels as the array ``[topic, payload, priority, id, session_id,
correlation_id, causation_id, trace, created, hops, source]`` (``Envelope``'s own field
order, without ``context`` and ``reply``), with ``created`` moved from the sender's
monotonic clock to the broker's reference clock, and back on arrival. The reference is the
broker's monotonic clock shifted once to wall time (WELCOME says by how much): a node that
reads the broker's monotonic clock (same machine, :func:`bus._clock.clock_domain`) moves
times with that exact shift, so a queue wait between two such nodes is exact; a node on
another machine estimates its shift from heartbeats (PING/PONG, NTP style), which is only
as good as half the heartbeat's round trip.
"""

from __future__ import annotations

import ipaddress
import logging
import re
from typing import Any, final

import msgspec
from zmq.utils import z85

from bus._decode import UntrustedDecoder
from bus._envelope import Envelope

__all__ = [
    "DEFAULT_MAX_FRAME",
    "PROTOCOL",
    "Bye",
    "Data",
    "Directory",
    "DirectoryAck",
    "Done",
    "Hello",
    "Item",
    "LinkPing",
    "Nack",
    "PeerInfo",
    "Ping",
    "Pong",
    "Reply",
    "Reset",
    "Subs",
    "SubsAck",
    "Welcome",
    "array_header",
    "control_down_decoder",
    "control_up_decoder",
    "link_back_decoder",
    "link_in_decoder",
    "node_name_problem",
    "oversized",
    "peer_problem",
]

#: Bumped on any incompatible change; a broker refuses a HELLO of another version.
#: 3: messages go node to node; the broker keeps only the directory and heartbeats.
#: 4: WELCOME says which broker run it is (``epoch``), so a node can tell a restart.
#: 5: subscription patterns are token patterns (``*`` one token, ``>`` the rest); a node of 4
#:    would route ``a.*`` across dots and may advertise globs this version refuses.
#: 6: WELCOME carries the broker's clock domain and shift, PONG times are on that reference;
#:    a node of 5 would estimate its shift on one machine, where it can be exact.
PROTOCOL = 6
#: Default limit for one frame. The application checks it (counted as ``oversized``);
#: ZeroMQ's ``MAXMSGSIZE`` is set to twice this as the hard stop that protects memory.
DEFAULT_MAX_FRAME = 1 << 20


#: Longest node name a directory entry may carry.
MAX_NODE_NAME = 255
#: Most credit a node may advertise: far above any window, low enough to stay a plain int.
MAX_CREDIT = 1 << 31
#: Longest ``ipc://`` path: the size of a Unix socket address, less its terminating NUL.
_MAX_IPC_PATH = 107
_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


# -- control: node <-> broker ------------------------------------------------------------------


class Hello(msgspec.Struct, array_like=True, tag=1):
    """node -> broker: join (or re-join after a reset) with its subscriptions, the endpoint
    its data socket listens on, and (with CURVE) the public key that socket serves with."""

    version: int
    node: str
    incarnation: int
    credit: int
    subs_version: int
    subs: list[tuple[str, str]]
    data: str
    key: bytes | None = None


class Welcome(msgspec.Struct, array_like=True, tag=2):
    """broker -> node: joined; the broker's heartbeat settings and frame limit."""

    broker: str
    heartbeat: float
    liveness: int
    max_frame: int
    epoch: int  # random per broker run: a new one means the broker restarted
    clock: str  # the broker's clock domain: a node in the same one reads its monotonic clock
    mono_to_wall: int  # reference clock minus the broker's monotonic clock, ns


class Subs(msgspec.Struct, array_like=True, tag=3):
    """node -> broker: the node's full set of (subscription name, pattern) pairs now.

    Answered with SUBS_ACK once every other node has applied the directory it changed."""

    version: int
    subs: list[tuple[str, str]]


class PeerInfo(msgspec.Struct, array_like=True):
    """One other live node, as the directory lists it."""

    name: str
    incarnation: int
    data: str
    key: bytes | None
    credit: int
    subs: list[tuple[str, str]]


class Directory(msgspec.Struct, array_like=True, tag=4):
    """broker -> node: every *other* live node now. Answered with DIRECTORY_ACK once
    ``has_remote`` and routing reflect it; a node missing from it is lost."""

    version: int
    peers: list[PeerInfo]


class DirectoryAck(msgspec.Struct, array_like=True, tag=15):
    version: int


class SubsAck(msgspec.Struct, array_like=True, tag=16):
    """broker -> node: the subscriptions of this SUBS/HELLO version are visible everywhere."""

    version: int


class Ping(msgspec.Struct, array_like=True, tag=10):
    """node -> broker heartbeat, and a clock sample: the node's send time."""

    t1: int


class Pong(msgspec.Struct, array_like=True, tag=11):
    """broker -> node: NTP-style times (t1 echoed; t2 received and t3 sent, both on the
    broker's reference clock)."""

    t1: int
    t2: int
    t3: int


class Bye(msgspec.Struct, array_like=True, tag=13):
    """node -> broker: leaving cleanly; tell the others at once, not after a timeout."""


class Reset(msgspec.Struct, array_like=True, tag=14):
    """broker -> node: it does not know this node (restarted, or declared it lost)."""

    reason: str


# -- data: publisher -> receiver, and back --------------------------------------------------------


class Item(msgspec.Struct, array_like=True):
    """One message: deliver to the subscriptions in ``names`` only (every matching one
    when ``None``); ``request`` asks for the first answer to come back on the link."""

    env: Envelope
    names: list[str] | None = None
    request: bool = False


@final  # receivers dispatch on ``type(msg) is Data``; final lets type checkers narrow that
class Data(msgspec.Struct, array_like=True, tag=5):
    seq: int
    items: list[Item]


class LinkPing(msgspec.Struct, array_like=True, tag=6):
    """publisher -> receiver, each heartbeat while frames are unsettled: the last sequence
    number sent, so a lost last frame (nothing after it to show the gap) is noticed, and
    the first one not settled, so a lost DONE is said again."""

    last_seq: int
    first_unsettled: int = 0


class Done(msgspec.Struct, array_like=True, tag=7):
    """receiver -> publisher: these data frames are settled (every message handled or
    dead-lettered)."""

    seqs: list[int]


class Reply(msgspec.Struct, array_like=True, tag=9):
    """receiver -> publisher: a request's answer."""

    request_id: int
    ok: bool
    value: Any
    error_type: str | None = None
    error: str | None = None


class Nack(msgspec.Struct, array_like=True, tag=12):
    """receiver -> publisher: a gap; resend data frames from ``expected`` on."""

    expected: int


ControlUp = Hello | Subs | DirectoryAck | Ping | Bye
ControlDown = Welcome | Directory | SubsAck | Pong | Reset
LinkIn = Data | LinkPing
LinkBack = Done | Reply | Nack


def node_name_problem(name: str) -> str | None:
    """Why ``name`` cannot name a node, or None. A link's identity is ``name/incarnation/n``,
    so a ``/`` would make one node's links look like another's."""
    if not 0 < len(name) <= MAX_NODE_NAME:
        return f"node name must be 1 to {MAX_NODE_NAME} characters, got {len(name)}"
    if "/" in name or not name.isprintable():
        return f"node name {name!r:.80} must be printable and have no '/'"
    return None


def _endpoint_problem(data: str) -> str | None:
    """Why ``data`` is not an endpoint another node can connect a DEALER to, or None.

    Checked before ``connect``: libzmq raises on a malformed address, and a directory that
    a rogue node fed one must not stop a node halfway through applying it."""
    if data.startswith("ipc://"):
        path = data[len("ipc://") :]
        if not 0 < len(path.encode("utf-8", "surrogatepass")) <= _MAX_IPC_PATH:
            return f"ipc path must be 1 to {_MAX_IPC_PATH} bytes"
        if not path.isprintable():
            return "ipc path must be printable"
        return None
    if not data.startswith("tcp://"):
        return "data endpoint must be tcp://host:port or ipc://path"
    host, sep, port = data[len("tcp://") :].rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        return "data endpoint needs a port from 1 to 65535"
    if host.startswith("[") and host.endswith("]"):
        try:
            ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            return f"{host!r:.80} is no IPv6 address"
        return None
    if len(host) > 253 or not _HOSTNAME.fullmatch(host):
        return f"{host!r:.80} is no IPv4 address or host name"
    return None


def peer_problem(info: PeerInfo) -> str | None:
    """Why a directory entry (or the HELLO it came from) cannot be linked to, or None.

    Without CURVE anyone who reaches the broker can join; its entry then goes to every node,
    so the broker refuses a bad HELLO and each node drops a bad entry (both counted)."""
    problem = node_name_problem(info.name)
    if problem is not None:
        return problem
    if not 0 <= info.incarnation < 1 << 64:
        return f"incarnation {info.incarnation} is out of range"
    if not 0 < info.credit <= MAX_CREDIT:
        return f"credit must be 1 to {MAX_CREDIT}, got {info.credit}"
    problem = _endpoint_problem(info.data)
    if problem is not None:
        return f"{problem}, got {info.data!r:.80}"
    if info.key is not None:
        try:
            valid = len(info.key) == 40 and len(z85.decode(info.key)) == 32
        except (ValueError, KeyError, IndexError, TypeError):
            valid = False
        if not valid:
            return f"CURVE key must be 40 bytes of z85 text, got {info.key!r:.60}"
    return None


def control_up_decoder(max_frame: int) -> UntrustedDecoder[ControlUp]:
    return UntrustedDecoder(ControlUp, what="ZeroMQ frame", max_bytes=max_frame)


def control_down_decoder(max_frame: int) -> UntrustedDecoder[ControlDown]:
    return UntrustedDecoder(ControlDown, what="ZeroMQ frame", max_bytes=max_frame)


def link_in_decoder(max_frame: int) -> UntrustedDecoder[LinkIn]:
    return UntrustedDecoder(LinkIn, what="ZeroMQ frame", max_bytes=max_frame)


def link_back_decoder(max_frame: int) -> UntrustedDecoder[LinkBack]:
    return UntrustedDecoder(LinkBack, what="ZeroMQ frame", max_bytes=max_frame)


def oversized(
    frame: bytes, limit: int, counts: dict[str, int], source: object, log: logging.Logger
) -> bool:
    """Count a received frame; one over ``limit`` bytes is also counted as ``oversized``,
    logged with where it came from and to be dropped (True) before it is decoded: a peer
    must not make a receiver allocate what it likes."""
    counts["frames_in"] += 1
    if len(frame) <= limit:
        return False
    counts["oversized"] += 1
    log.warning("dropped an oversized frame (%d bytes > %d) from %r", len(frame), limit, source)
    return True


def array_header(n: int) -> bytes:
    """The msgpack header of an array of ``n`` elements, for frames built from pieces."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")
