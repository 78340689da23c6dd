"""The sending side of a node: one link per other node, the batches, credit and window.

``Outbound.encode`` writes the envelope straight into the picked peer's batch buffer (one
``encode_into`` call, no per-message object) while the window has room. Nagle style: a
message sent when nothing is pending goes out at once (a lone request never waits); what
follows in the same loop turn is batched per peer and goes out when the turn ends (or after
``batch_delay`` when set), or at once at ``batch_max`` messages or ``DEFAULT_BATCH_BYTES``.
A frame is kept until the receiver says it is settled (DONE), which it does only when every
message in it was handled or dead-lettered. So ``window`` bounds memory end to end, a
peer's advertised credit bounds what is sent to it (the rest waits here, within the
window), ``flush`` can wait for remote work, and a gap costs a resend, not a loss.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import msgspec
import zmq

from bus._envelope import Envelope
from bus._errors import DecodeError, TransportError
from bus._transport import wake
from bus.backends.zeromq._errors import EncodeError, FrameTooLarge, RemoteHandlerError
from bus.backends.zeromq._keys import CurveKeys
from bus.backends.zeromq._reactor import Reactor
from bus.backends.zeromq._wire import (
    Done,
    Item,
    LinkPing,
    Nack,
    PeerInfo,
    Reply,
    array_header,
    link_back_decoder,
)

__all__ = ["DEFAULT_BATCH_BYTES", "Outbound", "PeerLink", "wire_of"]

_log = logging.getLogger("bus.zeromq.node")

#: A batch is sent once it holds this many bytes: measured here, a 60 KB send costs ~36 us and an
#: 80 KB one ~400 us (allocations past malloc's mmap threshold), so frames stay well below.
DEFAULT_BATCH_BYTES = 32 * 1024
_DATA_HEAD = b"\x93\x05"
_TURN = 256
_NOBLOCK = int(zmq.NOBLOCK)
_RELINK_FIRST = 0.02  # seconds before linking again to a node that refused the handshake
_ITEMS = msgspec.msgpack.Decoder(list[Item])


class PeerLink:
    """An outbound data link to one other node: its batch, credit, and the frames it has not
    settled (kept for a resend after a gap or a relink, or to redeliver if it is lost)."""

    __slots__ = (
        "backlog",
        "backlog_n",
        "buf",
        "buf_n",
        "credit",
        "data",
        "fd",
        "incarnation",
        "key",
        "name",
        "out_seq",
        "refusals",
        "relink",
        "sent",
        "sock",
        "subs",
        "unsettled",
    )

    def __init__(self, info: PeerInfo) -> None:
        self.name = info.name
        self.incarnation = info.incarnation
        self.data = info.data
        self.key = info.key
        self.credit = max(1, info.credit)
        self.subs = list(info.subs)
        self.sock: zmq.Socket[bytes] | None = None
        self.fd: int | None = None
        self.buf = bytearray()
        self.buf_n = 0
        self.out_seq = 0
        self.unsettled: dict[int, tuple[bytes, int]] = {}
        self.sent = 0  # messages in unsettled frames
        self.backlog: deque[tuple[bytes, int]] = deque()  # batches waiting for credit
        self.backlog_n = 0
        self.refusals = 0  # handshakes the peer refused: the relink backoff (see _refused)
        self.relink: asyncio.TimerHandle | None = None

    def info(self) -> PeerInfo:
        """The directory entry this link was made from."""
        return PeerInfo(self.name, self.incarnation, self.data, self.key, self.credit, self.subs)

    def load(self) -> int:
        """Messages from here the peer has not settled: sent, queued for credit, batched."""
        return self.sent + self.backlog_n + self.buf_n


class Outbound:
    """Every outbound link's sending state, and the window they share.

    ``in_flight`` counts message copies handed to a peer's batch and not yet settled; at
    ``window`` the transport stops taking messages (``try_send`` returns ``False``) and
    ``wait_credit`` parks the sender. ``requests`` are the requests sent from here, by
    envelope id, waiting for a reply on one of the links. ``to_wire`` gives the current
    offset from this node's monotonic clock to the broker's wall clock.
    """

    def __init__(
        self,
        *,
        node: str,
        incarnation: int,
        reactor: Reactor,
        counts: dict[str, int],
        curve: CurveKeys | None,
        max_frame: int,
        batch_max: int,
        batch_delay: float,
        window: int,
        heartbeat: float,
        to_wire: Callable[[], int],
    ) -> None:
        self.node = node
        self.incarnation = incarnation
        self.reactor = reactor
        self.counts = counts
        self.curve = curve
        self.max_frame = max_frame
        self.batch_max = batch_max
        self.batch_delay = batch_delay
        self.window = window
        self.heartbeat = heartbeat
        self.to_wire = to_wire
        self.ctx: zmq.Context[Any] | None = None  # set by the transport's start
        self._limit = max_frame - 64  # bytes of one frame's messages, past its header
        self.sent = 0  # message copies handed to a peer's batch (a plain int: hot path)
        self.in_flight = 0
        self._links_made = 0
        self.dirty: set[PeerLink] = set()
        self.flush_handle: asyncio.Handle | asyncio.TimerHandle | None = None
        self.credit_waiters: deque[asyncio.Future[None]] = deque()
        self.idle_waiters: list[asyncio.Future[None]] = []
        self.requests: dict[int, tuple[asyncio.Future[Any], str]] = {}
        # Messages each other node settled, by node name: a node killed without a word
        # took its own accounting with it, and what it had settled here (handled there)
        # may have caused work inside it that died too. The driver of a run says so instead
        # of claiming nothing was lost. One entry per node name the directory ever listed.
        self.settled_by: dict[str, int] = {}
        self._enc = msgspec.msgpack.Encoder()
        self._decode_back = link_back_decoder(self.max_frame).decode

    async def wait_credit(self) -> None:
        """Until the window has room again (or the transport closes: raises then)."""
        fut = self.reactor.loop.create_future()
        self.credit_waiters.append(fut)
        await fut

    async def idle(self) -> None:
        """Until every message sent so far is settled (or given up)."""
        while self.in_flight:
            fut = self.reactor.loop.create_future()
            self.idle_waiters.append(fut)
            await fut

    def ping(self, peers: list[PeerLink]) -> None:
        """A LINK_PING to every peer with unsettled frames: it repairs a lost frame, NACK
        or DONE (see ``Inbox._link_ping``)."""
        for peer in peers:
            if peer.unsettled:
                ping = LinkPing(peer.out_seq - 1, min(peer.unsettled))
                self.send_data(peer, self._enc.encode(ping))

    def close(self, node: str) -> None:
        """Stop: senders waiting for room fail, those waiting for idle are released."""
        if self.flush_handle is not None:
            self.flush_handle.cancel()
            self.flush_handle = None
        for fut in self.credit_waiters:
            if not fut.done():
                fut.set_exception(TransportError(f"transport {node!r} is closed"))
        self.credit_waiters.clear()
        wake(self.idle_waiters)

    def encode_env(self, wire: tuple[Any, ...]) -> bytes:
        try:
            return self._enc.encode(wire)
        except Exception as exc:  # any encoder failure: see encode
            raise not_encodable(wire[0], exc) from exc

    def encode(self, peer: PeerLink, wire: Any, names: list[str] | None, request: bool) -> None:
        """Append one message for ``peer`` to its batch; Nagle: the first of a loop turn
        goes at once. Runs on the publisher's call (``try_send``), so an encoding failure
        is raised to it as :class:`EncodeError`; ``Handover.peer_lost`` catches it and
        dead-letters that message instead."""
        buf = peer.buf
        mark = len(buf)
        try:
            self._enc.encode_into((wire, names, request), buf, -1)
        except Exception as exc:
            # Invariant: the batch holds only whole messages. The encoder writes in place
            # and stops wherever it fails (a RecursionError deep in a cyclic payload leaves
            # kilobytes), so cut back to the mark: the receiver would otherwise decode the
            # whole frame as malformed, and it and every message after it would be lost.
            # (Cutting back costs nothing when encoding succeeds; a separate buffer per
            # message would cost a copy of every message.) Any exception: RecursionError,
            # TypeError, OverflowError, ValueError and whatever a custom encoder raises.
            del buf[mark:]
            raise not_encodable(wire[0] if isinstance(wire, tuple) else "message", exc) from exc
        end = len(buf)
        if end > self._limit:
            size = end - mark
            if size > self._limit:
                del buf[mark:]
                topic = wire[0] if isinstance(wire, tuple) else "message"
                raise FrameTooLarge(
                    f"cannot send {topic!r}: {size} bytes encoded, frame limit {self.max_frame}"
                )
            # This message would push the batch past the frame limit: send the batch first.
            tail = bytes(buf[mark:])
            del buf[mark:]
            self._flush_peer(peer)
            peer.buf += tail
            end = size
        peer.buf_n += 1
        self.in_flight += 1
        self.sent += 1
        if self.flush_handle is None:
            if self.batch_delay:
                self.dirty.add(peer)
                self.flush_handle = self.reactor.loop.call_later(self.batch_delay, self._end_turn)
            else:
                # Nagle style: nothing was pending, so this one goes now; what follows in
                # the same loop turn is batched and sent when the turn ends.
                self._flush_peer(peer)
                self.flush_handle = self.reactor.loop.call_soon(self._end_turn)
            return
        if peer.buf_n == 1:
            self.dirty.add(peer)
        elif peer.buf_n >= self.batch_max or end >= DEFAULT_BATCH_BYTES:
            self._flush_peer(peer)

    def _end_turn(self) -> None:
        self.flush_handle = None
        self.flush_all()

    def flush_all(self) -> None:
        dirty = self.dirty
        while dirty:
            self._flush_peer(dirty.pop())

    def _flush_peer(self, peer: PeerLink) -> None:
        """Close the peer's batch into a frame: sent now if the peer has credit for it,
        queued behind its backlog otherwise."""
        n = peer.buf_n
        if not n:
            return
        body = array_header(n) + peer.buf
        peer.buf = bytearray()
        peer.buf_n = 0
        if peer.backlog or peer.sent >= peer.credit:
            peer.backlog.append((body, n))
            peer.backlog_n += n
            return
        self._send_frame(peer, body, n)

    def _send_frame(self, peer: PeerLink, body: bytes, n: int) -> None:
        seq = peer.out_seq
        peer.out_seq += 1
        peer.unsettled[seq] = (body, n)
        peer.sent += n
        self.counts["frames_out"] += 1
        self.send_data(peer, b"".join((_DATA_HEAD, self._enc.encode(seq), body)))

    def send_data(self, peer: PeerLink, frame: bytes) -> None:
        sock = peer.sock
        if sock is None:
            return
        try:
            sock.send(frame, _NOBLOCK)
        except zmq.Again:
            self._refused(peer)
            return
        except zmq.ZMQError as exc:
            # Closing: the frame stays unsettled, and is resent or redelivered from there.
            _log.warning("send to node %s failed: %s", peer.name, exc)
            return
        self.reactor.redrain(peer.fd, sock, self._drain, peer)

    def _refused(self, peer: PeerLink) -> None:
        """A DEALER with no high-water mark refuses a send only when its one pipe is gone,
        and here that means the peer refused the CURVE handshake: we connected a moment
        before its directory listed our key. ZeroMQ never retries a refused handshake, so
        link again, soon and then less often, and resend what is unsettled (the frames
        stay in ``unsettled`` until then)."""
        if peer.relink is not None:
            return
        delay = min(self.heartbeat, _RELINK_FIRST * 2**peer.refusals)
        peer.refusals += 1
        _log.info("node %s refused our data link; linking again in %.2fs", peer.name, delay)
        peer.relink = self.reactor.loop.call_later(delay, self._relink_refused, peer)

    def _relink_refused(self, peer: PeerLink) -> None:
        peer.relink = None
        self.counts["relinked"] += 1
        self.relink(peer)

    def connect(self, peer: PeerLink) -> None:
        assert self.ctx is not None
        sock: zmq.Socket[bytes] = zmq.Context.shadow(self.ctx.underlying).socket(zmq.DEALER)
        # Never reused, not even for a peer that comes back under the same name: a receiver
        # that still has state for an old identity would take new frames as duplicates.
        self._links_made += 1
        ident = f"{self.node}/{self.incarnation:x}/{self._links_made}"
        sock.setsockopt(zmq.IDENTITY, ident.encode())
        sock.setsockopt(zmq.SNDHWM, 0)  # bounded by the window, and a DEALER never drops
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 2 * self.max_frame)
        sock.setsockopt(zmq.LINGER, 0)
        if self.curve is not None and peer.key is not None:
            sock.curve_secretkey = self.curve.secret
            sock.curve_publickey = self.curve.public
            sock.curve_serverkey = peer.key
        try:
            sock.connect(peer.data)
        except zmq.ZMQError:
            sock.close(0)
            raise
        peer.sock = sock
        peer.fd = fd = sock.fileno()
        self.reactor.loop.add_reader(fd, self._drain, peer)

    def disconnect(self, peer: PeerLink) -> None:
        if peer.relink is not None:
            peer.relink.cancel()
            peer.relink = None
        if peer.fd is not None:
            self.reactor.forget(peer.fd)
            peer.fd = None
        if peer.sock is not None:
            peer.sock.close(0)
            peer.sock = None

    def relink(self, peer: PeerLink) -> None:
        """A fresh link to ``peer`` (after we were reset): number frames from zero again and
        resend everything unsettled; the receiver drops what it already had by id."""
        self.disconnect(peer)
        self.connect(peer)
        old = sorted(peer.unsettled.items())
        peer.unsettled = {}
        peer.out_seq = 0
        peer.sent = 0
        for _, (body, n) in old:
            self.counts["resent"] += 1
            self._send_frame(peer, body, n)

    def _drain(self, peer: PeerLink) -> None:
        """What comes back on an outbound link: DONE, replies, NACKs."""
        fd = peer.fd
        if fd is None:
            return
        self.reactor.drained(fd)
        sock = peer.sock
        assert sock is not None
        for _ in range(_TURN):
            try:
                frames = sock.recv_multipart(_NOBLOCK)
            except zmq.Again:
                break
            for frame in frames:
                self.counts["frames_in"] += 1
                if len(frame) > self.max_frame:
                    self.counts["oversized"] += 1
                    continue
                try:
                    msg = self._decode_back(frame)
                except DecodeError as exc:
                    self.counts["malformed"] += 1
                    _log.warning("dropped a malformed frame from node %s: %s", peer.name, exc)
                    continue
                if type(msg) is Done:
                    self._acked(peer, msg.seqs)
                elif type(msg) is Reply:
                    self._reply(msg)
                elif type(msg) is Nack:
                    self._resend(peer, msg.expected)
                if peer.sock is None:
                    return  # dropped while handling (closing)
        else:
            self.reactor.redrain(fd, None, self._drain, peer)
            return
        self.reactor.redrain(fd, sock, self._drain, peer)

    def _acked(self, peer: PeerLink, seqs: list[int]) -> None:
        settled = 0
        unsettled = peer.unsettled
        for seq in seqs:
            entry = unsettled.pop(seq, None)
            if entry is not None:
                settled += entry[1]
        if not settled:
            return
        peer.sent -= settled
        self.settled_by[peer.name] = self.settled_by.get(peer.name, 0) + settled
        backlog = peer.backlog
        while backlog and peer.sent < peer.credit:
            body, n = backlog.popleft()
            peer.backlog_n -= n
            self._send_frame(peer, body, n)
        self._settle(settled)

    def _settle(self, n: int) -> None:
        self.in_flight -= n
        self.counts["acked"] += n
        if self.credit_waiters:
            room = self.window - self.in_flight
            waiters = self.credit_waiters
            while waiters and room > 0:
                fut = waiters.popleft()
                if not fut.done():
                    fut.set_result(None)
                    room -= 1
        if not self.in_flight and self.idle_waiters:
            wake(self.idle_waiters)

    def _reply(self, msg: Reply) -> None:
        entry = self.requests.get(msg.request_id)
        self.counts["replies_received"] += 1
        if entry is None or entry[0].done():
            return  # answered already (locally, or by another node), or given up
        fut, topic = entry
        if msg.ok:
            fut.set_result(msg.value)
        else:
            fut.set_exception(RemoteHandlerError(topic, msg.error_type or "?", msg.error or ""))

    def _resend(self, peer: PeerLink, expected: int) -> None:
        for seq in sorted(s for s in peer.unsettled if s >= expected):
            self.counts["resent"] += 1
            body = peer.unsettled[seq][0]
            self.send_data(peer, b"".join((_DATA_HEAD, self._enc.encode(seq), body)))

    def take_unsettled(self, peer: PeerLink) -> list[Item]:
        """Everything sent or queued to ``peer`` and not settled, decoded, and the window
        room it held given back."""
        self.dirty.discard(peer)
        bodies = [body for body, _ in peer.unsettled.values()]
        bodies += [body for body, _ in peer.backlog]
        if peer.buf_n:
            bodies.append(array_header(peer.buf_n) + peer.buf)
        count = peer.sent + peer.backlog_n + peer.buf_n
        peer.unsettled.clear()
        peer.backlog.clear()
        peer.buf = bytearray()
        peer.sent = peer.backlog_n = peer.buf_n = 0
        items: list[Item] = []
        to_wire = self.to_wire()
        for body in bodies:
            for item in _ITEMS.decode(body):
                item.env.created -= to_wire
                items.append(item)
        if count:
            self.in_flight -= count
            if self.credit_waiters or self.idle_waiters:
                self._settle(0)
        return items


def wire_of(env: Envelope, to_wire: int) -> tuple[Any, ...]:
    """An envelope as it travels (see ``_wire``): its fields without ``context`` and
    ``reply``, ``created`` moved to the broker's wall clock."""
    return (
        env.topic, env.payload, env.priority, env.id, env.session_id, env.correlation_id,
        env.causation_id, env.trace, env.created + to_wire, env.hops, env.source,
    )  # fmt: skip


def not_encodable(topic: str, exc: BaseException) -> EncodeError:
    return EncodeError(
        f"cannot send {topic!r} to other nodes: its payload is not msgpack-encodable "
        f"({exc}); use dicts, lists, str, numbers, bytes or msgspec Structs"
    )
