"""The sending side of a node: the write-out queue, the publish window, the stream acks.

Everything this node sends (publishes, acks and naks, pull requests, answers, sync acks)
goes through one queue, written out by one task per loop turn, so a burst costs one task
and arrives in order. A publish asks for its stream ack on this node's ack inbox; at most
``window`` wait for one (``try_send`` says "wait" past that). One not acknowledged within
``ack_timeout`` (the server restarted, a route moved) goes again under the same
``Nats-Msg-Id``, which the stream dedups. Once acked, the stream sequence is remembered per
remote consumer it was routed to, until that consumer's ack floor passes it: that is what
``flush`` and ``stats()['in_flight']`` wait for beyond the stream ack.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg

from bus._envelope import Envelope
from bus._errors import DecodeError, TransportError
from bus._transport import BusPort, wake
from bus.backends.nats._wire import decode_json

__all__ = ["Outbox", "Pending", "Publisher"]

_log = logging.getLogger("bus.nats")

#: Seconds between looks at the remote groups' ack floors while a flush waits for them, and
#: while nothing waits (``stats()['in_flight']`` is then at most this stale).
_TRACK_EVERY = 0.02
_TRACK_IDLE = 0.2


class Pending:
    """A publish waiting for its stream ack."""

    __slots__ = ("body", "env", "msg_id", "sent", "subject", "tracked")

    def __init__(
        self,
        env: Envelope | None,
        subject: str,
        body: bytes,
        msg_id: str,
        tracked: list[str],
        sent: float,
    ) -> None:
        self.env = env
        self.subject = subject
        self.body = body
        self.msg_id = msg_id
        self.tracked = tracked
        self.sent = sent


class Outbox:
    """The one write-out queue of a node: publishes, acks and naks, pull requests, answers.

    ``out`` is one deque for the node's life: the parts that queue in bulk hold it.
    """

    __slots__ = ("loop", "nc", "node", "out", "writer")

    def __init__(self, node: str) -> None:
        self.node = node
        self.loop: asyncio.AbstractEventLoop | None = None  # set by the transport's start
        self.nc: Any = None
        self.out: deque[tuple[str, str, bytes, dict[str, str] | None]] = deque()
        self.writer: asyncio.Task[None] | None = None

    def send(self, subject: str, body: bytes) -> None:
        self.out.append((subject, "", body, None))
        self.schedule_write()

    def schedule_write(self) -> None:
        if (self.writer is None or self.writer.done()) and self.loop is not None:
            self.writer = self.loop.create_task(self.write_out())

    async def write_out(self) -> None:
        nc = self.nc
        out = self.out
        while out:
            subject, reply, body, headers = out.popleft()
            try:
                await nc.publish(subject, body, reply=reply, headers=headers)
            except Exception as exc:  # disconnected with a full buffer, closed: resent later
                if reply:
                    continue  # a publish: the ack timeout sends it again
                _log.warning("NATS node %s: could not send to %s: %s", self.node, subject, exc)


class Publisher:
    """The publishes awaiting their stream ack (``pending``) and the
    remote consumers' ack floors still to pass what was published (``tracked``).

    ``pending`` and the waiter lists are one object each for the node's life (changed in
    place, never replaced): the transport's hot path holds them directly. A publish goes
    out through the ``outbox``, in order with everything else this node sends.
    ``requests`` is the reply part's table, failed here when the stream refuses a request;
    ``live_consumers`` names the remote consumers the directory still lists.
    """

    __slots__ = (
        "ack_prefix",
        "counts",
        "credit_waiters",
        "idle_waiters",
        "js",
        "live_consumers",
        "node",
        "out",
        "pending",
        "port",
        "pub_seq",
        "requests",
        "schedule_write",
        "stream",
        "track_wake",
        "tracked",
        "window",
    )

    def __init__(
        self,
        *,
        node: str,
        stream: str,
        ack_prefix: str,
        window: int,
        outbox: Outbox,
        counts: dict[str, int],
        requests: dict[int, asyncio.Future[Any]],
        live_consumers: Callable[[], set[str]],
    ) -> None:
        self.node = node
        self.stream = stream
        self.ack_prefix = ack_prefix
        self.window = window
        self.counts = counts
        self.requests = requests
        self.live_consumers = live_consumers
        self.out = outbox.out
        self.schedule_write = outbox.schedule_write
        self.js: Any = None  # set by the transport's start
        self.port: BusPort | None = None
        self.pub_seq = itertools.count(1)
        self.pending: dict[int, Pending] = {}
        self.credit_waiters: deque[asyncio.Future[None]] = deque()
        self.idle_waiters: list[asyncio.Future[None]] = []
        self.tracked: dict[str, deque[int]] = {}
        self.track_wake = asyncio.Event()

    def publish(
        self, env: Envelope | None, subject: str, body: bytes, msg_id: str, tracked: list[str]
    ) -> None:
        seq = next(self.pub_seq)
        pub = Pending(env, subject, body, msg_id, tracked, time.monotonic())
        self.pending[seq] = pub
        self.counts["published"] += 1
        self.out.append((subject, f"{self.ack_prefix}.{seq}", body, {"Nats-Msg-Id": msg_id}))
        self.schedule_write()

    async def on_ack(self, msg: Msg) -> None:
        seq = int(msg.subject[len(self.ack_prefix) + 1 :])
        pub = self.pending.get(seq)
        if pub is None:
            return  # the ack of a publish resent meanwhile
        headers = msg.headers
        if headers and headers.get("Status") == "503":
            return  # no stream answered (yet): the ack timeout resends it
        del self.pending[seq]
        try:
            answer = decode_json(msg.data)
        except DecodeError:
            answer = {"error": {"description": f"unreadable ack {msg.data[:80]!r}"}}
        error = answer.get("error")
        if error is not None:
            self._refused(pub, str(error.get("description", error)))
        else:
            self.counts["acked_by_stream"] += 1
            if answer.get("duplicate"):
                self.counts["duplicates"] += 1
            stream_seq = answer.get("seq", 0)
            for consumer in pub.tracked:
                dq = self.tracked.get(consumer)
                if dq is None:
                    dq = self.tracked[consumer] = deque()
                dq.append(stream_seq)
            if pub.tracked:
                self.track_wake.set()
        self._after_ack()

    def _refused(self, pub: Pending, why: str) -> None:
        if pub.env is None or self.port is None:
            _log.warning("NATS node %s: %s refused: %s", self.node, pub.subject, why)
            return
        error = TransportError(f"NATS refused {pub.subject!r}: {why}")
        fut = self.requests.pop(pub.env.id, None)
        if fut is not None and not fut.done():
            fut.set_exception(error)
        self.port.dead_letter(pub.env, "<remote>", "transport_error", error)

    def _after_ack(self) -> None:
        if self.credit_waiters and len(self.pending) < self.window:
            _wake_one(self.credit_waiters)
        if self.idle_waiters and not self.pending:
            wake(self.idle_waiters)

    def resend(self, now: float, ack_timeout: float) -> None:
        """Send again, under the same ``Nats-Msg-Id``, what waited ``ack_timeout`` for its
        stream ack; then write out whatever the queue holds."""
        for seq, pub in list(self.pending.items()):
            if now - pub.sent > ack_timeout:
                pub.sent = now
                self.counts["resent"] += 1
                self.out.append(
                    (pub.subject, f"{self.ack_prefix}.{seq}", pub.body, {"Nats-Msg-Id": pub.msg_id})
                )
        if self.out:
            self.schedule_write()

    def reconnected(self) -> None:
        """Resend what waits for a stream ack at the next tick rather than at its timeout."""
        for pub in self.pending.values():
            pub.sent = 0.0

    def busy(self) -> bool:
        """Whether anything waits for its stream ack or for a remote consumer's ack floor."""
        return bool(self.pending) or any(self.tracked.values())

    def in_flight(self) -> int:
        return len(self.pending) + sum(len(d) for d in self.tracked.values())

    async def track(self) -> None:
        """Follow the ack floor of each remote group this node published to, so ``flush``
        and ``in_flight`` know when receivers are done."""
        while True:
            await self.track_wake.wait()
            self.track_wake.clear()
            while any(self.tracked.values()):
                live = self.live_consumers()
                for consumer, dq in list(self.tracked.items()):
                    if not dq:
                        continue
                    if consumer not in live:
                        dq.clear()  # that group left the directory: nobody to wait for
                        continue
                    try:
                        info = await self.js.consumer_info(self.stream, consumer)
                    except nats.js.errors.NotFoundError:
                        dq.clear()
                        continue
                    except Exception:  # disconnected, timeout: look again
                        break
                    floor = info.ack_floor.stream_seq if info.ack_floor else 0
                    while dq and dq[0] <= floor:
                        dq.popleft()
                if self.idle_waiters and not any(self.tracked.values()):
                    wake(self.idle_waiters)
                # Often while a flush waits on it; otherwise only to keep ``in_flight`` fresh
                # (each look is a JetStream API call per consumer).
                await asyncio.sleep(_TRACK_EVERY if self.idle_waiters else _TRACK_IDLE)
            if self.idle_waiters and not self.pending:
                wake(self.idle_waiters)

    def close(self) -> None:
        """The transport closed: whoever waits for room in the window gets the error, and
        whoever waits for it to drain is let go."""
        for fut in self.credit_waiters:
            if not fut.done():
                fut.set_exception(TransportError(f"transport {self.node!r} is closed"))
        wake(self.idle_waiters)


def _wake_one(waiters: deque[asyncio.Future[None]]) -> None:
    while waiters:
        fut = waiters.popleft()
        if not fut.done():
            fut.set_result(None)
            return
