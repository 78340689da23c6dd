"""A node's session with the broker: the handshake, heartbeats, clock offset and rejoin.

The broker keeps the directory (who is alive, what each subscribes to, where its data
socket listens) and the heartbeats; no message goes through it. The session owns the control
socket and what only it knows: whether the broker hears this node, which broker run it is
(``epoch``), this node's subscriptions as last sent and acknowledged, and the shift from
this node's monotonic clock to the broker's reference clock (``to_wire``, see ``_wire``),
which stamps every envelope that leaves and unstamps every one that arrives. A node that
reads the broker's monotonic clock (same :func:`~bus._clock.clock_domain`) takes the
broker's own shift from WELCOME: exact, so queue waits between such nodes are exact. Any
other node estimates it NTP style from the lowest-delay of the last heartbeats; there the
estimate is only good to half that heartbeat's round trip (``rtt``), and under load, when
the reply waits for a busy loop, it was measured off by milliseconds (issue #24).

What a directory or a rejoin means for the links is not the session's business: it calls
``on_directory`` with each listing (and acknowledges it after), ``on_new_broker`` when a new
broker run welcomes it (the links are intact, the first listings partial) and ``on_reset``
when the same broker takes it back after dropping it (the others dropped its links).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Callable
from typing import Any, cast

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from bus._clock import clock_domain, mono_to_wall
from bus._errors import DecodeError
from bus._transport import wake
from bus.backends.zeromq._errors import AuthenticationFailed, ConnectError
from bus.backends.zeromq._keys import CurveKeys
from bus.backends.zeromq._reactor import Reactor
from bus.backends.zeromq._wire import (
    PROTOCOL,
    Directory,
    DirectoryAck,
    Hello,
    PeerInfo,
    Ping,
    Pong,
    Reset,
    Subs,
    SubsAck,
    Welcome,
    control_down_decoder,
)

__all__ = ["BrokerSession"]

_log = logging.getLogger("bus.zeromq.node")

_TURN = 256
_NOBLOCK = int(zmq.NOBLOCK)
_CLOCK_SAMPLES = 8
_AUTH_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class BrokerSession:
    """This node's membership at the broker at ``endpoint`` (see the module docstring)."""

    def __init__(
        self,
        *,
        node: str,
        endpoint: str,
        incarnation: int,
        credit: int,
        curve: CurveKeys | None,
        server_key: bytes | None,
        max_frame: int,
        heartbeat: float,
        liveness: int,
        connect_timeout: float,
        reactor: Reactor,
        counts: dict[str, int],
        on_directory: Callable[[list[PeerInfo]], None],
        on_new_broker: Callable[[float], None],
        on_reset: Callable[[], None],
    ) -> None:
        self.node = node
        self.endpoint = endpoint
        self.incarnation = incarnation
        self.credit = credit
        self.curve = curve
        self.server_key = server_key
        self.max_frame = max_frame
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.connect_timeout = connect_timeout
        self.reactor = reactor
        self.counts = counts
        self.on_directory = on_directory
        self.on_new_broker = on_new_broker
        self.on_reset = on_reset
        self.data_endpoint = ""  # where this node's data socket listens, said in HELLO
        self.sock: zmq.asyncio.Socket | None = None
        self.sync: zmq.Socket[bytes] | None = None  # the same socket, for non-blocking use
        self.fd: int | None = None
        self.connected = False
        self.epoch: int | None = None
        self.subs: list[tuple[str, str]] = []
        self.subs_version = 0
        self.subs_acked = 0
        self.sync_waiters: list[asyncio.Future[None]] = []
        self.last_heard = 0.0
        self.clock: deque[tuple[int, int]] = deque(maxlen=_CLOCK_SAMPLES)
        self.offset = 0
        self.rtt = 0
        self.mono_to_wall = mono_to_wall()
        # Until WELCOME says otherwise: the broker's reference is our wall clock.
        self.to_wire = self.mono_to_wall
        self.shared_clock = False  # the broker reads our monotonic clock: to_wire is exact
        self.reference: tuple[str, int] | None = None  # the broker's (clock, mono_to_wall)
        self._enc = msgspec.msgpack.Encoder()
        self._decode = control_down_decoder(self.max_frame).decode

    async def join(self, ctx: zmq.asyncio.Context) -> None:
        """Connect to the broker and handshake; then read the control socket from a plain
        reader callback. On failure the socket stays for ``close`` to release."""
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.node.encode())
        sock.setsockopt(zmq.MAXMSGSIZE, 2 * self.max_frame)
        sock.setsockopt(zmq.LINGER, 1000)
        if self.curve is not None and self.server_key is not None:
            sock.curve_secretkey = self.curve.secret
            sock.curve_publickey = self.curve.public
            sock.curve_serverkey = self.server_key
        monitor = sock.get_monitor_socket(_AUTH_EVENTS)
        try:
            sock.connect(self.endpoint)
        except zmq.ZMQError as exc:
            sock.disable_monitor()
            monitor.close(0)
            sock.close(0)
            raise ConnectError(f"cannot connect to {self.endpoint}: {exc}") from exc
        self.sock = sock
        self.sync = zmq.Socket.shadow(sock.underlying)
        try:
            await self._handshake(monitor)
        finally:
            sock.disable_monitor()
            monitor.close(0)
        # From here on the socket is read by a plain reader callback on its FD (no task,
        # no future per wake-up) and written with non-blocking sends.
        fd = self.sync.fileno()  # ZMQ_FD, typed int (getsockopt is typed int | bytes)
        self.fd = fd
        self.reactor.loop.add_reader(fd, self.drain)
        self.reactor.loop.call_soon(self.drain)  # frames that came in behind the handshake's

    async def _handshake(self, monitor: zmq.asyncio.Socket) -> None:
        """HELLO until WELCOME and the first DIRECTORY: a ready handshake, not a sleep. A
        CURVE refusal shows up on the monitor socket as a failed handshake, reported so."""
        assert self.sock is not None
        loop = self.reactor.loop
        deadline = loop.time() + self.connect_timeout
        refused: str | None = None
        welcomed = False
        self.send(self.hello())
        # pyzmq types its asyncio socket's receives as Awaitable; they are Futures.
        recv = cast("asyncio.Future[bytes]", self.sock.recv())
        watch = cast("asyncio.Future[list[bytes]]", monitor.recv_multipart())
        try:
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    break
                waiting: set[asyncio.Future[Any]] = {recv, watch}
                done, _ = await asyncio.wait(
                    waiting, timeout=min(left, 0.5), return_when=asyncio.FIRST_COMPLETED
                )
                if watch in done:
                    # A refused handshake is final (ZeroMQ would retry and fail forever).
                    event = parse_monitor_message(watch.result())
                    refused = f"{zmq.Event(event['event']).name}, code {event['value']}"
                    break
                if recv in done:
                    frame = recv.result()
                    try:
                        msg = self._decode(frame)
                    except DecodeError:
                        self.counts["malformed"] += 1
                        msg = None
                    if isinstance(msg, Welcome):
                        welcomed = True
                        self.epoch = msg.epoch
                        self._reference(msg)
                    elif msg is not None:
                        self.handle(msg)
                    if welcomed and isinstance(msg, Directory):
                        # Ready only once we know what the others subscribe to: a publish
                        # right after start() must not miss a remote subscriber.
                        self._welcomed()
                        return
                    recv = cast("asyncio.Future[bytes]", self.sock.recv())
                elif not done:
                    self.send(self.hello())  # the broker may have started after us
        finally:
            recv.cancel()
            watch.cancel()
            await asyncio.gather(recv, watch, return_exceptions=True)
        secured = " with CURVE" if self.curve is not None else ""
        if refused is not None and self.curve is not None:
            raise AuthenticationFailed(
                f"broker at {self.endpoint} refused node {self.node!r}{secured}: the CURVE "
                f"handshake failed ({refused}); check the server key and that this node's "
                f"public key is in the broker's allow-list"
            )
        if refused is not None:
            raise AuthenticationFailed(
                f"broker at {self.endpoint} refused node {self.node!r}: the handshake failed "
                f"({refused}); the broker probably requires CURVE (pass curve= and server_key=)"
            )
        raise ConnectError(
            f"no answer from the broker at {self.endpoint} within {self.connect_timeout}s "
            f"(node {self.node!r}{secured}): is the broker running there"
            + ("; are the CURVE keys right?" if self.curve is not None else "?")
        )

    def hello(self) -> bytes:
        return self._enc.encode(
            Hello(
                PROTOCOL,
                self.node,
                self.incarnation,
                self.credit,
                self.subs_version,
                list(self.subs),
                self.data_endpoint,
                self.curve.public if self.curve is not None else None,
            )
        )

    def _welcomed(self) -> None:
        self.connected = True
        self.last_heard = self.reactor.loop.time()
        # A clock sample now, so a short run knows the offset before the first heartbeat.
        self.send(self._enc.encode(Ping(time.monotonic_ns())))

    def _reference(self, welcome: Welcome) -> None:
        """Take the reference clock of the broker that welcomed us. A new broker run may
        have another: the samples taken against the old one are dropped."""
        reference = (welcome.clock, welcome.mono_to_wall)
        if reference == self.reference:
            return
        self.reference = reference
        self.clock.clear()
        self.shared_clock = welcome.clock == clock_domain()
        if self.shared_clock:
            self.to_wire = welcome.mono_to_wall
        self.offset = self.to_wire - self.mono_to_wall

    def advertise(self, subs: list[tuple[str, str]]) -> None:
        """This node's subscriptions are now ``subs``; ``send_subs`` tells the broker."""
        self.subs = subs
        self.subs_version += 1

    def send_subs(self) -> None:
        if self.connected:
            self.send(self._enc.encode(Subs(self.subs_version, list(self.subs))))

    async def wait_subs(self) -> None:
        """Until the next SUBS_ACK (or close)."""
        fut = self.reactor.loop.create_future()
        self.sync_waiters.append(fut)
        await fut

    def send(self, frame: bytes) -> None:
        """One frame to the broker, at once. Before the reader is installed (the handshake)
        the asyncio socket sends, so its own pending receive is not starved."""
        if self.fd is None:
            if self.sock is None:
                return
            # pyzmq types its asyncio socket's send as Awaitable; it is a Future.
            fut = cast("asyncio.Future[zmq.MessageTracker | None]", self.sock.send(frame))
            if not fut.done():
                fut.add_done_callback(_log_send_failure)
            elif fut.exception() is not None:
                _log_send_failure(fut)
            return
        sync = self.sync
        assert sync is not None
        try:
            sync.send(frame, _NOBLOCK)
        except zmq.ZMQError as exc:
            _log.warning("send to the broker failed: %s", exc)
            return
        self.reactor.redrain(self.fd, sync, self.drain)

    def drain(self) -> None:
        fd = self.fd
        sync = self.sync
        if fd is None or sync is None:
            return
        self.reactor.drained(fd)
        loop = self.reactor.loop
        for _ in range(_TURN):
            try:
                frames = sync.recv_multipart(_NOBLOCK)
            except zmq.Again:
                break
            self.last_heard = loop.time()
            for frame in frames:
                self.counts["frames_in"] += 1
                try:
                    msg = self._decode(frame)
                except DecodeError as exc:
                    self.counts["malformed"] += 1
                    _log.warning("dropped a malformed frame from the broker: %s", exc)
                    continue
                try:
                    self.handle(msg)
                except Exception:
                    _log.exception("node %s failed to handle a broker frame", self.node)
            if self.sync is None:
                return
        else:
            self.reactor.redrain(fd, None, self.drain)
            return
        self.reactor.redrain(fd, sync, self.drain)

    def handle(self, msg: Any) -> None:
        kind = type(msg)
        if kind is Directory:
            self.on_directory(msg.peers)
            self.send(self._enc.encode(DirectoryAck(msg.version)))
        elif kind is Pong:
            self._pong(msg)
        elif kind is SubsAck:
            self.subs_acked = max(self.subs_acked, msg.version)
            wake(self.sync_waiters)
        elif kind is Reset:
            _log.warning("broker reset node %s (%s); re-joining", self.node, msg.reason)
            self.rejoin()
        elif kind is Welcome and not self.connected:
            self.counts["rejoined"] += 1
            self._reference(msg)
            if msg.epoch != self.epoch:
                # A new broker run. The data links never went through the broker and are
                # intact; its first directories are partial. Every live node is heard
                # within its heartbeat * liveness, or this broker drops it anyway.
                self.epoch = msg.epoch
                self.on_new_broker(msg.heartbeat * msg.liveness)
            else:
                self.on_reset()
            self._welcomed()

    def beat(self) -> None:
        """One heartbeat: a clock sample, or a rejoin when the broker went silent for
        ``heartbeat * liveness``, or another HELLO while it has not welcomed us."""
        if not self.connected:
            self.send(self.hello())
            return
        silent = self.reactor.loop.time() - self.last_heard
        if silent > self.heartbeat * self.liveness:
            self.counts["broker_lost"] += 1
            _log.warning(
                "node %s: no frame from the broker at %s for %.1fs; re-joining",
                self.node,
                self.endpoint,
                silent,
            )
            self.rejoin()
        else:
            self.send(self._enc.encode(Ping(time.monotonic_ns())))

    def _pong(self, pong: Pong) -> None:
        # t1 and t4 are our monotonic clock, t2 and t3 the broker's reference clock: the
        # estimate is the reference minus our monotonic clock, a to_wire directly.
        t4 = time.monotonic_ns()
        delay = (t4 - pong.t1) - (pong.t3 - pong.t2)
        shift = ((pong.t2 - pong.t1) + (pong.t3 - t4)) // 2
        self.clock.append((delay, shift))
        self.rtt, estimate = min(self.clock)
        if not self.shared_clock:
            self.to_wire = estimate
            self.offset = estimate - self.mono_to_wall

    def rejoin(self) -> None:
        self.connected = False
        self.send(self.hello())

    def close(self, linger: int | None) -> None:
        """Stop reading, release whoever waits for a SUBS_ACK, close (the default LINGER
        lets a BYE go out)."""
        if self.fd is not None:
            self.reactor.loop.remove_reader(self.fd)
            self.fd = None
        wake(self.sync_waiters)
        if self.sock is not None:
            self.sock.close(linger)
            self.sock = None
        self.sync = None


def _log_send_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        _log.warning("send to the broker failed: %s", fut.exception())
