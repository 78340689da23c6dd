"""ZmqTransport: a bus's links to the broker (control) and to the other nodes (data).

Messages go straight from the publishing node to the receiving one: one hop each way, two
processes, no broker in the path. The broker only keeps the directory (who is alive, what
each subscribes to, where its data socket listens) and the heartbeats; see ``_broker.py``.

Each node binds one ROUTER data socket that every other node's publisher connects a
DEALER to. The publisher routes: it resolves a topic once against every node's
subscriptions (exact globs, cached per topic), and for every consumer group (subscriptions
of one name) that matches picks one member node, the one it has the least unsettled work
with (round robin on ties). A group with a member on the publishing node itself is served
there, locally, zero copy.

Sending: ``try_send`` encodes the envelope straight into the picked peer's batch buffer
(one ``encode_into`` call, no per-message object) while the window has room. Nagle style:
a message sent when nothing is pending goes out at once (a lone request never waits); what
follows in the same loop turn is batched per peer and goes out when the turn ends (or after
``batch_delay`` when set), or at once at ``batch_max`` messages or ``DEFAULT_BATCH_BYTES``.
A frame is kept until the receiver says it is settled (DONE), which it does only when every
message in it was handled or dead-lettered. So ``window`` bounds memory end to end, a
peer's advertised credit bounds what is sent to it (the rest waits here, within the
window), ``flush`` can wait for remote work, and a gap costs a resend, not a loss. When
the directory drops a peer, whatever it had not settled goes to another member of the same
group, or into this bus's DLQ as ``node_lost``.

Receiving: the data socket's FD has a plain reader callback that drains it without waiting
(``NOBLOCK`` in a loop): no task and no future per wake-up. Each data frame gets one
:class:`_FrameReceipt` shared by its envelopes; the bus settles it once per subscription
that took a message, and the frame is acknowledged when all are done. DONEs made in one
loop turn go back as one message per link; a request's answer goes back at once. A full
``block`` mailbox parks the rest of the frame (and later frames, in order) behind one task,
so the readers keep answering heartbeats while backpressure holds; what can pile up is
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
from collections.abc import Iterable
from typing import Any, cast

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from bus._envelope import Envelope
from bus._errors import BusClosedError, QueueFullError, TransportError
from bus._topics import GlobIndex, matches
from bus._transport import BusPort, Transport
from bus.backends.zeromq._addresses import default_data_bind, local_address
from bus.backends.zeromq._errors import (
    AuthenticationFailed,
    ConnectError,
    EncodeError,
    FrameTooLarge,
    PeerLost,
    RemoteHandlerError,
)
from bus.backends.zeromq._inbound import Inbox
from bus.backends.zeromq._keys import CurveKeys
from bus.backends.zeromq._reactor import Reactor, wake
from bus.backends.zeromq._wire import (
    DEFAULT_MAX_FRAME,
    MAX_CREDIT,
    PROTOCOL,
    Bye,
    Directory,
    DirectoryAck,
    Done,
    Hello,
    Item,
    LinkPing,
    Nack,
    PeerInfo,
    Ping,
    Pong,
    Reply,
    Reset,
    Subs,
    SubsAck,
    Welcome,
    array_header,
    control_down_decoder,
    link_back_decoder,
    link_in_decoder,
    node_name_problem,
    peer_problem,
)

__all__ = ["DEFAULT_CREDIT", "DEFAULT_WINDOW", "ZmqTransport"]

_log = logging.getLogger("bus.zeromq.node")

#: Message copies this node may have sent (or queued for a peer) and not yet seen settled.
DEFAULT_WINDOW = 8192
#: Messages another node may have in flight to this one at once (advertised in HELLO).
DEFAULT_CREDIT = 4096
#: A batch is sent once it holds this many bytes: measured here, a 60 KB send costs ~36 us and an
#: 80 KB one ~400 us (allocations past malloc's mmap threshold), so frames stay well below.
DEFAULT_BATCH_BYTES = 32 * 1024
#: Message ids remembered to drop duplicates (a resend after a gap or a re-link).
DEFAULT_DEDUP_WINDOW = 65_536
_DATA_HEAD = b"\x93\x05"
_TURN = 256
_NOBLOCK = int(zmq.NOBLOCK)
_CLOCK_SAMPLES = 8
_RELINK_FIRST = 0.02  # seconds before linking again to a node that refused the handshake
_AUTH_EVENTS = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
_ITEMS = msgspec.msgpack.Decoder(list[Item])


class _Peer:
    """An outbound data link to one other node, and what it has not settled."""

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


class _Member:
    __slots__ = ("name", "pattern", "peer")

    def __init__(self, peer: _Peer | None, name: str, pattern: str) -> None:
        self.peer = peer  # None: a subscription of this node
        self.name = name
        self.pattern = pattern


class _Route:
    """Where a topic's messages go from here: per remote consumer group, its member peers.
    ``single`` is the common case precomputed: one group, one member, and the names to send
    (``None`` when that peer has no other matching subscription)."""

    __slots__ = ("groups", "per_peer", "single", "single_names")

    def __init__(self, groups: dict[str, list[_Peer]], per_peer: dict[_Peer, int]) -> None:
        self.groups = groups
        self.per_peer = per_peer
        self.single: _Peer | None = None
        self.single_names: list[str] | None = None
        if len(groups) == 1:
            ((name, peers),) = groups.items()
            if len(peers) == 1:
                self.single = peers[0]
                self.single_names = None if per_peer[peers[0]] == 1 else [name]


class ZmqTransport(Transport):
    """A :class:`~bus.Transport` over ZeroMQ: ``Bus(transport=ZmqTransport(endpoint))``.

    ``connect`` is the broker's endpoint. ``node`` names this node (unique per broker;
    default host-pid-random). ``data`` is where this node's data socket listens (default:
    next to the broker's ipc path, or a free port on the interface that reaches the
    broker). With ``curve`` (this node's key pair) and ``server_key`` (the broker's public
    key) every link is CURVE-encrypted: the broker checks this node's key, and this node
    admits on its data socket only the keys of nodes the broker lists. ``heartbeat *
    liveness`` seconds without a frame from the broker mark it lost (the node keeps
    re-joining). ``window`` bounds unsettled outbound message copies, ``credit`` inbound
    ones. ``connect_timeout`` bounds the handshake in ``start``.
    """

    def __init__(
        self,
        connect: str,
        *,
        node: str | None = None,
        data: str | None = None,
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
        problem = node_name_problem(self.node)
        if problem is not None:
            raise ValueError(f"ZmqTransport: {problem}")
        if credit > MAX_CREDIT:
            raise ValueError(f"ZmqTransport: credit must be <= {MAX_CREDIT}, got {credit}")
        self.data = data
        self.data_endpoint: str | None = None
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
        self._limit = max_frame - 64  # bytes of one frame's messages, past its header
        self._sent = 0  # message copies handed to a peer's batch (a plain int: hot path)
        self._links_made = 0
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None  # control, to the broker
        self._sync: zmq.Socket[bytes] | None = None
        self._control_fd: int | None = None
        self._auth: Any = None
        self._port: BusPort | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._reactor = Reactor()
        self._closed = False
        self._connected = False
        self._incarnation = int.from_bytes(os.urandom(4), "big")
        self._subs: list[tuple[str, str]] = []
        self._subs_version = 0
        self._subs_acked = 0
        self._sync_waiters: list[asyncio.Future[None]] = []
        self._enc = msgspec.msgpack.Encoder()
        self._decode_control = control_down_decoder().decode
        self._decode_in = link_in_decoder().decode
        self._decode_back = link_back_decoder().decode
        # routing
        self._peers: dict[str, _Peer] = {}
        self._index: GlobIndex[_Member] = GlobIndex()
        self._routes: dict[str, _Route] = {}
        self._rr: dict[str, int] = {}
        self._keys: frozenset[bytes] = frozenset()
        self._listed: list[PeerInfo] = []  # the latest directory
        self._settling_until = 0.0  # see _set_directory
        self._broker_epoch: int | None = None
        # outbound
        self._dirty: set[_Peer] = set()
        self._flush_handle: asyncio.Handle | asyncio.TimerHandle | None = None
        self._in_flight = 0
        self._credit_waiters: deque[asyncio.Future[None]] = deque()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._requests: dict[int, tuple[asyncio.Future[Any], str]] = {}
        # inbound
        # clock
        self._last_heard = 0.0
        self._clock: deque[tuple[int, int]] = deque(maxlen=_CLOCK_SAMPLES)
        self._offset = 0
        self._rtt = 0
        self._mono_to_wall = time.time_ns() - time.monotonic_ns()
        self._to_wire = self._mono_to_wall
        self._counts = dict.fromkeys(
            (
                "frames_out",
                "acked",
                "received",
                "frames_in",
                "duplicates",
                "duplicate_frames",
                "malformed",
                "oversized",
                "gaps",
                "resent",
                "relinked",
                "rejected",
                "redelivered",
                "node_lost",
                "peers_lost",
                "replies_sent",
                "replies_received",
                "broker_lost",
                "rejoined",
                "stale_frames",
                "directory_dropped",
            ),
            0,
        )
        self._inbox = Inbox(
            node=self.node,
            reactor=self._reactor,
            counts=self._counts,
            max_frame=max_frame,
            dedup_window=dedup_window,
            flush_outbound=self._flush_all,
            to_wire=self._wire_offset,
        )
        # Messages each other node settled, by node name: a node killed without a word
        # took its own accounting with it, and what it had settled here (handled there)
        # may have caused work inside it that died too. The driver of a run says so instead
        # of claiming nothing was lost. One entry per node name the directory ever listed.
        self._settled_by: dict[str, int] = {}

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, port: BusPort) -> None:
        if self._sock is not None:
            raise TransportError(f"ZmqTransport {self.node!r} is already started")
        self._port = port
        self._loop = loop = asyncio.get_running_loop()
        self._reactor.start(loop)
        self._inbox.port = port
        self._ctx = zmq.asyncio.Context()
        try:
            self._bind_server()
        except BaseException:
            if self._auth is not None:
                self._auth.stop()  # its ZAP socket would keep term() waiting forever
                self._auth = None
            self._ctx.term()
            self._ctx = None
            raise
        sock = self._ctx.socket(zmq.DEALER)
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
            await self._teardown(linger=0)
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
        # From here on every socket is read by a plain reader callback on its FD (no task,
        # no future per wake-up) and written with non-blocking sends.
        fd = self._sync.fileno()  # ZMQ_FD, typed int (getsockopt is typed int | bytes)
        self._control_fd = fd
        loop.add_reader(fd, self._drain_control)
        loop.call_soon(self._drain_control)  # frames that came in behind the handshake's
        self._reactor.tasks.append(
            loop.create_task(self._beat(), name=f"zmq-node:{self.node}:heartbeat")
        )

    def _bind_server(self) -> None:
        """Bind the data socket other nodes send to (a CURVE server with this node's keys,
        admitting only the keys the broker's directory lists)."""
        assert self._ctx is not None
        if self.curve is not None:
            from zmq.auth.asyncio import AsyncioAuthenticator

            self._auth = AsyncioAuthenticator(self._ctx)
            self._auth.start()
            self._auth.configure_curve_callback("*", credentials_provider=_KeyGate(self))
        bind = self.data or default_data_bind(self.endpoint, self._incarnation)
        endpoint = self._inbox.bind(self._ctx, bind, self.curve, self._auth)
        if endpoint.startswith("tcp://0.0.0.0:"):
            endpoint = f"tcp://{local_address(self.endpoint)}:{endpoint.rsplit(':', 1)[1]}"
        self.data_endpoint = endpoint

    def _admit(self, key: bytes) -> bool:
        """ZAP: admit a CURVE client key on the data socket iff the broker lists its node.
        Unknown keys are refused at once (waiting would let any client stall every other
        handshake, which the authenticator answers one at a time). A node that connects a
        moment before our directory names it is refused, and links again (``_refused``)."""
        if key in self._keys:
            return True
        _log.info("node %s refused a data link from key %s (not listed)", self.node, key.decode())
        return False

    async def _handshake(self, monitor: zmq.asyncio.Socket) -> None:
        """HELLO until WELCOME and the first DIRECTORY: a ready handshake, not a sleep. A
        CURVE refusal shows up on the monitor socket as a failed handshake, reported so."""
        assert self._sock is not None and self._loop is not None
        deadline = self._loop.time() + self.connect_timeout
        refused: str | None = None
        welcomed = False
        self._send_control(self._hello())
        # pyzmq types its asyncio socket's receives as Awaitable; they are Futures.
        recv = cast("asyncio.Future[bytes]", self._sock.recv())
        watch = cast("asyncio.Future[list[bytes]]", monitor.recv_multipart())
        try:
            while True:
                left = deadline - self._loop.time()
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
                        msg = self._decode_control(frame)
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        self._counts["malformed"] += 1
                        msg = None
                    if isinstance(msg, Welcome):
                        welcomed = True
                        self._broker_epoch = msg.epoch
                    elif msg is not None:
                        self._handle_control(msg)
                    if welcomed and isinstance(msg, Directory):
                        # Ready only once we know what the others subscribe to: a publish
                        # right after start() must not miss a remote subscriber.
                        self._welcomed()
                        return
                    recv = cast("asyncio.Future[bytes]", self._sock.recv())
                elif not done:
                    self._send_control(self._hello())  # the broker may have started after us
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

    def _hello(self) -> bytes:
        assert self.data_endpoint is not None
        return self._enc.encode(
            Hello(
                PROTOCOL,
                self.node,
                self._incarnation,
                self.credit,
                self._subs_version,
                list(self._subs),
                self.data_endpoint,
                self.curve.public if self.curve is not None else None,
            )
        )

    def _welcomed(self) -> None:
        assert self._loop is not None
        self._connected = True
        self._last_heard = self._loop.time()
        # A clock sample now, so a short run knows the offset before the first heartbeat.
        self._send_control(self._enc.encode(Ping(time.time_ns())))

    async def aclose(self) -> None:
        """Leave: send what is batched, wait (up to ``heartbeat * liveness``) for it to be
        settled, say BYE, close. Anything still unsettled then is dead-lettered here with
        reason ``bus_closed``; the others redeliver what this node had not settled."""
        if self._closed:
            return
        self._closed = True
        if self._sock is None:
            return
        self._flush_all()
        self._inbox.flush()
        if self._in_flight and self._connected:
            try:
                async with asyncio.timeout(self.heartbeat * self.liveness):
                    await self._idle()
            except TimeoutError:
                pass
        for peer in list(self._peers.values()):
            self._dead_letter_all(peer, "bus_closed")
        self._inbox.flush()
        if self._connected:
            self._send_control(self._enc.encode(Bye()))
        await self._teardown()

    async def _teardown(self, linger: int | None = None) -> None:
        loop = self._loop
        if self._control_fd is not None and loop is not None:
            loop.remove_reader(self._control_fd)
        self._control_fd = None
        if self._flush_handle is not None:
            self._flush_handle.cancel()
        self._inbox.close(linger)
        await self._reactor.stop()
        for fut in self._credit_waiters:
            if not fut.done():
                fut.set_exception(TransportError(f"transport {self.node!r} is closed"))
        self._credit_waiters.clear()
        wake(self._idle_waiters)
        wake(self._sync_waiters)
        for peer in self._peers.values():
            self._disconnect(peer)
        self._peers.clear()
        if self._sock is not None:
            self._sock.close(linger)  # the default LINGER lets BYE go out
            self._sock = None
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    # -- the Transport contract ----------------------------------------------------------------

    def advertise(self, subscriptions: Iterable[tuple[str, str]]) -> None:
        self._subs = sorted(subscriptions)
        self._subs_version += 1
        self._reindex()
        if self._connected and not self._closed:
            self._send_control(self._enc.encode(Subs(self._subs_version, list(self._subs))))

    async def sync(self) -> None:
        """Wait until the broker's directory has this node's latest subscriptions and every
        other node acknowledged it (their routing and ``has_remote`` reflect them)."""
        while self._subs_acked < self._subs_version and not self._closed:
            assert self._loop is not None
            fut = self._loop.create_future()
            self._sync_waiters.append(fut)
            await fut
        # The others sent what they routed by the old directory before acknowledging, but
        # on other sockets than the broker's: take in what has reached ours already.
        while not self._closed and self._inbox.waiting():  # noqa: ASYNC110 - a socket state
            await asyncio.sleep(0.001)

    def has_remote(self, topic: str) -> bool:
        route = self._routes.get(topic)
        if route is None:
            route = self._route(topic)
        return bool(route.groups)

    def try_send(self, envelope: Envelope) -> bool:
        if self._closed:
            raise TransportError(f"transport {self.node!r} is closed")
        if self._in_flight >= self.window:
            return False
        env = envelope
        route = self._routes.get(env.topic)
        if route is None:
            route = self._route(env.topic)
        reply = env.reply
        request = reply is not None and isinstance(reply, asyncio.Future)
        wire: tuple[Any, ...] | msgspec.Raw  # the envelope's fields, or (to many) their encoding
        wire = _wire_of(env, self._to_wire)
        single = route.single
        if single is not None:
            self._encode(single, wire, route.single_names, request)
        else:
            targets = self._pick(route)
            if not targets:
                return True
            if len(targets) > 1:
                wire = msgspec.Raw(self._encode_env(wire))
            for peer, names in targets:
                self._encode(peer, wire, names, request)
        if request:
            fut: asyncio.Future[Any] = envelope.reply
            self._requests[env.id] = (fut, env.topic)

            def forget(_f: asyncio.Future[Any], i: int = env.id) -> None:
                self._requests.pop(i, None)

            fut.add_done_callback(forget)
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
        self._flush_all()
        await self._idle()

    async def _idle(self) -> None:
        while self._in_flight:
            assert self._loop is not None
            fut = self._loop.create_future()
            self._idle_waiters.append(fut)
            await fut

    def stats(self) -> dict[str, Any]:
        """Counters since start, the links' state, and the clock offset to the broker
        (``clock_offset_ns``: broker wall clock minus ours, from the lowest-delay of the last
        heartbeats, NTP style; ``rtt_ns`` is that heartbeat's round trip)."""
        return {
            "node": self.node,
            "endpoint": self.endpoint,
            "data_endpoint": self.data_endpoint,
            "connected": self._connected,
            "in_flight": self._in_flight,
            "window": self.window,
            "peers": {
                p.name: {
                    "data": p.data,
                    "sent": p.sent,
                    "backlog": p.load() - p.sent,
                    "unsettled_frames": len(p.unsettled),
                }
                for p in self._peers.values()
            },
            "unsettled_frames": sum(len(p.unsettled) for p in self._peers.values()),
            "parked_frames": len(self._inbox.parked),
            "links_in": len(self._inbox.links),
            "pending_requests": len(self._requests),
            "clock_offset_ns": self._offset,
            "rtt_ns": self._rtt,
            "sent": self._sent,
            "settled_by": dict(self._settled_by),
            **self._counts,
        }

    # -- routing -----------------------------------------------------------------------------

    def _reindex(self) -> None:
        index: GlobIndex[_Member] = GlobIndex()
        for name, pattern in self._subs:
            index.add(pattern, _Member(None, name, pattern))
        for peer in self._peers.values():
            for name, pattern in peer.subs:
                index.add(pattern, _Member(peer, name, pattern))
        self._index = index
        self._routes.clear()
        if self.on_change is not None:
            self.on_change()

    def _route(self, topic: str) -> _Route:
        members = self._index.resolve(topic)
        local = {m.name for m in members if m.peer is None}
        groups: dict[str, list[_Peer]] = {}
        per_peer: dict[_Peer, int] = {}
        for m in members:
            peer = m.peer
            if peer is None:
                continue
            per_peer[peer] = per_peer.get(peer, 0) + 1
            if m.name in local:
                continue  # a member here matched: served locally
            group = groups.get(m.name)
            if group is None:
                groups[m.name] = [peer]
            elif peer not in group:
                group.append(peer)
        route = _Route(groups, per_peer)
        if len(self._routes) >= 10_000:
            self._routes.clear()
        self._routes[topic] = route
        return route

    def _pick(self, route: _Route) -> list[tuple[_Peer, list[str] | None]]:
        """One member per group: the peer with the least unsettled work from here, round
        robin on ties; names only where the peer has other matching subscriptions."""
        picked: dict[_Peer, list[str]] = {}
        for name, peers in route.groups.items():
            if len(peers) == 1:
                best = peers[0]
            else:
                start = self._rr.get(name, 0)
                self._rr[name] = start + 1
                best = None
                best_load = 0
                n = len(peers)
                for i in range(n):
                    peer = peers[(start + i) % n]
                    load = peer.load()
                    if best is None or load < best_load:
                        best, best_load = peer, load
            assert best is not None
            names = picked.get(best)
            if names is None:
                picked[best] = [name]
            else:
                names.append(name)
        return [
            (peer, None if len(names) == route.per_peer[peer] else names)
            for peer, names in picked.items()
        ]

    # -- sending -----------------------------------------------------------------------------

    def _encode_env(self, wire: tuple[Any, ...]) -> bytes:
        try:
            return self._enc.encode(wire)
        except Exception as exc:  # any encoder failure: see _encode
            raise _not_encodable(wire[0], exc) from exc

    def _encode(self, peer: _Peer, wire: Any, names: list[str] | None, request: bool) -> None:
        """Append one message for ``peer`` to its batch; Nagle: the first of a loop turn
        goes at once. Runs on the publisher's call (``try_send``), so an encoding failure
        is raised to it as :class:`EncodeError`; ``_peer_lost`` catches it and
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
            raise _not_encodable(wire[0] if isinstance(wire, tuple) else "message", exc) from exc
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
        self._in_flight += 1
        self._sent += 1
        if self._flush_handle is None:
            assert self._loop is not None
            if self.batch_delay:
                self._dirty.add(peer)
                self._flush_handle = self._loop.call_later(self.batch_delay, self._end_turn)
            else:
                # Nagle style: nothing was pending, so this one goes now; what follows in
                # the same loop turn is batched and sent when the turn ends.
                self._flush_peer(peer)
                self._flush_handle = self._loop.call_soon(self._end_turn)
            return
        if peer.buf_n == 1:
            self._dirty.add(peer)
        elif peer.buf_n >= self.batch_max or end >= DEFAULT_BATCH_BYTES:
            self._flush_peer(peer)

    def _end_turn(self) -> None:
        self._flush_handle = None
        self._flush_all()

    def _flush_all(self) -> None:
        dirty = self._dirty
        while dirty:
            self._flush_peer(dirty.pop())

    def _flush_peer(self, peer: _Peer) -> None:
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

    def _send_frame(self, peer: _Peer, body: bytes, n: int) -> None:
        seq = peer.out_seq
        peer.out_seq += 1
        peer.unsettled[seq] = (body, n)
        peer.sent += n
        self._counts["frames_out"] += 1
        self._send_data(peer, b"".join((_DATA_HEAD, self._enc.encode(seq), body)))

    def _send_data(self, peer: _Peer, frame: bytes) -> None:
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
        self._reactor.redrain(peer.fd, sock, self._drain_peer, peer)

    def _refused(self, peer: _Peer) -> None:
        """A DEALER with no high-water mark refuses a send only when its one pipe is gone,
        and here that means the peer refused the CURVE handshake: we connected a moment
        before its directory listed our key. ZeroMQ never retries a refused handshake, so
        link again, soon and then less often, and resend what is unsettled (the frames
        stay in ``unsettled`` until then)."""
        if peer.relink is not None or self._loop is None:
            return
        delay = min(self.heartbeat, _RELINK_FIRST * 2**peer.refusals)
        peer.refusals += 1
        _log.info("node %s refused our data link; linking again in %.2fs", peer.name, delay)
        peer.relink = self._loop.call_later(delay, self._relink_refused, peer)

    def _relink_refused(self, peer: _Peer) -> None:
        peer.relink = None
        self._counts["relinked"] += 1
        self._relink(peer)

    def _send_control(self, frame: bytes) -> None:
        """One frame to the broker, at once. Before the reader is installed (the handshake)
        the asyncio socket sends, so its own pending receive is not starved."""
        if self._control_fd is None:
            if self._sock is None:
                return
            # pyzmq types its asyncio socket's send as Awaitable; it is a Future.
            fut = cast("asyncio.Future[zmq.MessageTracker | None]", self._sock.send(frame))
            if not fut.done():
                fut.add_done_callback(_log_send_failure)
            elif fut.exception() is not None:
                _log_send_failure(fut)
            return
        sync = self._sync
        assert sync is not None
        try:
            sync.send(frame, _NOBLOCK)
        except zmq.ZMQError as exc:
            _log.warning("send to the broker failed: %s", exc)
            return
        self._reactor.redrain(self._control_fd, sync, self._drain_control)

    # -- outbound links ------------------------------------------------------------------------

    def _connect(self, peer: _Peer) -> None:
        assert self._ctx is not None and self._loop is not None
        sock: zmq.Socket[bytes] = zmq.Context.shadow(self._ctx.underlying).socket(zmq.DEALER)
        # Never reused, not even for a peer that comes back under the same name: a receiver
        # that still has state for an old identity would take new frames as duplicates.
        self._links_made += 1
        ident = f"{self.node}/{self._incarnation:x}/{self._links_made}"
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
        self._loop.add_reader(fd, self._drain_peer, peer)

    def _disconnect(self, peer: _Peer) -> None:
        if peer.relink is not None:
            peer.relink.cancel()
            peer.relink = None
        if peer.fd is not None:
            self._reactor.forget(peer.fd)
            peer.fd = None
        if peer.sock is not None:
            peer.sock.close(0)
            peer.sock = None

    def _relink(self, peer: _Peer) -> None:
        """A fresh link to ``peer`` (after we were reset): number frames from zero again and
        resend everything unsettled; the receiver drops what it already had by id."""
        self._disconnect(peer)
        self._connect(peer)
        old = sorted(peer.unsettled.items())
        peer.unsettled = {}
        peer.out_seq = 0
        peer.sent = 0
        for _, (body, n) in old:
            self._counts["resent"] += 1
            self._send_frame(peer, body, n)

    def _drain_peer(self, peer: _Peer) -> None:
        """What comes back on an outbound link: DONE, replies, NACKs."""
        fd = peer.fd
        if fd is None:
            return
        self._reactor.drained(fd)
        sock = peer.sock
        assert sock is not None
        for _ in range(_TURN):
            try:
                frames = sock.recv_multipart(_NOBLOCK)
            except zmq.Again:
                break
            for frame in frames:
                self._counts["frames_in"] += 1
                if len(frame) > self.max_frame:
                    self._counts["oversized"] += 1
                    continue
                try:
                    msg = self._decode_back(frame)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    self._counts["malformed"] += 1
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
            self._reactor.redrain(fd, None, self._drain_peer, peer)
            return
        self._reactor.redrain(fd, sock, self._drain_peer, peer)

    def _acked(self, peer: _Peer, seqs: list[int]) -> None:
        settled = 0
        unsettled = peer.unsettled
        for seq in seqs:
            entry = unsettled.pop(seq, None)
            if entry is not None:
                settled += entry[1]
        if not settled:
            return
        peer.sent -= settled
        self._settled_by[peer.name] = self._settled_by.get(peer.name, 0) + settled
        backlog = peer.backlog
        while backlog and peer.sent < peer.credit:
            body, n = backlog.popleft()
            peer.backlog_n -= n
            self._send_frame(peer, body, n)
        self._settle(settled)

    def _settle(self, n: int) -> None:
        self._in_flight -= n
        self._counts["acked"] += n
        if self._credit_waiters:
            room = self.window - self._in_flight
            waiters = self._credit_waiters
            while waiters and room > 0:
                fut = waiters.popleft()
                if not fut.done():
                    fut.set_result(None)
                    room -= 1
        if not self._in_flight and self._idle_waiters:
            wake(self._idle_waiters)

    def _reply(self, msg: Reply) -> None:
        entry = self._requests.get(msg.request_id)
        self._counts["replies_received"] += 1
        if entry is None or entry[0].done():
            return  # answered already (locally, or by another node), or given up
        fut, topic = entry
        if msg.ok:
            fut.set_result(msg.value)
        else:
            fut.set_exception(RemoteHandlerError(topic, msg.error_type or "?", msg.error or ""))

    def _resend(self, peer: _Peer, expected: int) -> None:
        for seq in sorted(s for s in peer.unsettled if s >= expected):
            self._counts["resent"] += 1
            body = peer.unsettled[seq][0]
            self._send_data(peer, b"".join((_DATA_HEAD, self._enc.encode(seq), body)))

    def _peer_lost(self, peer: _Peer) -> None:
        """The directory dropped ``peer``: everything it had not settled goes to another
        member of the same group, or into this bus's DLQ as ``node_lost``."""
        self._disconnect(peer)
        self._counts["peers_lost"] += 1
        items = self._take_unsettled(peer)
        if not items:
            return
        _log.warning(
            "node %s lost with %d unsettled messages from %s: redelivered or dead-lettered",
            peer.name,
            len(items),
            self.node,
        )
        assert self._port is not None
        subs = {name for name, _ in self._subs}
        for item in items:
            env = item.env
            names = item.names or [n for n, p in peer.subs if matches(p, env.topic)]
            route = self._routes.get(env.topic) or self._route(env.topic)
            for name in names:
                others = route.groups.get(name)
                if others:
                    target = min(others, key=_Peer.load)
                    try:
                        self._encode(target, _wire_of(env, self._to_wire), [name], item.request)
                    except (EncodeError, FrameTooLarge) as exc:
                        # Off the publisher's call: the DLQ is where it can see this.
                        self._fail(env, name, "encode_error", exc)
                        continue
                    self._counts["redelivered"] += 1
                    continue
                if name in subs:
                    # The group is served here now: deliver it locally (a request's answer
                    # then completes its future directly).
                    self._counts["redelivered"] += 1
                    self._reactor.background(self._deliver_here(env, name, peer.name))
                    continue
                self._lost(env, name, "node_lost", peer.name)

    async def _deliver_here(self, env: Envelope, name: str, where: str) -> None:
        assert self._port is not None
        request = self._requests.get(env.id)
        env.reply = request[0] if request is not None else None
        try:
            waiting = self._port.deliver(env, [name])
            if waiting is not None:
                await waiting
        except (BusClosedError, QueueFullError):
            self._lost(env, name, "node_lost", where)

    def _lost(self, env: Envelope, subscriber: str, reason: str, where: str) -> None:
        assert self._port is not None
        error = PeerLost(
            f"node {where!r} holding {env.topic!r} for {subscriber!r} was lost and no other "
            f"member of that group could take it"
            if reason == "node_lost"
            else f"node {self.node!r} closed before node {where!r} settled it"
        )
        request = self._requests.get(env.id)
        if request is not None and not request[0].done():
            request[0].set_exception(error)
        if reason == "node_lost":
            self._counts["node_lost"] += 1
        self._port.dead_letter(env, subscriber, reason, error)

    def _fail(self, env: Envelope, subscriber: str, reason: str, error: BaseException) -> None:
        assert self._port is not None
        request = self._requests.get(env.id)
        if request is not None and not request[0].done():
            request[0].set_exception(error)
        self._port.dead_letter(env, subscriber, reason, error)

    def _take_unsettled(self, peer: _Peer) -> list[Item]:
        """Everything sent or queued to ``peer`` and not settled, decoded, and the window
        room it held given back."""
        self._dirty.discard(peer)
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
        for body in bodies:
            for item in _ITEMS.decode(body):
                item.env.created -= self._to_wire
                items.append(item)
        if count:
            self._in_flight -= count
            if self._credit_waiters or self._idle_waiters:
                self._settle(0)
        return items

    def _dead_letter_all(self, peer: _Peer, reason: str) -> None:
        for item in self._take_unsettled(peer):
            names = item.names or ["<remote>"]
            for name in names:
                self._lost(item.env, name, reason, peer.name)

    # -- control -------------------------------------------------------------------------------

    def _drain_control(self) -> None:
        fd = self._control_fd
        sync = self._sync
        if fd is None or sync is None or self._loop is None:
            return
        self._reactor.drained(fd)
        for _ in range(_TURN):
            try:
                frames = sync.recv_multipart(_NOBLOCK)
            except zmq.Again:
                break
            self._last_heard = self._loop.time()
            for frame in frames:
                self._counts["frames_in"] += 1
                try:
                    msg = self._decode_control(frame)
                except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                    self._counts["malformed"] += 1
                    _log.warning("dropped a malformed frame from the broker: %s", exc)
                    continue
                try:
                    self._handle_control(msg)
                except Exception:
                    _log.exception("node %s failed to handle a broker frame", self.node)
            if self._sync is None:
                return
        else:
            self._reactor.redrain(fd, None, self._drain_control)
            return
        self._reactor.redrain(fd, sync, self._drain_control)

    def _handle_control(self, msg: Any) -> None:
        kind = type(msg)
        if kind is Directory:
            self._set_directory(self._checked(msg.peers))
            # What this turn batched was routed by the old directory: out before the ack,
            # which tells a node that is leaving a group that we route around it now.
            self._flush_all()
            self._send_control(self._enc.encode(DirectoryAck(msg.version)))
        elif kind is Pong:
            self._pong(msg)
        elif kind is SubsAck:
            self._subs_acked = max(self._subs_acked, msg.version)
            wake(self._sync_waiters)
        elif kind is Reset:
            _log.warning("broker reset node %s (%s); re-joining", self.node, msg.reason)
            self._rejoin()
        elif kind is Welcome and not self._connected:
            self._counts["rejoined"] += 1
            if msg.epoch != self._broker_epoch:
                # A new broker run. The data links never went through the broker and are
                # intact; its first directories are partial (see _set_directory).
                assert self._loop is not None
                self._broker_epoch = msg.epoch
                # Every live node is heard by then, or this broker drops it anyway.
                self._settling_until = self._loop.time() + msg.heartbeat * msg.liveness
            else:
                # Back after this broker reset us: the others dropped our links.
                for peer in self._peers.values():
                    self._relink(peer)
            self._welcomed()

    def _checked(self, infos: list[PeerInfo]) -> list[PeerInfo]:
        """The directory's entries this node can link to. Without CURVE any process that
        reaches the broker can join with anything in its HELLO; a bad entry (an endpoint
        libzmq refuses, a bad key, this node's own name) is dropped and counted as
        ``directory_dropped``, and the rest of the directory still applies. A name listed
        twice (a node restarted before the broker lost its old self) keeps its last entry,
        the newest join, as the directory always did."""
        good: dict[str, PeerInfo] = {}
        for info in infos:
            problem = peer_problem(info)
            if problem is None and info.name == self.node:
                problem = "a directory entry under this node's own name"
            if problem is None:
                good.pop(info.name, None)  # the newest join last
                good[info.name] = info
                continue
            self._counts["directory_dropped"] += 1
            n = self._counts["directory_dropped"]
            if n <= 10 or not n % 1000:
                _log.warning(
                    "node %s dropped directory entry #%d (%r): %s", self.node, n, info.name, problem
                )
        return list(good.values())

    def _set_directory(self, infos: list[PeerInfo]) -> None:
        """Link to the peers ``infos`` lists, and lose those it no longer does. Except for
        a while after a broker restart: the new broker lists only the nodes that have
        joined it so far, and the others, alive, are on their way. Until ``heartbeat *
        liveness`` after a WELCOME from a new broker run, an unlisted peer and its links
        are kept; ``_beat`` then applies the latest directory in full."""
        self._listed = infos
        assert self._loop is not None
        if self._loop.time() < self._settling_until:
            listed = {info.name for info in infos}
            infos = infos + [p.info() for p in self._peers.values() if p.name not in listed]
        new = {info.name: info for info in infos}
        lost: list[_Peer] = []
        for name, peer in list(self._peers.items()):
            info = new.get(name)
            if (
                info is None
                or info.incarnation != peer.incarnation
                or info.data != peer.data
                or info.key != peer.key
            ):
                del self._peers[name]
                lost.append(peer)
            else:
                peer.subs = list(info.subs)
                peer.credit = max(1, info.credit)
        self._keys = frozenset(info.key for info in infos if info.key is not None)
        for info in infos:
            if info.name not in self._peers and self._ctx is not None:
                peer = _Peer(info)
                try:
                    self._connect(peer)
                except zmq.ZMQError as exc:
                    # What _checked cannot foresee (libzmq's own limits): that entry only.
                    self._counts["directory_dropped"] += 1
                    _log.warning(
                        "node %s cannot link to %s at %s: %s", self.node, info.name, info.data, exc
                    )
                    continue
                self._peers[info.name] = peer
        self._inbox.forget_unlisted({f"{i.name}/{i.incarnation:x}".encode() for i in infos})
        self._reindex()
        for peer in lost:
            self._peer_lost(peer)

    async def _beat(self) -> None:
        assert self._loop is not None
        loop = self._loop
        while True:
            await asyncio.sleep(self.heartbeat)
            if self._settling_until and loop.time() >= self._settling_until:
                self._settling_until = 0.0
                self._set_directory(self._listed)
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
                    self._send_control(self._enc.encode(Ping(time.time_ns())))
            else:
                self._send_control(self._hello())
            for peer in self._peers.values():
                if peer.unsettled:
                    ping = LinkPing(peer.out_seq - 1, min(peer.unsettled))
                    self._send_data(peer, self._enc.encode(ping))

    def _pong(self, pong: Pong) -> None:
        t4 = time.time_ns()
        delay = (t4 - pong.t1) - (pong.t3 - pong.t2)
        offset = ((pong.t2 - pong.t1) + (pong.t3 - t4)) // 2
        self._clock.append((delay, offset))
        self._rtt, self._offset = min(self._clock)
        self._to_wire = self._mono_to_wall + self._offset

    def _wire_offset(self) -> int:
        return self._to_wire

    def _rejoin(self) -> None:
        self._connected = False
        self._send_control(self._hello())


def _wire_of(env: Envelope, to_wire: int) -> tuple[Any, ...]:
    """An envelope as it travels (see ``_wire``): its fields without ``context`` and
    ``reply``, ``created`` moved to the broker's wall clock."""
    return (
        env.topic, env.payload, env.priority, env.id, env.session_id, env.correlation_id,
        env.causation_id, env.trace, env.created + to_wire, env.hops, env.source,
    )  # fmt: skip


def _not_encodable(topic: str, exc: BaseException) -> EncodeError:
    return EncodeError(
        f"cannot send {topic!r} to other nodes: its payload is not msgpack-encodable "
        f"({exc}); use dicts, lists, str, numbers, bytes or msgspec Structs"
    )


class _KeyGate:
    """ZAP credentials provider for a node's data socket (see ``ZmqTransport._admit``)."""

    def __init__(self, transport: ZmqTransport) -> None:
        self.transport = transport

    def callback(self, domain: str, key: bytes) -> bool:
        return self.transport._admit(key)


def _log_send_failure(fut: asyncio.Future[Any]) -> None:
    if not fut.cancelled() and fut.exception() is not None:
        _log.warning("send to the broker failed: %s", fut.exception())
