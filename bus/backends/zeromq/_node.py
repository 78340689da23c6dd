"""ZmqTransport: a bus's link to the broker (one DEALER socket).

Sending: ``try_send`` encodes the envelope straight into the current batch buffer (one
``encode_into`` call, no per-message object) while the window has credit. Nagle style: a
message sent when nothing is pending goes out at once (a lone request never waits); what
follows in the same loop turn is batched and goes out as one frame when the turn ends (or
after ``batch_delay`` when set), or at once when it reaches ``batch_max`` messages or
``max_frame`` bytes. DONE frames and replies made in one turn go out as one message. A
frame is kept until the broker says it is settled (DONE), which happens only when every
receiver has handled or dead-lettered every message in it: so ``window`` bounds memory end
to end, ``flush`` can wait for remote work, and a broker restart or a gap costs a resend,
not a loss.

Receiving: after the handshake the socket's FD has a plain reader callback that drains it
without waiting (``NOBLOCK`` in a loop): no task and no future per wake-up. Each data frame
gets one :class:`_FrameReceipt` shared by its envelopes; the bus settles it once per
subscription that took a message, and the frame is acknowledged when all are done. A full
``block`` mailbox parks the rest of the frame (and later frames, in order) behind one task,
so the reader keeps answering heartbeats while backpressure holds; what can pile up is
bounded by the credit this node advertised.
"""

from __future__ import annotations

import asyncio
import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Awaitable, Iterable
from typing import Any

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from bus._envelope import Envelope
from bus._errors import BusClosedError, QueueFullError, TransportError
from bus._topics import GlobIndex
from bus._transport import BusPort, Receipt, Transport
from bus.backends.zeromq._errors import (
    AuthenticationFailed,
    ConnectError,
    EncodeError,
    FrameTooLarge,
    PeerLost,
    RemoteHandlerError,
)
from bus.backends.zeromq._keys import CurveKeys
from bus.backends.zeromq._wire import (
    DEFAULT_MAX_FRAME,
    PROTOCOL,
    Bye,
    DataDown,
    Done,
    Hello,
    Interest,
    InterestAck,
    ItemDown,
    Lost,
    Nack,
    Ping,
    Pong,
    ReplyDown,
    Reset,
    Subs,
    SubsAck,
    Welcome,
    array_header,
    down_decoder,
)

__all__ = ["DEFAULT_CREDIT", "DEFAULT_WINDOW", "ZmqTransport"]

_log = logging.getLogger("bus.zeromq.node")

#: Messages this node may have sent and not yet seen settled; past it ``send`` waits.
DEFAULT_WINDOW = 8192
#: Messages the broker may have in flight to this node at once (advertised in HELLO).
DEFAULT_CREDIT = 4096
#: A batch is sent once it holds this many bytes: measured here, a 60 KB send costs ~36 us and an
#: 80 KB one ~400 us (allocations past malloc's mmap threshold), so frames stay well below.
DEFAULT_BATCH_BYTES = 32 * 1024
#: Message ids remembered to drop duplicates (a resend after a gap or a broker restart).
DEFAULT_DEDUP_WINDOW = 65_536
_DATA_HEAD = b"\x93\x05"
_TURN = 256
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)
_CLOCK_SAMPLES = 8
_AUTH_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


class _FrameReceipt(Receipt):
    """Settled once per subscription that took one of the frame's messages."""

    __slots__ = ("armed", "epoch", "pending", "seq", "transport")

    def __init__(self, transport: ZmqTransport, seq: int, epoch: int) -> None:
        self.transport = transport
        self.seq = seq
        self.epoch = epoch
        self.pending = 0
        self.armed = False

    def expect(self, count: int) -> None:
        self.pending += count

    def settle(self, result: Any, error: BaseException | None) -> None:
        self.pending -= 1
        if not self.pending and self.armed:
            self.transport._settled(self)

    def arm(self) -> None:
        """Every message of the frame was offered to the bus; settle when they are done."""
        self.armed = True
        if not self.pending:
            self.transport._settled(self)


class _RequestReceipt(Receipt):
    """A request's receipt: the first answer (or failure) goes back to the asking node."""

    __slots__ = ("answered", "env", "frame", "reply_to")

    def __init__(self, frame: _FrameReceipt, reply_to: str, env: Envelope) -> None:
        self.frame = frame
        self.reply_to = reply_to
        self.env = env
        self.answered = False

    def expect(self, count: int) -> None:
        self.frame.expect(count)

    def settle(self, result: Any, error: BaseException | None) -> None:
        if not self.answered and (error is not None or result is not None):
            self.answered = True
            self.frame.transport._answer(self.reply_to, self.env, result, error)
        self.frame.settle(result, error)


class ZmqTransport(Transport):
    """A :class:`~bus.Transport` over ZeroMQ: ``Bus(transport=ZmqTransport(endpoint))``.

    ``node`` names this node (its ZeroMQ identity; unique per broker; default
    host-pid-random). With ``curve`` (this node's key pair) and ``server_key`` (the
    broker's public key) the link is CURVE-encrypted and the broker checks the node's key.
    ``heartbeat * liveness`` seconds without a frame from the broker mark it lost (the node
    keeps re-joining). ``window`` bounds unsettled outbound messages, ``credit`` inbound
    ones. ``connect_timeout`` bounds the handshake in ``start``.
    """

    def __init__(
        self,
        connect: str,
        *,
        node: str | None = None,
        curve: CurveKeys | None = None,
        server_key: bytes | None = None,
        heartbeat: float = 1.0,
        liveness: int = 3,
        max_frame: int = DEFAULT_MAX_FRAME,
        batch_max: int = 1024,
        batch_delay: float = 0.0,
        window: int = DEFAULT_WINDOW,
        credit: int = DEFAULT_CREDIT,
        dedup_window: int = DEFAULT_DEDUP_WINDOW,
        connect_timeout: float = 5.0,
    ) -> None:
        if (curve is None) != (server_key is None):
            raise ValueError("ZmqTransport: CURVE needs both curve (node keys) and server_key")
        if heartbeat <= 0 or liveness < 1:
            raise ValueError(
                f"ZmqTransport: heartbeat must be > 0 and liveness >= 1, "
                f"got {heartbeat}, {liveness}"
            )
        for label, value in (
            ("batch_max", batch_max),
            ("window", window),
            ("credit", credit),
            ("dedup_window", dedup_window),
        ):
            if value < 1:
                raise ValueError(f"ZmqTransport: {label} must be >= 1, got {value}")
        if max_frame < 1024 or batch_delay < 0:
            raise ValueError(
                f"ZmqTransport: max_frame must be >= 1024 and batch_delay >= 0, "
                f"got {max_frame}, {batch_delay}"
            )
        self.endpoint = connect
        self.node = node or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.curve = curve
        self.server_key = server_key
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.max_frame = max_frame
        self.batch_max = batch_max
        self.batch_delay = batch_delay
        self.window = window
        self.credit = credit
        self.connect_timeout = connect_timeout
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._sync: zmq.Socket[bytes] | None = None
        self._port: BusPort | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        self._connected = False
        self._incarnation = int.from_bytes(os.urandom(4), "big")
        self._epoch = 0
        self._subs: list[tuple[str, str]] = []
        self._subs_version = 0
        self._subs_acked = 0
        self._sync_waiters: list[asyncio.Future[None]] = []
        self._interest: GlobIndex[str] = GlobIndex()
        self._enc = msgspec.msgpack.Encoder()
        self._decode = down_decoder().decode
        # outbound
        self._buf = bytearray()
        self._buf_n = 0
        self._flush_handle: asyncio.Handle | asyncio.TimerHandle | None = None
        self._out_seq = 0
        self._unsettled: dict[int, tuple[bytes, int]] = {}
        self._in_flight = 0
        self._credit_waiters: deque[asyncio.Future[None]] = deque()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._requests: dict[int, tuple[asyncio.Future[Any], str]] = {}
        # inbound
        self._expected_in = 0
        self._nacked: int | None = None
        self._parked: deque[tuple[_FrameReceipt, list[ItemDown], int]] = deque()
        self._unparking = False
        self._done_out: list[int] = []
        self._control_out: list[bytes] = []
        self._control_handle: asyncio.Handle | None = None
        # the socket's own reader (after the handshake): a plain callback, not a task
        self._fd: int | None = None
        self._draining = False
        self._drain_handle: asyncio.Handle | None = None
        self._send_backlog: deque[list[bytes]] = deque()
        self._retry_handle: asyncio.TimerHandle | None = None
        # Two generations of seen ids: the newest ``dedup_window`` at least, with no
        # per-message bookkeeping beyond one set add (the old generation is dropped whole).
        self._seen: set[Any] = set()
        self._seen_old: set[Any] = set()
        self._dedup_window = dedup_window
        # clock
        self._last_heard = 0.0
        self._clock: deque[tuple[int, int]] = deque(maxlen=_CLOCK_SAMPLES)
        self._offset = 0
        self._rtt = 0
        self._mono_to_wall = time.time_ns() - time.monotonic_ns()
        self._to_wire = self._mono_to_wall
        self._counts = dict.fromkeys(
            (
                "sent",
                "frames_out",
                "acked",
                "received",
                "frames_in",
                "duplicates",
                "malformed",
                "oversized",
                "gaps",
                "resent",
                "rejected",
                "node_lost",
                "replies_sent",
                "replies_received",
                "broker_lost",
                "rejoined",
            ),
            0,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, port: BusPort) -> None:
        if self._sock is not None:
            raise TransportError(f"ZmqTransport {self.node!r} is already started")
        self._port = port
        self._loop = asyncio.get_running_loop()
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.IDENTITY, self.node.encode())
        sock.setsockopt(zmq.SNDHWM, 0)  # bounded by the window, and a DEALER never drops
        sock.setsockopt(zmq.RCVHWM, 0)  # bounded by the credit we advertise
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
            self._ctx.term()
            raise ConnectError(f"cannot connect to {self.endpoint}: {exc}") from exc
        self._sock = sock
        self._sync = zmq.Socket.shadow(sock.underlying)
        try:
            try:
                await self._handshake(monitor)
            finally:
                sock.disable_monitor()
                monitor.close(0)
        except BaseException:
            self._closed = True
            await self._teardown(linger=0)
            raise
        # From here on the socket is read by a plain reader callback on its FD (no task, no
        # future per wake-up) and written with non-blocking sends on the shadow socket.
        self._fd = self._sync.getsockopt(zmq.FD)
        self._loop.add_reader(self._fd, self._drain)
        self._loop.call_soon(self._drain)  # frames that came in behind the handshake's
        self._tasks = [
            self._loop.create_task(self._beat(), name=f"zmq-node:{self.node}:heartbeat"),
        ]

    async def _handshake(self, monitor: zmq.asyncio.Socket) -> None:
        """HELLO until WELCOME and the first INTEREST: a ready handshake, not a sleep. A
        CURVE refusal shows up on the monitor socket as a failed handshake, reported so."""
        assert self._sock is not None and self._loop is not None
        deadline = self._loop.time() + self.connect_timeout
        refused: str | None = None
        welcomed = False
        self._send(self._hello())
        recv = self._sock.recv()
        watch = monitor.recv_multipart()
        try:
            while True:
                left = deadline - self._loop.time()
                if left <= 0:
                    break
                done, _ = await asyncio.wait(
                    {recv, watch}, timeout=min(left, 0.5), return_when=asyncio.FIRST_COMPLETED
                )
                if watch in done:
                    # A refused handshake is final (ZeroMQ would retry and fail forever).
                    event = parse_monitor_message(watch.result())
                    refused = f"{event['event'].name}, code {event['value']}"
                    break
                if recv in done:
                    frame = recv.result()
                    try:
                        msg = self._decode(frame)
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        self._counts["malformed"] += 1
                        msg = None
                    if isinstance(msg, Welcome):
                        welcomed = True
                    elif msg is not None:
                        self._handle(msg)
                    if welcomed and isinstance(msg, Interest):
                        # Ready only once we know what the others subscribe to: a publish
                        # right after start() must not miss a remote subscriber.
                        self._welcomed()
                        return
                    recv = self._sock.recv()
                elif not done:
                    self._send(self._hello())  # the broker may have started after us
        finally:
            for task in (recv, watch):
                task.cancel()
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

    def _hello(self) -> bytes:
        return self._enc.encode(
            Hello(
                PROTOCOL,
                self.node,
                self._incarnation,
                self.credit,
                self._subs_version,
                list(self._subs),
            )
        )

    def _welcomed(self) -> None:
        assert self._loop is not None
        self._connected = True
        self._last_heard = self._loop.time()
        # A clock sample now, so a short run knows the offset before the first heartbeat.
        self._send(self._enc.encode(Ping(time.time_ns(), self._out_seq - 1)))

    async def aclose(self) -> None:
        """Leave: send what is buffered, wait (up to ``heartbeat * liveness``) for it to be
        settled, say BYE, close. Anything still unsettled then is dead-lettered here with
        reason ``bus_closed``; the broker hands what this node had not settled to others."""
        if self._closed:
            return
        self._closed = True
        if self._sock is None:
            return
        self._flush_data()
        self._flush_control()
        if self._in_flight and self._connected:
            try:
                async with asyncio.timeout(self.heartbeat * self.liveness):
                    await self._idle()
            except TimeoutError:
                pass
        self._dead_letter_unsettled()
        self._flush_control()
        if self._connected:
            self._send(self._enc.encode(Bye()))
        await self._teardown()

    async def _teardown(self, linger: int | None = None) -> None:
        if self._fd is not None and self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._fd = None
        for handle in (self._drain_handle, self._retry_handle):
            if handle is not None:
                handle.cancel()
        self._flush_backlog()
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for fut in self._credit_waiters:
            if not fut.done():
                fut.set_exception(TransportError(f"transport {self.node!r} is closed"))
        self._credit_waiters.clear()
        self._wake_idle()
        self._wake(self._sync_waiters)
        if self._sock is not None:
            self._sock.close(linger)  # the default LINGER lets BYE go out
            self._sock = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def _dead_letter_unsettled(self) -> None:
        if not self._unsettled or self._port is None:
            return
        decoder = msgspec.msgpack.Decoder(list[tuple[str, Envelope, bool]])
        for body, _ in self._unsettled.values():
            for _, env, _ in decoder.decode(body):
                env.created -= self._to_wire
                self._port.dead_letter(
                    env,
                    "<remote>",
                    "bus_closed",
                    PeerLost(f"node {self.node!r} closed before the broker settled it"),
                )
        self._unsettled.clear()
        self._in_flight = 0

    # -- the Transport contract ----------------------------------------------------------------

    def advertise(self, subscriptions: Iterable[tuple[str, str]]) -> None:
        self._subs = sorted(subscriptions)
        self._subs_version += 1
        if self._connected and not self._closed:
            self._send(self._enc.encode(Subs(self._subs_version, list(self._subs))))

    async def sync(self) -> None:
        """Wait until the broker routes by this node's latest subscriptions and every other
        node's ``has_remote`` reflects them (the broker collected their acknowledgements)."""
        while self._subs_acked < self._subs_version and not self._closed:
            assert self._loop is not None
            fut = self._loop.create_future()
            self._sync_waiters.append(fut)
            await fut

    def has_remote(self, topic: str) -> bool:
        return bool(self._interest.resolve(topic))

    def try_send(self, envelope: Envelope) -> bool:
        if self._closed:
            raise TransportError(f"transport {self.node!r} is closed")
        if self._in_flight >= self.window:
            return False
        buf = self._buf
        mark = len(buf)
        request = isinstance(envelope.reply, asyncio.Future)
        env = envelope
        try:
            self._enc.encode_into(
                (
                    env.topic,
                    (
                        env.topic, env.payload, env.priority, env.id, env.session_id,
                        env.correlation_id, env.causation_id, env.trace,
                        env.created + self._to_wire, env.hops, env.source,
                    ),
                    request,
                ),
                buf,
                -1,
            )  # fmt: skip
        except (TypeError, ValueError, OverflowError) as exc:
            del buf[mark:]
            raise EncodeError(
                f"cannot send {env.topic!r} to other nodes: its payload is not msgpack-"
                f"encodable ({exc}); use dicts, lists, str, numbers, bytes or msgspec Structs"
            ) from exc
        size = len(buf) - mark
        if size > self.max_frame - 64:
            del buf[mark:]
            raise FrameTooLarge(
                f"cannot send {env.topic!r}: {size} bytes encoded, frame limit {self.max_frame}"
            )
        if len(buf) > self.max_frame - 64:
            # This message would push the batch past the frame limit: send the batch first.
            tail = bytes(buf[mark:])
            del buf[mark:]
            self._flush_data()
            self._buf += tail
        if request:
            fut: asyncio.Future[Any] = envelope.reply
            self._requests[env.id] = (fut, env.topic)
            fut.add_done_callback(lambda _f, i=env.id: self._requests.pop(i, None))
        self._buf_n += 1
        self._in_flight += 1
        self._counts["sent"] += 1
        if self._flush_handle is None:
            assert self._loop is not None
            if self.batch_delay:
                self._flush_handle = self._loop.call_later(self.batch_delay, self._end_turn)
            else:
                # Nagle style: nothing was pending, so this one goes now; what follows in
                # the same loop turn is batched and sent when the turn ends.
                self._flush_data()
                self._flush_handle = self._loop.call_soon(self._end_turn)
                return True
        if self._buf_n >= self.batch_max or len(self._buf) >= DEFAULT_BATCH_BYTES:
            self._flush_data()
        return True

    async def send(self, envelope: Envelope) -> None:
        while not self.try_send(envelope):
            assert self._loop is not None
            fut = self._loop.create_future()
            self._credit_waiters.append(fut)
            await fut

    async def flush(self) -> None:
        """Wait until every message sent so far is settled by its receivers."""
        if self._sock is None or self._closed:
            return
        self._flush_data()
        await self._idle()

    async def _idle(self) -> None:
        while self._in_flight:
            assert self._loop is not None
            fut = self._loop.create_future()
            self._idle_waiters.append(fut)
            await fut

    def stats(self) -> dict[str, Any]:
        """Counters since start, the link state, and the clock offset to the broker
        (``clock_offset_ns``: broker wall clock minus ours, from the lowest-delay of the last
        heartbeats, NTP style; ``rtt_ns`` is that heartbeat's round trip)."""
        return {
            "node": self.node,
            "endpoint": self.endpoint,
            "connected": self._connected,
            "in_flight": self._in_flight,
            "window": self.window,
            "unsettled_frames": len(self._unsettled),
            "parked_frames": len(self._parked),
            "pending_requests": len(self._requests),
            "clock_offset_ns": self._offset,
            "rtt_ns": self._rtt,
            **self._counts,
        }

    # -- sending -----------------------------------------------------------------------------

    def _send(self, *frames: bytes) -> None:
        """Send ``frames`` as one ZeroMQ message (one wake-up for the broker), at once.

        Before the reader is installed (the handshake) the asyncio socket sends, so its own
        pending receive is not starved. After, a non-blocking send on the shadow socket: no
        future, no callback. A send can consume the FD's edge for frames that arrived
        meanwhile, so the reader is rescheduled when the socket says it has input."""
        if self._fd is None:
            if self._sock is None:
                return
            fut = self._sock.send_multipart(frames)
            if not fut.done():
                fut.add_done_callback(_log_send_failure)
            elif fut.exception() is not None:
                _log_send_failure(fut)
            return
        if self._send_backlog:
            self._send_backlog.append(list(frames))
            return
        sync = self._sync
        assert sync is not None
        try:
            if len(frames) == 1:
                sync.send(frames[0], _NOBLOCK)
            else:
                sync.send_multipart(frames, _NOBLOCK)
        except zmq.Again:
            # The DEALER has no room (its high-water mark is off, so only without a pipe):
            # keep the order, retry shortly.
            self._send_backlog.append(list(frames))
            self._schedule_retry()
            return
        except zmq.ZMQError as exc:
            _log.warning("send to the broker failed: %s", exc)
            return
        if not self._draining and self._drain_handle is None and sync.getsockopt(_EVENTS) & 1:
            self._drain_handle = self._loop.call_soon(self._drain)  # type: ignore[union-attr]

    def _schedule_retry(self) -> None:
        if self._retry_handle is None and self._loop is not None:
            self._retry_handle = self._loop.call_later(0.001, self._flush_backlog)

    def _flush_backlog(self) -> None:
        self._retry_handle = None
        backlog, sync = self._send_backlog, self._sync
        while backlog and sync is not None and not sync.closed:
            try:
                sync.send_multipart(backlog[0], _NOBLOCK)
            except zmq.Again:
                self._schedule_retry()
                return
            except zmq.ZMQError as exc:
                _log.warning("send to the broker failed: %s", exc)
            backlog.popleft()

    def _end_turn(self) -> None:
        self._flush_handle = None
        self._flush_data()

    def _flush_data(self) -> None:
        """Send the batch now (the turn's handle, if any, stays: batching goes on)."""
        n = self._buf_n
        if not n:
            return
        body = array_header(n) + self._buf
        self._buf = bytearray()
        self._buf_n = 0
        seq = self._out_seq
        self._out_seq += 1
        self._unsettled[seq] = (body, n)
        self._counts["frames_out"] += 1
        if self._connected:
            self._send(b"".join((_DATA_HEAD, self._enc.encode(seq), body)))

    def _schedule_control(self) -> None:
        if self._control_handle is None and self._loop is not None:
            self._control_handle = self._loop.call_soon(self._flush_control)

    def _flush_control(self) -> None:
        """DONE and replies made this loop turn go out together, as one message."""
        if self._control_handle is not None:
            self._control_handle.cancel()
            self._control_handle = None
        if not self._connected:
            return
        frames = self._control_out
        if self._done_out:
            seqs, self._done_out = self._done_out, []
            frames.append(self._enc.encode(Done(seqs)))
        if frames:
            self._control_out = []
            self._send(*frames)

    def _settled(self, receipt: _FrameReceipt) -> None:
        if receipt.epoch == self._epoch:
            self._done_out.append(receipt.seq)
            self._schedule_control()

    def _answer(self, to: str, env: Envelope, result: Any, error: BaseException | None) -> None:
        if error is None:
            try:
                value = msgspec.Raw(self._enc.encode(result))
            except (TypeError, ValueError, OverflowError) as exc:
                error = EncodeError(f"reply to {env.topic!r} is not msgpack-encodable: {exc}")
        if error is not None:
            reply = (9, to, env.id, False, None, type(error).__name__, str(error))
        else:
            reply = (9, to, env.id, True, value, None, None)
        self._counts["replies_sent"] += 1
        # With the DONE that settling the request makes right after: one message.
        self._control_out.append(self._enc.encode(reply))
        self._schedule_control()

    def _wake_credit(self) -> None:
        room = self.window - self._in_flight
        waiters = self._credit_waiters
        while waiters and room > 0:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                room -= 1

    def _wake_idle(self) -> None:
        self._wake(self._idle_waiters)

    @staticmethod
    def _wake(waiters: list[asyncio.Future[None]]) -> None:
        while waiters:
            fut = waiters.pop()
            if not fut.done():
                fut.set_result(None)

    # -- receiving ---------------------------------------------------------------------------

    def _drain(self) -> None:
        """The reader: take every frame the socket has without waiting, then send what
        handling them produced (DONE, replies) as one message. Runs as the FD's reader
        callback; after ``_TURN`` messages it reschedules itself so the loop stays fair."""
        self._drain_handle = None
        sync, loop = self._sync, self._loop
        if sync is None or loop is None or self._fd is None:
            return
        self._draining = True
        try:
            for _ in range(_TURN):
                try:
                    frames = sync.recv_multipart(_NOBLOCK)
                except zmq.Again:
                    break
                self._last_heard = loop.time()
                for frame in frames:
                    self._frame_in(frame)
            else:
                self._drain_handle = loop.call_soon(self._drain)
            self._flush_control()
            if self._drain_handle is None and sync.getsockopt(_EVENTS) & 1:
                self._drain_handle = loop.call_soon(self._drain)
        finally:
            self._draining = False

    def _frame_in(self, frame: bytes) -> None:
        self._counts["frames_in"] += 1
        if len(frame) > self.max_frame:
            self._counts["oversized"] += 1
            _log.warning("dropped an oversized frame (%d bytes) from the broker", len(frame))
            return
        try:
            msg = self._decode(frame)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._counts["malformed"] += 1
            _log.warning("dropped a malformed frame from the broker: %s", exc)
            return
        try:
            self._handle(msg)
        except Exception:
            _log.exception("node %s failed to handle a frame; dropped it", self.node)

    def _handle(self, msg: Any) -> None:
        kind = type(msg)
        if kind is DataDown:
            self._data(msg)
        elif kind is Done:
            self._acked(msg.seqs)
        elif kind is Pong:
            self._pong(msg)
        elif kind is Interest:
            self._set_interest(msg.patterns)
            self._send(self._enc.encode(InterestAck(msg.version)))
        elif kind is SubsAck:
            self._subs_acked = max(self._subs_acked, msg.version)
            self._wake(self._sync_waiters)
        elif kind is ReplyDown:
            self._reply(msg)
        elif kind is Lost:
            self._lost(msg)
        elif kind is Nack:
            self._resend(msg.expected)
        elif kind is Reset:
            _log.warning("broker reset node %s (%s); re-joining", self.node, msg.reason)
            self._rejoin()
        elif kind is Welcome:
            if not self._connected:
                self._counts["rejoined"] += 1
                self._resync()
            self._welcomed()

    def _data(self, msg: DataDown) -> None:
        seq = msg.seq
        if seq != self._expected_in:
            if seq < self._expected_in:
                self._counts["duplicates"] += 1
            else:
                self._counts["gaps"] += 1
                if self._nacked != self._expected_in:
                    self._nacked = self._expected_in
                    self._send(self._enc.encode(Nack(self._expected_in)))
            return
        self._expected_in = seq + 1
        self._nacked = None
        self._counts["received"] += len(msg.items)
        receipt = _FrameReceipt(self, seq, self._epoch)
        if self._parked or self._unparking:
            self._parked.append((receipt, msg.items, 0))
            return
        waiting = self._deliver(receipt, msg.items, 0)
        if waiting is not None:
            assert self._loop is not None
            self._unparking = True
            self._tasks.append(self._loop.create_task(self._unpark(waiting)))

    def _deliver(
        self, receipt: _FrameReceipt, items: list[ItemDown], start: int
    ) -> Awaitable[None] | None:
        """Offer the frame's messages from ``start`` on; on a full ``block`` mailbox, park
        the rest in front of the queue and return what to wait for."""
        assert self._port is not None
        deliver = self._port.deliver
        seen = self._seen
        to_wire = self._to_wire
        for i in range(start, len(items)):
            item = items[i]
            env = item.env
            if not 0 <= env.priority <= 2:
                self._counts["malformed"] += 1
                _log.warning("dropped message %d: priority %r out of range", env.id, env.priority)
                continue
            names = item.names
            key = env.id if names is None else (env.id, *names)
            if key in seen or key in self._seen_old:
                self._counts["duplicates"] += 1
                continue
            seen.add(key)
            if len(seen) >= self._dedup_window:
                self._seen_old, self._seen = seen, set()
                seen = self._seen
            env.created -= to_wire
            env.context = None
            env.reply = (
                receipt if item.reply_to is None else _RequestReceipt(receipt, item.reply_to, env)
            )
            try:
                waiting = deliver(env, names)
            except BusClosedError:
                # The bus stopped taking messages: leave the frame unsettled; the broker
                # hands it to another member when this node says BYE.
                return None
            except QueueFullError:
                self._counts["rejected"] += 1
                continue
            except Exception:
                _log.exception("delivering message %d (%s) failed", env.id, env.topic)
                env.reply.expect(0)
                continue
            if waiting is not None:
                self._parked.appendleft((receipt, items, i + 1))
                return waiting
        receipt.arm()
        return None

    async def _unpark(self, waiting: Awaitable[None]) -> None:
        try:
            while True:
                try:
                    await waiting
                except QueueFullError:
                    self._counts["rejected"] += 1
                except BusClosedError:
                    self._parked.clear()
                    return
                while True:
                    if not self._parked:
                        return
                    receipt, items, start = self._parked.popleft()
                    next_wait = self._deliver(receipt, items, start)
                    if next_wait is not None:
                        waiting = next_wait
                        break
        finally:
            self._unparking = False

    def _acked(self, seqs: list[int]) -> None:
        settled = 0
        for seq in seqs:
            entry = self._unsettled.pop(seq, None)
            if entry is not None:
                settled += entry[1]
        if not settled:
            return
        self._in_flight -= settled
        self._counts["acked"] += settled
        if self._credit_waiters:
            self._wake_credit()
        if not self._in_flight and self._idle_waiters:
            self._wake_idle()

    def _set_interest(self, patterns: list[str]) -> None:
        index: GlobIndex[str] = GlobIndex()
        for pattern in patterns:
            index.add(pattern, pattern)
        self._interest = index
        if self.on_change is not None:
            self.on_change()

    def _reply(self, msg: ReplyDown) -> None:
        entry = self._requests.get(msg.request_id)
        self._counts["replies_received"] += 1
        if entry is None or entry[0].done():
            return  # answered already (locally, or by another node), or given up
        fut, topic = entry
        if msg.ok:
            fut.set_result(msg.value)
        else:
            fut.set_exception(RemoteHandlerError(topic, msg.error_type or "?", msg.error or ""))

    def _lost(self, msg: Lost) -> None:
        assert self._port is not None
        for entry in msg.entries:
            env = entry.env
            env.created -= self._to_wire
            error = PeerLost(
                f"the node holding {env.topic!r} for {entry.subscriber!r} was lost and no "
                f"other member of that group could take it"
            )
            request = self._requests.get(env.id)
            if request is not None and not request[0].done():
                request[0].set_exception(error)
            self._counts["node_lost"] += 1
            self._port.dead_letter(env, entry.subscriber, entry.reason, error)

    def _resend(self, expected: int) -> None:
        for seq in sorted(s for s in self._unsettled if s >= expected):
            self._counts["resent"] += 1
            body = self._unsettled[seq][0]
            self._send(b"".join((_DATA_HEAD, self._enc.encode(seq), body)))

    # -- heartbeats, clock, re-joining ---------------------------------------------------------

    async def _beat(self) -> None:
        assert self._loop is not None
        loop = self._loop
        while True:
            await asyncio.sleep(self.heartbeat)
            if self._connected:
                silent = loop.time() - self._last_heard
                if silent > self.heartbeat * self.liveness:
                    self._counts["broker_lost"] += 1
                    _log.warning(
                        "node %s: no frame from the broker at %s for %.1fs; re-joining",
                        self.node,
                        self.endpoint,
                        silent,
                    )
                    self._rejoin()
                else:
                    self._send(self._enc.encode(Ping(time.time_ns(), self._out_seq - 1)))
            else:
                self._send(self._hello())

    def _pong(self, pong: Pong) -> None:
        t4 = time.time_ns()
        delay = (t4 - pong.t1) - (pong.t3 - pong.t2)
        offset = ((pong.t2 - pong.t1) + (pong.t3 - t4)) // 2
        self._clock.append((delay, offset))
        self._rtt, self._offset = min(self._clock)
        self._to_wire = self._mono_to_wall + self._offset
        if pong.last_seq >= self._expected_in and self._nacked != self._expected_in:
            # The broker sent frames we never got, and nothing after them showed the gap.
            self._counts["gaps"] += 1
            self._nacked = self._expected_in
            self._send(self._enc.encode(Nack(self._expected_in)))

    def _rejoin(self) -> None:
        self._connected = False
        self._send(self._hello())

    def _resync(self) -> None:
        """A new link (the broker restarted, or dropped us): number frames afresh both ways
        and resend every unsettled frame; receivers drop what they already had by id."""
        self._epoch += 1
        self._expected_in = 0
        self._nacked = None
        self._done_out = []
        old = sorted(self._unsettled.items())
        self._unsettled = {}
        self._out_seq = 0
        self._connected = True
        for _, (body, n) in old:
            seq = self._out_seq
            self._out_seq += 1
            self._unsettled[seq] = (body, n)
            self._counts["resent"] += 1
            self._send(b"".join((_DATA_HEAD, self._enc.encode(seq), body)))


def _log_send_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        _log.warning("send to the broker failed: %s", fut.exception())
