"""The broker: a directory of live nodes, kept by one ROUTER socket. No message goes
through it.

Why a broker at all: nodes then need one address to join, one place that decides who is
alive (so every publisher redelivers a dead node's work at the same moment), one barrier
for "subscribed everywhere", and one clock to measure offsets against. Why not *through*
it: a brokered hop doubles the wake-ups of a round trip and adds a process to every
message's CPU; publishers route and send straight to the receiving node instead (see
``_node.py``).

Each node joins with HELLO: its subscriptions, the endpoint its data socket listens on, its
credit and (with CURVE) the public key that socket serves with. On every change of
membership or subscriptions the broker sends each node a DIRECTORY of the *other* live
nodes; a node acknowledges it once its routing reflects it, and a node waiting in
``sync()`` gets SUBS_ACK when every other node acknowledged a directory with its
subscriptions. A node is lost after ``heartbeat * liveness`` seconds without a frame (or at
its BYE): it drops out of the next directory, and each publisher redelivers or
dead-letters what it had sent there.
"""

from __future__ import annotations

import asyncio
import logging
import math
import secrets
import time
from collections.abc import Iterable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from bus._clock import clock_domain, mono_to_wall
from bus._errors import DecodeError
from bus.backends.zeromq._keys import CurveKeys
from bus.backends.zeromq._wire import (
    DEFAULT_MAX_FRAME,
    PROTOCOL,
    Bye,
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
    control_up_decoder,
    oversized,
    peer_problem,
)

__all__ = ["Broker"]

_log = logging.getLogger("bus.zeromq.broker")

#: Frames handled back to back before the broker yields the loop.
_TURN = 256
_NOBLOCK = int(zmq.NOBLOCK)
_EVENTS = int(zmq.EVENTS)


class _Node:
    __slots__ = (
        "acked",
        "alive",
        "credit",
        "data",
        "ident",
        "incarnation",
        "key",
        "last_seen",
        "name",
        "sent",
        "sent_version",
        "subs",
        "subs_version",
    )

    def __init__(self, ident: bytes, hello: Hello, now: float) -> None:
        self.ident = ident
        self.name = hello.node
        self.incarnation = hello.incarnation
        self.credit = max(1, hello.credit)
        self.data = hello.data
        self.key = hello.key
        self.subs = list(hello.subs)
        self.alive = True
        self.last_seen = now
        self.sent: list[PeerInfo] | None = None  # the directory last sent to the node
        self.sent_version = 0
        self.acked = 0  # newest directory version the node acknowledged
        self.subs_version: int | None = None  # a SUBS/HELLO version waiting for SUBS_ACK

    def info(self) -> PeerInfo:
        return PeerInfo(self.name, self.incarnation, self.data, self.key, self.credit, self.subs)


class _AllowList:
    """ZAP credentials provider: a CURVE client key is allowed iff it is on the list."""

    def __init__(self, keys: Iterable[bytes]) -> None:
        self.keys = frozenset(keys)

    def callback(self, domain: str, key: bytes) -> bool:
        allowed = key in self.keys
        if not allowed:
            _log.warning("refused a node with CURVE public key %s", key.decode("ascii"))
        return allowed


class Broker:
    """Keeps the directory of :class:`~bus.backends.zeromq.ZmqTransport` nodes.

    ``bind`` is a ZeroMQ endpoint (``tcp://127.0.0.1:0`` picks a free port; ``.endpoint``
    tells which). With ``curve`` the broker is a CURVE server and a ZAP handler admits only
    the public keys in ``allow``, which must then list at least one (ValueError otherwise:
    such a broker would refuse every node). A node is lost after
    ``heartbeat * liveness`` seconds without a frame. Frames over ``max_frame`` bytes are
    counted and dropped (ZeroMQ's own ``MAXMSGSIZE`` at twice that drops the connection of
    a sender of anything larger).
    """

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:5555",
        *,
        curve: CurveKeys | None = None,
        allow: Iterable[bytes | str] = (),
        heartbeat: float = 1.0,
        liveness: int = 3,
        max_frame: int = DEFAULT_MAX_FRAME,
    ) -> None:
        if not (math.isfinite(heartbeat) and heartbeat > 0) or liveness < 1:  # nan too
            raise ValueError(
                f"Broker: heartbeat must be > 0 and liveness >= 1, got {heartbeat}, {liveness}"
            )
        if max_frame < 1024:
            raise ValueError(f"Broker: max_frame must be >= 1024, got {max_frame}")
        self.allow = [k.encode("ascii") if isinstance(k, str) else k for k in allow]
        if curve is not None and not self.allow:
            raise ValueError(
                "Broker: curve needs the public keys of the nodes that may join in allow; "
                "with none, every node would be refused"
            )
        self.bind = bind
        self.curve = curve
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.max_frame = max_frame
        self.endpoint: str | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._sync: zmq.Socket[bytes] | None = None
        self._auth: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._drain_handle: asyncio.Handle | None = None
        self._nodes: dict[bytes, _Node] = {}
        self._decode = control_up_decoder(self.max_frame).decode
        self._enc = msgspec.msgpack.Encoder()
        self._changed = False
        self._version = 0
        self._epoch = secrets.randbits(63)
        # The reference clock every envelope's ``created`` crosses the wire on (``_wire``).
        self._mono_to_wall = mono_to_wall()
        # (node, its subs version, {other node: directory version it must acknowledge})
        self._syncs: list[tuple[_Node, int, dict[_Node, int]]] = []
        self._counts = dict.fromkeys(
            (
                "frames_in",
                "frames_out",
                "malformed",
                "oversized",
                "nodes_lost",
                "unroutable",
                "refused_hellos",
            ),
            0,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def __aenter__(self) -> Broker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start(self) -> None:
        if self._sock is not None:
            return
        self._ctx = zmq.asyncio.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
        sock.setsockopt(zmq.ROUTER_HANDOVER, 1)
        sock.setsockopt(zmq.MAXMSGSIZE, 2 * self.max_frame)
        sock.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            from zmq.auth.asyncio import AsyncioAuthenticator

            self._auth = AsyncioAuthenticator(self._ctx)
            self._auth.start()
            self._auth.configure_curve_callback("*", credentials_provider=_AllowList(self.allow))
            sock.curve_secretkey = self.curve.secret
            sock.curve_publickey = self.curve.public
            sock.curve_server = True
        try:
            sock.bind(self.bind)
        except zmq.ZMQError as exc:
            sock.close(0)
            await self._stop_context()
            raise OSError(f"broker cannot bind {self.bind}: {exc}") from exc
        self._sock = sock
        self._sync = zmq.Socket.shadow(sock.underlying)
        self.endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        self._loop = loop = asyncio.get_running_loop()
        # Read by a plain reader callback on the socket's FD: no task, no future per frame.
        self._fd = fd = self._sync.fileno()  # ZMQ_FD (getsockopt is typed int | bytes)
        loop.add_reader(fd, self._drain)
        self._tasks = [loop.create_task(self._watch(), name="zmq-broker:heartbeat")]
        _log.info("broker listening on %s%s", self.endpoint, " (CURVE)" if self.curve else "")

    async def aclose(self) -> None:
        if self._fd is not None and self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._fd = None
        if self._drain_handle is not None:
            self._drain_handle.cancel()
            self._drain_handle = None
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None
        await self._stop_context()

    async def _stop_context(self) -> None:
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def stats(self) -> dict[str, Any]:
        """Counters since start and the live nodes, as plain data (JSON-able)."""
        nodes = {
            n.name: {"data": n.data, "credit": n.credit, "subscriptions": dict(n.subs)}
            for n in self._nodes.values()
        }
        return {"endpoint": self.endpoint, "nodes": nodes, **self._counts}

    # -- the loop ----------------------------------------------------------------------------

    def _drain(self) -> None:
        """The reader: handle every frame the socket has without waiting, then send the
        directories the changes made. Reschedules itself after ``_TURN`` messages."""
        self._drain_handle = None
        sync, loop = self._sync, self._loop
        if sync is None or loop is None or self._fd is None:
            return
        for _ in range(_TURN):
            try:
                parts = sync.recv_multipart(_NOBLOCK)
            except zmq.Again:
                break
            try:
                self._handle(parts)
            except Exception:
                # A bug here must not take every node down with it; say so loudly.
                _log.exception("broker failed to handle a frame; dropped it")
        else:
            self._drain_handle = loop.call_soon(self._drain)
        self._flush()
        # pyzmq types getsockopt as int | bytes; ZMQ_EVENTS is an int.
        if self._drain_handle is None and sync.getsockopt(_EVENTS) & 1:  # type: ignore[operator]
            self._drain_handle = loop.call_soon(self._drain)

    async def _watch(self) -> None:
        loop = asyncio.get_running_loop()
        deadline = self.heartbeat * self.liveness
        while True:
            await asyncio.sleep(self.heartbeat / 2)
            now = loop.time()
            for node in list(self._nodes.values()):
                if now - node.last_seen > deadline:
                    _log.warning(
                        "node %s lost: no frame for %.1fs (heartbeat %.2fs x liveness %d)",
                        node.name,
                        now - node.last_seen,
                        self.heartbeat,
                        self.liveness,
                    )
                    self._lose(node)
            self._flush()

    def _handle(self, parts: list[bytes]) -> None:
        """One ZeroMQ message: the node's identity, then one or more frames."""
        if len(parts) < 2:
            self._counts["frames_in"] += 1
            self._malformed(parts[0] if parts else b"?", "no frame after the identity")
            return
        ident = parts[0]
        for i in range(1, len(parts)):
            self._frame(ident, parts[i])

    def _frame(self, ident: bytes, frame: bytes) -> None:
        counts = self._counts
        if oversized(frame, self.max_frame, counts, ident, _log):
            return
        try:
            msg = self._decode(frame)
        except DecodeError as exc:
            self._malformed(ident, str(exc))
            return
        if type(msg) is Hello:
            self._hello(ident, msg)
            return
        node = self._nodes.get(ident)
        if node is None:
            self._send(ident, self._enc.encode(Reset("unknown node: send HELLO")))
            return
        assert self._loop is not None
        node.last_seen = self._loop.time()
        if type(msg) is Ping:
            shift = self._mono_to_wall
            t2 = time.monotonic_ns() + shift
            self._send(ident, self._enc.encode(Pong(msg.t1, t2, time.monotonic_ns() + shift)))
        elif type(msg) is DirectoryAck:
            node.acked = max(node.acked, msg.version)
            self._check_syncs()
        elif type(msg) is Subs:
            node.subs = list(msg.subs)
            node.subs_version = msg.version
            self._changed = True
        elif type(msg) is Bye:
            _log.info("node %s left", node.name)
            self._lose(node, reason="left")

    def _malformed(self, ident: bytes, why: str) -> None:
        self._counts["malformed"] += 1
        n = self._counts["malformed"]
        if n <= 10 or not n % 1000:
            _log.warning("dropped malformed frame #%d from %r: %s", n, ident, why)

    # -- membership --------------------------------------------------------------------------

    def _hello(self, ident: bytes, hello: Hello) -> None:
        if hello.version != PROTOCOL:
            self._malformed(ident, f"protocol {hello.version}, broker speaks {PROTOCOL}")
            self._send(ident, self._enc.encode(Reset(f"protocol {PROTOCOL} only")))
            return
        info = PeerInfo(
            hello.node, hello.incarnation, hello.data, hello.key, hello.credit, hello.subs
        )
        problem = peer_problem(info)
        if problem is not None:
            # Every node would be told to link to it: refused here, and each node checks
            # its directory again anyway (a broker is not the only thing that can lie).
            self._counts["refused_hellos"] += 1
            n = self._counts["refused_hellos"]
            if n <= 10 or not n % 1000:
                _log.warning("refused HELLO #%d from %r: %s", n, ident, problem)
            self._send(ident, self._enc.encode(Reset(f"refused: {problem}")))
            return
        assert self._loop is not None
        old = self._nodes.get(ident)
        if old is not None and old.incarnation == hello.incarnation:
            # A repeated HELLO (the node's handshake retry): answer again, change nothing.
            old.last_seen = self._loop.time()
            old.sent = None
            self._welcome(old)
            return
        if old is not None:
            self._lose(old, reason="restarted")
        node = _Node(ident, hello, self._loop.time())
        node.subs_version = hello.subs_version
        self._nodes[ident] = node
        self._welcome(node)
        _log.info("node %s joined (%d subs, data at %s)", node.name, len(node.subs), node.data)

    def _welcome(self, node: _Node) -> None:
        welcome = Welcome(
            "broker",
            self.heartbeat,
            self.liveness,
            self.max_frame,
            self._epoch,
            clock_domain(),
            self._mono_to_wall,
        )
        self._send(node.ident, self._enc.encode(welcome))
        self._changed = True

    def _lose(self, node: _Node, reason: str = "lost") -> None:
        """Take ``node`` out: the next directory leaves it out, and every publisher
        redelivers or dead-letters what it had sent there."""
        if not node.alive:
            return
        node.alive = False
        if self._nodes.get(node.ident) is node:
            del self._nodes[node.ident]
        if reason != "left":
            self._counts["nodes_lost"] += 1
        self._changed = True
        self._check_syncs()

    def _check_syncs(self) -> None:
        """Answer SUBS_ACK to every node whose subscriptions every other node now sees."""
        keep = []
        for node, version, waiting in self._syncs:
            for other in [o for o, v in waiting.items() if o.acked >= v or not o.alive]:
                del waiting[other]
            if waiting:
                keep.append((node, version, waiting))
            elif node.alive:
                self._send(node.ident, self._enc.encode(SubsAck(version)))
        self._syncs = keep

    def _flush(self) -> None:
        if not self._changed:
            return
        self._changed = False
        infos = {node: node.info() for node in self._nodes.values()}
        # A send that finds a node unreachable loses it, which changes ``_nodes``.
        for node in list(self._nodes.values()):
            if not node.alive:
                continue
            peers = [info for other, info in infos.items() if other is not node and other.alive]
            if peers != node.sent:
                self._version += 1
                node.sent = peers
                node.sent_version = self._version
                self._send(node.ident, self._enc.encode(Directory(self._version, peers)))
        for node in list(self._nodes.values()):
            if node.subs_version is not None:
                waiting = {
                    other: other.sent_version
                    for other in self._nodes.values()
                    if other is not node and other.acked < other.sent_version
                }
                self._syncs.append((node, node.subs_version, waiting))
                node.subs_version = None
        self._check_syncs()

    # -- sending -----------------------------------------------------------------------------

    def _send(self, ident: bytes, frame: bytes) -> None:
        """Send one frame to one node, non-blocking. A send can consume the FD's edge for
        input that arrived meanwhile, so the reader is rescheduled if input waits."""
        sync = self._sync
        if sync is None:
            return
        self._counts["frames_out"] += 1
        try:
            sync.send_multipart((ident, frame), _NOBLOCK)
        except zmq.ZMQError as exc:
            # Unroutable (the node is gone) or, with no high-water mark, nothing else.
            self._counts["unroutable"] += 1
            node = self._nodes.get(ident)
            _log.warning("cannot reach %r (%s)", node.name if node else ident, exc)
            if node is not None:
                self._lose(node, reason="unreachable")
        if (
            self._drain_handle is None
            and self._loop is not None
            and self._fd is not None
            and sync.getsockopt(_EVENTS) & 1  # type: ignore[operator]  # typed int | bytes
        ):
            self._drain_handle = self._loop.call_soon(self._drain)
