"""The receiving side of a node: its data socket, one link per publisher, receipts, dedup.

Each data frame gets one :class:`FrameReceipt` shared by its envelopes; the bus settles it
once per subscription that took a message, and the frame is acknowledged (DONE) when all are
done. DONEs made in one loop turn go back as one message per link; a request's answer goes
back at once. A full ``block`` mailbox parks the rest of the frame (and later frames, in
order) behind one task, so the readers keep answering heartbeats while backpressure holds;
what can pile up is bounded by the credit this node advertised.

One invariant crosses into the sending side: a DONE settles its message for good, so what
the handlers emitted while handling it must reach libzmq first. The :class:`Inbox` does not
know the outbound links; it is given ``flush_outbound`` and calls it before every DONE.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import zmq

from bus._envelope import Envelope
from bus._errors import BusClosedError, DecodeError, QueueFullError
from bus._transport import BusPort, Receipt
from bus.backends.zeromq._errors import ConnectError, EncodeError
from bus.backends.zeromq._keys import CurveKeys
from bus.backends.zeromq._reactor import Reactor
from bus.backends.zeromq._wire import Data, Done, Item, LinkPing, Nack, link_in_decoder, oversized

__all__ = ["FrameReceipt", "InboundLink", "Inbox"]

_log = logging.getLogger("bus.zeromq.node")

_TURN = 256
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
#: Frames a LINK_PING may have DONE said again for, at most (the window bounds them anyway).
_REDONE_MAX = 4096


class InboundLink:
    """An inbound data link: one publisher's DEALER, as this node's ROUTER sees it."""

    __slots__ = ("control", "done", "expected", "ident", "nacked", "open")

    def __init__(self, ident: bytes) -> None:
        self.ident = ident
        self.expected = 0  # next data seq expected on the link
        self.nacked: int | None = None
        self.done: list[int] = []
        self.control: list[bytes] = []  # replies, sent before the link's next DONE
        self.open: set[int] = set()  # frames taken and not yet settled


class FrameReceipt(Receipt):
    """Settled once per subscription that took one of the frame's messages.

    A closing bus gives back what it will not handle (``release``, or a settle with
    :class:`~bus.BusClosedError`, which a bus sends only while closing: ``off`` waits for
    its backlog). Such a frame is never acknowledged: it stays open (a LINK_PING does not
    say DONE for it either), and when this node's BYE takes it out of the directory the
    publisher redelivers the frame to another member of the group, or dead-letters it as
    ``node_lost`` there if there is none. Its other messages, if any were handled here,
    come again to that member: at least once, never lost."""

    __slots__ = ("armed", "inbox", "link", "pending", "released", "seq")

    def __init__(self, inbox: Inbox, link: InboundLink, seq: int) -> None:
        self.inbox = inbox
        self.link = link
        self.seq = seq
        self.pending = 0
        self.armed = False
        self.released = False

    def expect(self, count: int) -> None:
        self.pending += count

    def settle(self, result: Any, error: BaseException | None) -> None:
        if error is not None and isinstance(error, BusClosedError):
            self.released = True
        self.pending -= 1
        if not self.pending and self.armed:
            self.inbox.settled(self)

    def release(self) -> None:
        self.released = True
        self.pending -= 1
        if not self.pending and self.armed:
            self.inbox.settled(self)

    def arm(self) -> None:
        """Every message of the frame was offered to the bus; settle when they are done."""
        self.armed = True
        if not self.pending:
            self.inbox.settled(self)


class _RequestReceipt(Receipt):
    """A request's receipt: the first answer (or failure) goes back on the link."""

    __slots__ = ("answered", "env", "frame")

    def __init__(self, frame: FrameReceipt, env: Envelope) -> None:
        self.frame = frame
        self.env = env
        self.answered = False

    def expect(self, count: int) -> None:
        self.frame.expect(count)

    def release(self) -> None:
        self.answered = True  # given back: the member it is redelivered to answers
        self.frame.release()

    def settle(self, result: Any, error: BaseException | None) -> None:
        if error is not None and isinstance(error, BusClosedError):
            self.release()
            return
        # The frame first: when this settles it, its DONE goes in the answer's message.
        self.frame.settle(result, error)
        if not self.answered and (error is not None or result is not None):
            self.answered = True
            self.frame.inbox.answer(self.frame.link, self.env, result, error)


class Inbox:
    """The data socket other nodes send to, its links, and what was already delivered.

    ``to_wire`` gives the current offset from this node's monotonic clock to the broker's
    wall clock (it moves with every heartbeat), ``flush_outbound`` sends what the handlers
    emitted (see the module's invariant).
    """

    def __init__(
        self,
        *,
        node: str,
        reactor: Reactor,
        counts: dict[str, int],
        max_frame: int,
        dedup_window: int,
        flush_outbound: Callable[[], None],
        to_wire: Callable[[], int],
    ) -> None:
        self.node = node
        self.reactor = reactor
        self.counts = counts
        self.max_frame = max_frame
        self.flush_outbound = flush_outbound
        self.to_wire = to_wire
        self.port: BusPort | None = None
        self.server: zmq.Socket[bytes] | None = None
        self.fd: int | None = None
        self.links: dict[bytes, InboundLink] = {}
        self.dirty: set[InboundLink] = set()
        self.handle: asyncio.Handle | None = None
        self.parked: deque[tuple[FrameReceipt, list[Item], int]] = deque()
        self.unparking = False
        self.serving = False
        # Two generations of seen ids: the newest ``dedup_window`` at least, with no
        # per-message bookkeeping beyond one set add (the old generation is dropped whole).
        self.seen: set[Any] = set()
        self.seen_old: set[Any] = set()
        self.dedup_window = dedup_window
        self._enc = msgspec.msgpack.Encoder()
        self._decode = link_in_decoder(self.max_frame).decode

    def bind(
        self, ctx: zmq.Context[Any], bind: str, curve: CurveKeys | None, authenticator: Any
    ) -> str:
        """Bind the data socket (a CURVE server with this node's keys when ``curve``, behind
        ``authenticator``'s ZAP gate) and read it from now on; the endpoint it got."""
        server: zmq.Socket[bytes] = zmq.Context.shadow(ctx.underlying).socket(zmq.ROUTER)
        server.setsockopt(zmq.SNDHWM, 0)  # replies and DONEs: bounded by the senders' windows
        server.setsockopt(zmq.RCVHWM, 0)  # bounded by the credit we advertise
        server.setsockopt(zmq.MAXMSGSIZE, 2 * self.max_frame)
        server.setsockopt(zmq.LINGER, 1000)
        if curve is not None and authenticator is not None:
            server.curve_secretkey = curve.secret
            server.curve_publickey = curve.public
            server.curve_server = True
        try:
            server.bind(bind)
        except zmq.ZMQError as exc:
            server.close(0)
            raise ConnectError(
                f"node {self.node!r} cannot bind its data socket {bind}: {exc}"
            ) from exc
        self.server = server
        self.fd = server.fileno()
        self.reactor.loop.add_reader(self.fd, self.drain)
        return server.getsockopt_string(zmq.LAST_ENDPOINT)

    def close(self, linger: int | None) -> None:
        if self.fd is not None:
            self.reactor.loop.remove_reader(self.fd)
            self.fd = None
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        if self.server is not None:
            self.server.close(linger)
            self.server = None

    def waiting(self) -> bool:
        """Input waits on the data socket (frames routed here that are not read yet)."""
        server = self.server
        # (pyzmq types getsockopt as int | bytes; ZMQ_EVENTS is an int.)
        return server is not None and bool(server.getsockopt(_EVENTS) & 1)  # type: ignore[operator]

    def forget_unlisted(self, live: set[bytes]) -> None:
        """Links from nodes no longer listed (or listed with a new incarnation) are over:
        their senders redeliver whatever those links had not settled."""
        for ident in [i for i in self.links if i.rsplit(b"/", 1)[0] not in live]:
            del self.links[ident]

    def drain(self) -> None:
        """The data socket's reader: take every frame it has without waiting, then send the
        DONEs handling them made, one message per link. Reschedules itself after ``_TURN``
        messages so the loop stays fair."""
        fd = self.fd
        server = self.server
        if fd is None or server is None:
            return
        self.reactor.drained(fd)
        self.serving = True
        try:
            for _ in range(_TURN):
                try:
                    parts = server.recv_multipart(_NOBLOCK)
                except zmq.Again:
                    break
                ident = parts[0]
                link = self.links.get(ident)
                if link is None:
                    link = self._new_link(ident)
                    if link is None:
                        continue
                for i in range(1, len(parts)):
                    self._frame(link, parts[i])
            else:
                self.reactor.redrain(fd, None, self.drain)
            self.flush()
            self.reactor.redrain(fd, server, self.drain)
        finally:
            self.serving = False

    def _new_link(self, ident: bytes) -> InboundLink | None:
        """The first frame of a link not seen before. A publisher names each link it makes
        ``node/incarnation/n``, ``n`` counting up (see ``Outbound.connect``), and relinks only
        after closing the old one, resending on the new link whatever the old one had not
        settled. So a higher ``n`` from the same node run replaces the links before it: they
        are dropped here, or the receiver would keep one per relink for the node's whole
        life. A frame that still arrives on a replaced link (``None``) is dropped too; its
        messages come again on the new one."""
        prefix, _, number = ident.rpartition(b"/")
        if prefix and number.isdigit():
            n = int(number)
            for other in [i for i in self.links if i.rpartition(b"/")[0] == prefix]:
                other_n = other.rpartition(b"/")[2]
                if other_n.isdigit() and int(other_n) > n:
                    self.counts["stale_frames"] += 1
                    return None
                self.dirty.discard(self.links.pop(other))
        link = self.links[ident] = InboundLink(ident)
        return link

    def _frame(self, link: InboundLink, frame: bytes) -> None:
        counts = self.counts
        if oversized(frame, self.max_frame, counts, link.ident, _log):
            return
        try:
            msg = self._decode(frame)
        except DecodeError as exc:
            counts["malformed"] += 1
            n = counts["malformed"]
            if n <= 10 or not n % 1000:
                _log.warning("dropped malformed frame #%d from %r: %s", n, link.ident, exc)
            return
        try:
            if type(msg) is Data:
                self._data(link, msg)
            else:
                self._link_ping(link, msg)
        except Exception:
            _log.exception("node %s failed to handle a frame; dropped it", self.node)

    def _link_ping(self, link: InboundLink, ping: LinkPing) -> None:
        """The publisher still waits for frames from ``ping.first_unsettled`` on. Frames or
        answers can be lost either way (a ROUTER drops what it sends to a peer whose pipe is
        down, e.g. while it reconnects), so each ping repairs both: a gap is NACKed again,
        and DONE is said again for every frame since then that is settled here."""
        if ping.last_seq >= link.expected:
            # Frames were sent that we never got (or our NACK was lost): ask again.
            self._gap(link)
        first = max(ping.first_unsettled, link.expected - _REDONE_MAX)
        again = [seq for seq in range(first, link.expected) if seq not in link.open]
        if again:
            link.done += again
            self.dirty.add(link)
            self._schedule()

    def _gap(self, link: InboundLink) -> None:
        self.counts["gaps"] += 1
        link.nacked = link.expected
        link.control.append(self._enc.encode(Nack(link.expected)))
        self.dirty.add(link)
        self._schedule()

    def _data(self, link: InboundLink, msg: Data) -> None:
        seq = msg.seq
        if seq != link.expected:
            if seq < link.expected:
                self.counts["duplicate_frames"] += 1
                if seq not in link.open:
                    # Settled already: a resend crossed our DONE; say it again.
                    link.done.append(seq)
                    self.dirty.add(link)
            elif link.nacked != link.expected:
                _log.warning(
                    "gap on the link from %r: expected frame %d, got %d; asked to resend",
                    link.ident,
                    link.expected,
                    seq,
                )
                self._gap(link)
            else:
                self.counts["gaps"] += 1
            return
        link.expected = seq + 1
        link.nacked = None
        self.counts["received"] += len(msg.items)
        receipt = FrameReceipt(self, link, seq)
        link.open.add(seq)
        if self.parked or self.unparking:
            self.parked.append((receipt, msg.items, 0))
            return
        waiting = self._deliver(receipt, msg.items, 0)
        if waiting is not None:
            self.unparking = True
            self.reactor.background(self._unpark(waiting))

    def _deliver(
        self, receipt: FrameReceipt, items: list[Item], start: int
    ) -> Awaitable[None] | None:
        """Offer the frame's messages from ``start`` on; on a full ``block`` mailbox, park
        the rest in front of the queue and return what to wait for."""
        assert self.port is not None
        deliver = self.port.deliver
        seen, seen_old, window = self.seen, self.seen_old, self.dedup_window
        to_wire = self.to_wire()
        for i in range(start, len(items)):
            item = items[i]
            env = item.env
            if not 0 <= env.priority <= 2:
                self.counts["malformed"] += 1
                _log.warning("dropped message %d: priority %r out of range", env.id, env.priority)
                continue
            names = item.names
            key = env.id if names is None else (env.id, *names)
            if key in seen or key in seen_old:
                self.counts["duplicates"] += 1
                continue
            seen.add(key)
            if len(seen) >= window:
                self.seen_old = seen_old = seen
                self.seen = seen = set()
            env.created -= to_wire  # decoded: context is None, reply is set here
            env.reply = receipt if not item.request else _RequestReceipt(receipt, env)
            try:
                waiting = deliver(env, names)
            except BusClosedError:
                # The bus stopped taking messages: leave the frame unsettled; the publisher
                # hands it to another member when this node leaves the directory.
                return None
            except QueueFullError:
                self.counts["rejected"] += 1
                continue
            except Exception:
                _log.exception("delivering message %d (%s) failed", env.id, env.topic)
                env.reply.expect(0)
                continue
            if waiting is not None:
                self.parked.appendleft((receipt, items, i + 1))
                return waiting
        receipt.arm()
        return None

    async def _unpark(self, waiting: Awaitable[None]) -> None:
        try:
            while True:
                try:
                    await waiting
                except QueueFullError:
                    self.counts["rejected"] += 1
                except BusClosedError:
                    self.parked.clear()
                    return
                while True:
                    if not self.parked:
                        return
                    receipt, items, start = self.parked.popleft()
                    next_wait = self._deliver(receipt, items, start)
                    if next_wait is not None:
                        waiting = next_wait
                        break
        finally:
            self.unparking = False

    def settled(self, receipt: FrameReceipt) -> None:
        if receipt.released:
            self.counts["released"] += 1  # no DONE: see FrameReceipt
            return
        link = receipt.link
        link.open.discard(receipt.seq)
        if self.links.get(link.ident) is link:
            link.done.append(receipt.seq)
            self.dirty.add(link)
            self._schedule()

    def answer(
        self, link: InboundLink, env: Envelope, result: Any, error: BaseException | None
    ) -> None:
        if error is None:
            try:
                value = msgspec.Raw(self._enc.encode(result))
            except Exception as exc:  # RecursionError too: a cyclic answer
                error = EncodeError(f"reply to {env.topic!r} is not msgpack-encodable: {exc}")
        reply: tuple[int, int, bool, msgspec.Raw | None, str | None, str | None]
        if error is not None:
            reply = (9, env.id, False, None, type(error).__name__, str(error))
        else:
            reply = (9, env.id, True, value, None, None)
        self.counts["replies_sent"] += 1
        link.control.append(self._enc.encode(reply))
        self.dirty.add(link)
        if not self.serving:
            # The asker is waiting: answer now (with the DONEs this turn made so far), not
            # at the end of the loop turn.
            self.flush()

    def _schedule(self) -> None:
        if not self.serving and self.handle is None:
            self.handle = self.reactor.loop.call_soon(self.flush)

    def flush(self) -> None:
        """Replies, NACKs and DONEs made this loop turn: one message per link, after what
        the handlers emitted (``flush_outbound``; see the module's invariant)."""
        self.flush_outbound()
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        server = self.server
        dirty = self.dirty
        while dirty:
            link = dirty.pop()
            frames = [link.ident]
            if link.control:
                frames += link.control
                link.control = []
            if link.done:
                frames.append(self._enc.encode(Done(link.done)))
                link.done = []
            if server is None or len(frames) == 1:
                continue
            try:
                server.send_multipart(frames, _NOBLOCK)
            except zmq.ZMQError as exc:
                _log.warning("answer to %r failed: %s", link.ident, exc)
        if server is not None and not self.serving:
            self.reactor.redrain(self.fd, server, self.drain)
