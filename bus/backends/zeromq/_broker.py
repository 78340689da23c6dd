"""The broker: one ROUTER socket that routes messages between nodes by exact glob match.

Why a broker and not peer-to-peer: nodes then need one address, consumer groups need one
place that picks a member, and a dead node needs one place that knows what it held.

Per message the broker decodes only the topic (the envelope stays a ``msgspec.Raw`` slice
of the incoming frame and is copied out verbatim), resolves the topic once per distinct
topic with :class:`~bus._topics.GlobIndex`, and for every consumer group (subscriptions of
one name) that matches picks one live member node: the least loaded, round-robin on ties.
A group with a member on the publishing node itself is skipped: that node served it
locally. Messages for one node are batched per drain of the socket into data frames, sent
with that node's DONE, LOST and reply frames as one ZeroMQ message (one wake-up there).

Accounting: a data frame from a node stays unsettled (no DONE back) until every copy the
broker made of its messages is settled by the node that received it. So the publisher's
window bounds everything the broker holds for it, and credit crosses the wire: a slow
consumer stops settling, the broker stops sending to it past its advertised credit, and the
publisher's window fills, which makes its ``emit`` wait. When a node dies (no frame for
``heartbeat * liveness`` seconds, or a BYE), every message it had not settled goes to
another member of the same group, or back to the publisher as a ``node_lost`` dead letter.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Iterable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from bus._topics import GlobIndex
from bus.backends.zeromq._keys import CurveKeys
from bus.backends.zeromq._wire import (
    DEFAULT_MAX_FRAME,
    PROTOCOL,
    Bye,
    DataUp,
    Done,
    Hello,
    Interest,
    InterestAck,
    Lost,
    Nack,
    Ping,
    Pong,
    ReplyUp,
    Reset,
    Subs,
    SubsAck,
    Welcome,
    array_header,
    up_decoder,
)

__all__ = ["DEFAULT_BATCH_MAX", "Broker"]

_log = logging.getLogger("bus.zeromq.broker")

#: Messages per data frame at most; a frame is also cut before it would pass ``max_frame``.
DEFAULT_BATCH_MAX = 1024
#: Distinct topics whose group routes are cached (dropped whole on any membership change).
_ROUTE_CACHE = 10_000
#: Frames handled back to back before the broker flushes its batches and yields the loop.
_TURN = 256
_DATA_HEAD = b"\x93\x05"
#: Frames are cut near this size: sends past ~64 KB cost ten times more (see _node.py).
_BATCH_BYTES = 32 * 1024
_NOBLOCK = int(zmq.NOBLOCK)
_SNDMORE = int(zmq.SNDMORE)
_EVENTS = int(zmq.EVENTS)


class _Member:
    __slots__ = ("name", "node", "pattern")

    def __init__(self, node: _Node, name: str, pattern: str) -> None:
        self.node = node
        self.name = name
        self.pattern = pattern


class _Flight:
    """Copies of consecutive messages of one incoming frame on their way to one node, for
    the same subscriptions: routed, counted against credit and settled as one, so the
    broker's work per message is a list append (messages split across a frame boundary
    or a credit limit split the flight)."""

    __slots__ = ("envs", "explicit", "names", "origin", "origin_seq", "reply_to")

    def __init__(
        self,
        origin: _Node,
        origin_seq: int,
        envs: list[msgspec.Raw],
        names: list[str],
        explicit: bool,
        reply_to: str | None,
    ) -> None:
        self.origin = origin
        self.origin_seq = origin_seq
        self.envs = envs
        self.names = names
        self.explicit = explicit
        self.reply_to = reply_to

    def split(self, n: int) -> _Flight:
        """Take the first ``n`` messages off into a flight of their own."""
        head = _Flight(
            self.origin, self.origin_seq, self.envs[:n], self.names, self.explicit, self.reply_to
        )
        del self.envs[:n]
        return head


class _Node:
    __slots__ = (
        "alive",
        "backlog",
        "backlog_n",
        "batch",
        "control",
        "credit",
        "done_out",
        "expected_in",
        "ident",
        "in_flight",
        "incarnation",
        "interest_acked",
        "interest_sent",
        "interest_version",
        "last_seen",
        "lost_out",
        "members",
        "nacked",
        "name",
        "out_seq",
        "picked",
        "subs",
        "subs_version",
        "unsettled",
        "upstream",
    )

    def __init__(self, ident: bytes, hello: Hello, now: float) -> None:
        self.ident = ident
        self.name = hello.node
        self.incarnation = hello.incarnation
        self.credit = max(1, hello.credit)
        self.subs: dict[str, str] = {}
        self.members: list[_Member] = []
        self.alive = True
        self.last_seen = now
        self.expected_in = 0  # next data seq expected from the node
        self.nacked: int | None = None
        self.upstream: dict[int, int] = {}  # node's frame seq -> copies not yet settled
        self.out_seq = 0
        self.unsettled: dict[int, tuple[bytes, list[_Flight]]] = {}
        self.in_flight = 0  # copies batched or sent to the node, not settled
        self.batch: list[_Flight] = []
        self.backlog: deque[_Flight] = deque()  # waiting for the node's credit
        self.backlog_n = 0  # messages in the backlog
        self.picked = 0  # messages routed to the node from the frame being routed
        self.done_out: list[int] = []
        self.control: list[bytes] = []  # replies for the node, sent with the next flush
        self.lost_out: list[tuple[msgspec.Raw, str, str]] = []
        self.interest_sent: list[str] | None = None
        self.interest_version = 0  # of the last INTEREST sent to the node
        self.interest_acked = 0
        self.subs_version: int | None = None  # a SUBS/HELLO version waiting for SUBS_ACK


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
    """Routes messages between :class:`~bus.backends.zeromq.ZmqTransport` nodes.

    ``bind`` is a ZeroMQ endpoint (``tcp://127.0.0.1:0`` picks a free port; ``.endpoint``
    tells which). With ``curve`` the broker is a CURVE server and a ZAP handler admits only
    the public keys in ``allow``. A node is lost after ``heartbeat * liveness`` seconds
    without a frame. Frames over ``max_frame`` bytes are counted and dropped (ZeroMQ's own
    ``MAXMSGSIZE`` at twice that drops the connection of a sender of anything larger).
    """

    def __init__(
        self,
        bind: str = "tcp://127.0.0.1:5555",
        *,
        curve: CurveKeys | None = None,
        allow: Iterable[bytes] = (),
        heartbeat: float = 1.0,
        liveness: int = 3,
        max_frame: int = DEFAULT_MAX_FRAME,
        batch_max: int = DEFAULT_BATCH_MAX,
    ) -> None:
        if heartbeat <= 0 or liveness < 1:
            raise ValueError(
                f"Broker: heartbeat must be > 0 and liveness >= 1, got {heartbeat}, {liveness}"
            )
        if max_frame < 1024 or batch_max < 1:
            raise ValueError(
                f"Broker: max_frame must be >= 1024 and batch_max >= 1, "
                f"got {max_frame}, {batch_max}"
            )
        self.bind = bind
        self.curve = curve
        self.allow = [k.encode("ascii") if isinstance(k, str) else k for k in allow]
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.max_frame = max_frame
        self.batch_max = batch_max
        self.endpoint: str | None = None
        self._ctx: zmq.asyncio.Context | None = None
        self._sock: zmq.asyncio.Socket | None = None
        self._sync: zmq.Socket[bytes] | None = None
        self._auth: Any = None
        self._tasks: list[asyncio.Task[None]] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._fd: int | None = None
        self._draining = False
        self._drain_handle: asyncio.Handle | None = None
        self._send_backlog: deque[list[bytes]] = deque()
        self._retry_handle: asyncio.TimerHandle | None = None
        self._nodes: dict[bytes, _Node] = {}
        self._index: GlobIndex[_Member] = GlobIndex()
        self._routes: dict[str, tuple[dict[str, list[_Member]], dict[_Node, int]]] = {}
        self._rr: dict[str, int] = {}
        self._dirty: set[_Node] = set()
        self._decode = up_decoder().decode
        self._enc = msgspec.msgpack.Encoder()
        self._interest_changed = False
        self._interest_seq = 0
        # (node, its subs version, {other node: interest version it must acknowledge})
        self._syncs: list[tuple[_Node, int, dict[_Node, int]]] = []
        self._counts = dict.fromkeys(
            (
                "frames_in",
                "frames_out",
                "messages_in",
                "messages_out",
                "malformed",
                "oversized",
                "unrouted",
                "duplicates",
                "gaps",
                "resent",
                "redelivered",
                "node_lost",
                "lost_unreported",
                "nodes_lost",
                "replies",
                "unroutable",
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
        # Unbounded ZeroMQ queues on purpose: credit bounds what can be in them, and a
        # ROUTER at its high-water mark drops silently.
        sock.setsockopt(zmq.SNDHWM, 0)
        sock.setsockopt(zmq.RCVHWM, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 2 * self.max_frame)
        sock.setsockopt(zmq.LINGER, 0)
        if self.curve is not None:
            from zmq.auth.asyncio import AsyncioAuthenticator

            self._auth = AsyncioAuthenticator(self._ctx)
            self._auth.start()
            if not self.allow:
                _log.warning("CURVE broker with an empty allow-list: every node is refused")
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
        # The socket is read by a plain reader callback on its FD: no task, no future per
        # wake-up; sends are non-blocking on the shadow socket.
        self._fd = self._sync.getsockopt(zmq.FD)
        loop.add_reader(self._fd, self._drain)
        self._tasks = [loop.create_task(self._watch(), name="zmq-broker:heartbeat")]
        _log.info("broker listening on %s%s", self.endpoint, " (CURVE)" if self.curve else "")

    async def aclose(self) -> None:
        if self._fd is not None and self._loop is not None:
            self._loop.remove_reader(self._fd)
            self._fd = None
        for handle in (self._drain_handle, self._retry_handle):
            if handle is not None:
                handle.cancel()
        self._drain_handle = self._retry_handle = None
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
        """Counters since start, and each node's link state, as plain data (JSON-able)."""
        nodes = {
            n.name: {
                "in_flight": n.in_flight,
                "backlog": n.backlog_n,
                "credit": n.credit,
                "unsettled_frames": len(n.unsettled),
                "upstream_frames": len(n.upstream),
                "subscriptions": dict(n.subs),
            }
            for n in self._nodes.values()
        }
        return {"endpoint": self.endpoint, "nodes": nodes, **self._counts}

    # -- the loop ----------------------------------------------------------------------------

    def _drain(self) -> None:
        """The reader: handle every message the socket has without waiting (an await per
        message costs more than handling it), then flush the batches it made. After
        ``_TURN`` messages it reschedules itself so heartbeats keep their time."""
        self._drain_handle = None
        sync, loop = self._sync, self._loop
        if sync is None or loop is None or self._fd is None:
            return
        self._draining = True
        try:
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
            if self._drain_handle is None and sync.getsockopt(_EVENTS) & 1:
                self._drain_handle = loop.call_soon(self._drain)
        finally:
            self._draining = False

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
        counts["frames_in"] += 1
        if len(frame) > self.max_frame:
            counts["oversized"] += 1
            _log.warning(
                "dropped an oversized frame (%d bytes > %d) from %r",
                len(frame),
                self.max_frame,
                ident,
            )
            return
        try:
            msg = self._decode(frame)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self._malformed(ident, str(exc))
            return
        node = self._nodes.get(ident)
        if type(msg) is Hello:
            self._hello(ident, msg)
            return
        if node is None:
            self._send(ident, self._enc.encode(Reset("unknown node: send HELLO")))
            return
        assert self._loop is not None
        node.last_seen = self._loop.time()
        kind = type(msg)
        if kind is DataUp:
            self._data(node, msg)
        elif kind is Done:
            self._done(node, msg.seqs)
        elif kind is Ping:
            self._ping(node, msg)
        elif kind is ReplyUp:
            self._reply(node, msg, frame)
        elif kind is Subs:
            self._set_subs(node, msg.subs, msg.version)
        elif kind is InterestAck:
            self._interest_acked(node, msg.version)
        elif kind is Nack:
            self._resend(node, msg.expected)
        elif kind is Bye:
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
        old = self._nodes.get(ident)
        if old is not None and old.incarnation == hello.incarnation:
            # A repeated HELLO (the node's handshake retry): answer again, change nothing.
            old.last_seen = asyncio.get_running_loop().time()
            old.interest_sent = None
            self._welcome(old)
            return
        if old is not None:
            self._lose(old, reason="restarted")
        node = _Node(ident, hello, asyncio.get_running_loop().time())
        self._nodes[ident] = node
        self._set_subs(node, hello.subs, hello.subs_version)
        self._welcome(node)
        _log.info("node %s joined (%d subscriptions)", node.name, len(hello.subs))

    def _welcome(self, node: _Node) -> None:
        welcome = Welcome("broker", self.heartbeat, self.liveness, self.max_frame)
        self._send(node.ident, self._enc.encode(welcome))
        self._interest_changed = True
        self._dirty.add(node)

    def _set_subs(self, node: _Node, subs: list[tuple[str, str]], version: int) -> None:
        for member in node.members:
            self._index.remove(member.pattern, member)
        node.subs = dict(subs)
        node.members = [_Member(node, name, pattern) for name, pattern in node.subs.items()]
        for member in node.members:
            self._index.add(member.pattern, member)
        self._routes.clear()
        self._interest_changed = True
        node.subs_version = version
        self._dirty.add(node)

    def _interest_acked(self, node: _Node, version: int) -> None:
        node.interest_acked = max(node.interest_acked, version)
        self._check_syncs()

    def _check_syncs(self) -> None:
        """Answer SUBS_ACK to every node whose subscriptions every other node now sees."""
        keep = []
        for node, version, waiting in self._syncs:
            for other in [o for o, v in waiting.items() if o.interest_acked >= v or not o.alive]:
                del waiting[other]
            if waiting:
                keep.append((node, version, waiting))
            elif node.alive:
                self._send(node.ident, self._enc.encode(SubsAck(version)))
        self._syncs = keep

    def _lose(self, node: _Node, reason: str = "lost") -> None:
        """Take ``node`` out, and hand everything it had not settled to another member of
        the same group, or back to its publisher as a ``node_lost`` dead letter."""
        if not node.alive:
            return
        node.alive = False
        if self._nodes.get(node.ident) is node:
            del self._nodes[node.ident]
        if reason != "left":
            self._counts["nodes_lost"] += 1
        for member in node.members:
            self._index.remove(member.pattern, member)
        node.members = []
        self._routes.clear()
        self._interest_changed = True
        self._dirty.discard(node)
        flights = [f for _, frame_flights in node.unsettled.values() for f in frame_flights]
        flights += node.batch
        flights += node.backlog
        node.unsettled.clear()
        node.batch = []
        node.backlog.clear()
        node.backlog_n = 0
        node.upstream.clear()
        self._check_syncs()
        for flight in flights:
            self._reassign(flight, node)
        if flights:
            _log.warning(
                "node %s %s with %d unsettled messages: reassigned or dead-lettered",
                node.name,
                reason,
                len(flights),
            )

    def _reassign(self, flight: _Flight, dead: _Node) -> None:
        origin, seq = flight.origin, flight.origin_seq
        for env in flight.envs:
            for name in flight.names:
                members = [m for m in self._index.items() if m.name == name]
                target = self._pick(name, members, origin)
                if target is not None:
                    origin.upstream[seq] = origin.upstream.get(seq, 0) + 1
                    self._enqueue(
                        target, _Flight(origin, seq, [env], [name], True, flight.reply_to)
                    )
                    self._counts["redelivered"] += 1
                elif origin.alive:
                    origin.lost_out.append((env, name, "node_lost"))
                    self._dirty.add(origin)
                    self._counts["node_lost"] += 1
                else:
                    self._counts["lost_unreported"] += 1
                    _log.error(
                        "message for %s lost with node %s, and its publisher %s is gone too",
                        name,
                        dead.name,
                        origin.name,
                    )
        self._settle_origin(origin, seq, len(flight.envs))

    # -- routing -----------------------------------------------------------------------------

    def _resolve(self, topic: str) -> tuple[dict[str, list[_Member]], dict[_Node, int]]:
        groups: dict[str, list[_Member]] = {}
        per_node: dict[_Node, int] = {}
        for member in self._index.resolve(topic):
            groups.setdefault(member.name, []).append(member)
            per_node[member.node] = per_node.get(member.node, 0) + 1
        if len(self._routes) >= _ROUTE_CACHE:
            self._routes.clear()
        self._routes[topic] = route = (groups, per_node)
        return route

    def _pick(self, name: str, members: list[_Member], origin: _Node) -> _Node | None:
        if len(members) == 1:
            node = members[0].node
            return node if node.alive and node is not origin else None
        start = self._rr.get(name, 0)
        self._rr[name] = start + 1
        best: _Node | None = None
        best_load = 0
        n = len(members)
        for i in range(n):
            node = members[(start + i) % n].node
            if node is origin or not node.alive:
                continue
            load = node.in_flight + node.backlog_n + node.picked
            if best is None or load < best_load:
                best, best_load = node, load
        return best

    def _data(self, node: _Node, msg: DataUp) -> None:
        seq = msg.seq
        if seq != node.expected_in:
            if seq < node.expected_in:
                self._counts["duplicates"] += 1
                if seq not in node.upstream:
                    node.done_out.append(seq)  # settled before: say so again
                    self._dirty.add(node)
            else:
                self._counts["gaps"] += 1
                if node.nacked != node.expected_in:
                    node.nacked = node.expected_in
                    self._send(node.ident, self._enc.encode(Nack(node.expected_in)))
                    _log.warning(
                        "gap from node %s: expected frame %d, got %d; asked to resend",
                        node.name,
                        node.expected_in,
                        seq,
                    )
            return
        node.expected_in = seq + 1
        node.nacked = None
        self._counts["messages_in"] += len(msg.items)
        routes = self._routes
        subs = node.subs
        copies = 0
        flights: list[tuple[_Node, _Flight]] = []
        # the flight each target node got last from this frame: the next message with the
        # same names and reply address joins it
        last: dict[_Node, _Flight] = {}
        for item in msg.items:
            route = routes.get(item.topic)
            if route is None:
                route = self._resolve(item.topic)
            groups, per_node = route
            picked: dict[_Node, list[str]] | None = None
            for name, members in groups.items():
                if name in subs and any(m.node is node for m in members):
                    continue  # the publisher's own member matched: served there, locally
                target = self._pick(name, members, node)
                if target is None:
                    continue
                if picked is None:
                    picked = {target: [name]}
                elif target in picked:
                    picked[target].append(name)
                else:
                    picked[target] = [name]
            if picked is None:
                self._counts["unrouted"] += 1
                continue
            reply_to = node.name if item.request else None
            for target, names in picked.items():
                flight = last.get(target)
                if flight is not None and flight.reply_to == reply_to and flight.names == names:
                    flight.envs.append(item.env)
                else:
                    explicit = len(names) != per_node[target]
                    last[target] = flight = _Flight(
                        node, seq, [item.env], names, explicit, reply_to
                    )
                    flights.append((target, flight))
                target.picked += 1
                copies += 1
        if copies:
            node.upstream[seq] = copies
            for target, flight in flights:
                target.picked = 0
                self._enqueue(target, flight)
        else:
            node.done_out.append(seq)
            self._dirty.add(node)

    def _enqueue(self, node: _Node, flight: _Flight) -> None:
        n = len(flight.envs)
        if not node.backlog:
            room = node.credit - node.in_flight
            if n <= room:
                node.batch.append(flight)
                node.in_flight += n
                self._dirty.add(node)
                return
            if room > 0:
                node.batch.append(flight.split(room))
                node.in_flight += room
                self._dirty.add(node)
                n -= room
        node.backlog.append(flight)
        node.backlog_n += n

    def _settle_origin(self, origin: _Node, seq: int, n: int = 1) -> None:
        left = origin.upstream.get(seq)
        if left is None:
            return
        if left > n:
            origin.upstream[seq] = left - n
            return
        del origin.upstream[seq]
        if origin.alive:
            origin.done_out.append(seq)
            self._dirty.add(origin)

    def _done(self, node: _Node, seqs: list[int]) -> None:
        unsettled = node.unsettled
        for seq in seqs:
            entry = unsettled.pop(seq, None)
            if entry is None:
                continue
            for flight in entry[1]:
                n = len(flight.envs)
                node.in_flight -= n
                self._settle_origin(flight.origin, flight.origin_seq, n)
        backlog = node.backlog
        if backlog:
            while backlog and node.in_flight < node.credit:
                room = node.credit - node.in_flight
                flight = backlog[0]
                n = len(flight.envs)
                if n <= room:
                    backlog.popleft()
                else:
                    flight, n = flight.split(room), room
                node.batch.append(flight)
                node.in_flight += n
                node.backlog_n -= n
            self._dirty.add(node)

    def _ping(self, node: _Node, ping: Ping) -> None:
        t2 = time.time_ns()
        if ping.last_seq >= node.expected_in and node.nacked != node.expected_in:
            # The node sent frames we never got, and nothing after them to show the gap.
            self._counts["gaps"] += 1
            node.nacked = node.expected_in
            self._send(node.ident, self._enc.encode(Nack(node.expected_in)))
        pong = Pong(ping.t1, t2, time.time_ns(), node.out_seq - 1)
        self._send(node.ident, self._enc.encode(pong))

    def _reply(self, node: _Node, reply: ReplyUp, frame: bytes) -> None:
        target = next((n for n in self._nodes.values() if n.name == reply.to), None)
        if target is None:
            _log.warning("reply to request %d dropped: node %s is gone", reply.request_id, reply.to)
            return
        self._counts["replies"] += 1
        # Sent with the flush, in one message with the DONE its request's settling makes.
        target.control.append(frame)
        self._dirty.add(target)

    def _resend(self, node: _Node, expected: int) -> None:
        for seq in sorted(s for s in node.unsettled if s >= expected):
            self._counts["resent"] += 1
            self._send(node.ident, node.unsettled[seq][0])

    # -- sending -----------------------------------------------------------------------------

    def _send(self, ident: bytes, *frames: bytes) -> None:
        """Send ``frames`` to one node as one ZeroMQ message, non-blocking. A send can
        consume the FD's edge for input that arrived meanwhile, so outside the reader the
        socket is asked whether input waits, and the reader rescheduled if so."""
        sync = self._sync
        assert sync is not None
        self._counts["frames_out"] += len(frames)
        if self._send_backlog:
            self._send_backlog.append([ident, *frames])
            return
        try:
            sync.send(ident, _NOBLOCK | _SNDMORE)
            last = len(frames) - 1
            for i, frame in enumerate(frames):
                sync.send(frame, _NOBLOCK if i == last else _NOBLOCK | _SNDMORE)
        except zmq.Again:
            # Only past a high-water mark, which is off: keep the order, retry shortly.
            self._send_backlog.append([ident, *frames])
            self._schedule_retry()
        except zmq.ZMQError as exc:
            self._unroutable(ident, exc)
        if (
            not self._draining
            and self._drain_handle is None
            and self._loop is not None
            and self._fd is not None
            and sync.getsockopt(_EVENTS) & 1
        ):
            self._drain_handle = self._loop.call_soon(self._drain)

    def _schedule_retry(self) -> None:
        if self._retry_handle is None and self._loop is not None:
            self._retry_handle = self._loop.call_later(0.001, self._flush_backlog)

    def _flush_backlog(self) -> None:
        self._retry_handle = None
        backlog, sync = self._send_backlog, self._sync
        while backlog and sync is not None:
            try:
                sync.send_multipart(backlog[0], _NOBLOCK)
            except zmq.Again:
                self._schedule_retry()
                return
            except zmq.ZMQError as exc:
                self._unroutable(backlog[0][0], exc)
            backlog.popleft()

    def _unroutable(self, ident: bytes, exc: BaseException | None) -> None:
        self._counts["unroutable"] += 1
        node = self._nodes.get(ident)
        _log.warning("cannot reach %r (%s)", node.name if node else ident, exc)
        if node is not None:
            self._lose(node, reason="unreachable")

    def _flush(self) -> None:
        if self._interest_changed:
            self._interest_changed = False
            self._send_interest()
        while self._dirty:
            node = self._dirty.pop()
            if not node.alive:
                continue
            # Everything for the node goes as one message: one wake-up there. LOST before
            # DONE: once a publisher sees its frames settled (its drain returns), the dead
            # letters for them must already be in its DLQ.
            frames: list[bytes] = []
            if node.lost_out:
                entries, node.lost_out = node.lost_out, []
                self._lost_frames(entries, frames)
            if node.done_out:
                seqs, node.done_out = node.done_out, []
                frames.append(self._enc.encode(Done(seqs)))
            if node.control:
                frames += node.control
                node.control = []
            if node.batch:
                self._batch_frames(node, frames)
            if frames:
                self._send(node.ident, *frames)

    def _lost_frames(
        self, entries: list[tuple[msgspec.Raw, str, str]], frames: list[bytes]
    ) -> None:
        """LOST frames cut to stay well under the frame limit (the node drops bigger ones)."""
        chunk: list[tuple[msgspec.Raw, str, str]] = []
        size = 0
        for entry in entries:
            if chunk and size + len(entry[0]) > self.max_frame // 2:
                frames.append(self._enc.encode(Lost(chunk)))  # type: ignore[arg-type]
                chunk, size = [], 0
            chunk.append(entry)
            size += len(entry[0]) + len(entry[1]) + 16
        if chunk:
            frames.append(self._enc.encode(Lost(chunk)))  # type: ignore[arg-type]

    def _batch_frames(self, node: _Node, frames: list[bytes]) -> None:
        """Cut the node's batch into data frames of at most ``batch_max`` messages and about
        ``_BATCH_BYTES`` (always under ``max_frame``). A flight for every subscription of the
        topic on that node with no reply address is encoded as ``[env]`` per message (the
        item's trailing fields default): one ``join`` for the whole flight."""
        batch, node.batch = node.batch, []
        limit = min(self.max_frame - 64, _BATCH_BYTES)
        encode = self._enc.encode
        parts: list[bytes] = []  # encoded items of the frame being filled
        flights: list[_Flight] = []
        size = count = 0
        room = self.batch_max
        for flight in batch:
            # bytes per item besides the envelope: the item header, names and reply address
            extra = 3
            if flight.explicit:
                extra += sum(len(n.encode()) + 5 for n in flight.names) + 5
            if flight.reply_to is not None:
                extra += len(flight.reply_to.encode()) + 5
            while flight is not None:
                envs = flight.envs
                take = len(envs)
                if take > room - count:
                    take = room - count
                fits = sum(map(len, envs[:take])) + extra * take
                while take > 1 and size + fits > limit:
                    take //= 2
                    fits = sum(map(len, envs[:take])) + extra * take
                if count and size + fits > limit:
                    take = 0  # not even one more: close this frame first
                if take:
                    piece = flight.split(take) if take < len(envs) else flight
                    if piece.explicit or piece.reply_to is not None:
                        names = piece.names if piece.explicit else None
                        parts.extend(encode((env, names, piece.reply_to)) for env in piece.envs)
                    else:
                        parts.append(b"\x91" + b"\x91".join(piece.envs))
                    flights.append(piece)
                    size += fits
                    count += take
                    if piece is flight:
                        flight = None
                if flight is not None or count >= room:
                    frames.append(self._data_frame(node, flights, count, parts))
                    parts, flights, size, count = [], [], 0, 0

        if flights:
            frames.append(self._data_frame(node, flights, count, parts))

    def _data_frame(
        self, node: _Node, flights: list[_Flight], count: int, parts: list[bytes]
    ) -> bytes:
        seq = node.out_seq
        node.out_seq += 1
        frame = b"".join((_DATA_HEAD, self._enc.encode(seq), array_header(count), *parts))
        node.unsettled[seq] = (frame, flights)
        self._counts["messages_out"] += count
        return frame

    def _send_interest(self) -> None:
        live = [m for m in self._index.items() if m.node.alive]
        for node in self._nodes.values():
            # A member the node itself has (same name, same pattern) is served there.
            patterns = sorted(
                {
                    m.pattern
                    for m in live
                    if m.node is not node and node.subs.get(m.name) != m.pattern
                }
            )
            if patterns != node.interest_sent:
                self._interest_seq += 1
                node.interest_sent = patterns
                node.interest_version = self._interest_seq
                self._send(node.ident, self._enc.encode(Interest(self._interest_seq, patterns)))
        for node in self._nodes.values():
            if node.subs_version is not None:
                waiting = {
                    other: other.interest_version
                    for other in self._nodes.values()
                    if other is not node and other.interest_acked < other.interest_version
                }
                self._syncs.append((node, node.subs_version, waiting))
                node.subs_version = None
        self._check_syncs()
