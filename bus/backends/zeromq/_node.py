"""ZmqTransport: a bus's links to the broker (control) and to the other nodes (data).

Messages go straight from the publishing node to the receiving one: one hop each way, two
processes, no broker in the path. The broker only keeps the directory (who is alive, what
each subscribes to, where its data socket listens) and the heartbeats; see ``_broker.py``.

Each node binds one ROUTER data socket that every other node's publisher connects a
DEALER to. The publisher routes: it resolves a topic once against every node's
subscriptions (token patterns, cached per topic), and for every consumer group
(subscriptions of one name) that matches picks one member node, the one it has the least
unsettled work with (round robin on ties). A group with a member on the publishing node
itself is served there, locally, zero copy.

Sending (``_outbound``): batched per peer, Nagle style, kept until the receiver settles it
(DONE), within a window and each peer's credit; a gap costs a resend, not a loss. When the
directory drops a peer, whatever it had not settled goes to another member of the same
group, or into this bus's DLQ as ``node_lost`` (``_handover``). Receiving
(``_inbound``): one reader callback drains the data socket without waiting, one receipt per
frame, DONE once every subscription that took one of its messages settled it.

The state lives in the parts, one per file, and this module composes them: ``_control``
(:class:`BrokerSession`: handshake, heartbeats, clock offset, rejoin), ``_routing``
(:class:`Directory`: members, routes, round robin), ``_outbound`` (:class:`Outbound` and a
:class:`PeerLink` per peer: batch, credit, window, unsettled frames, resend), ``_inbound``
(:class:`Inbox`: links, receipts, dedup, DONE/NACK), ``_handover`` (:class:`Handover`:
what a lost peer held) and ``_addresses``; ``_reactor`` is the loop state they share. What
crosses parts goes through here: a listing from the broker re-links peers and hands over
what a lost one held, and the Inbox flushes the outbound batches before every DONE.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import secrets
import socket
from collections.abc import Iterable
from typing import Any

import msgspec
import zmq
import zmq.asyncio

from bus._envelope import Envelope
from bus._errors import TransportError
from bus._transport import BusPort, Transport
from bus.backends.zeromq._addresses import default_data_bind, local_address
from bus.backends.zeromq._control import BrokerSession
from bus.backends.zeromq._handover import Handover
from bus.backends.zeromq._inbound import Inbox
from bus.backends.zeromq._keys import CurveKeys
from bus.backends.zeromq._outbound import Outbound, PeerLink, wire_of
from bus.backends.zeromq._reactor import Reactor
from bus.backends.zeromq._routing import Directory
from bus.backends.zeromq._wire import (
    DEFAULT_MAX_FRAME,
    MAX_CREDIT,
    Bye,
    PeerInfo,
    node_name_problem,
)

__all__ = ["DEFAULT_CREDIT", "DEFAULT_WINDOW", "ZmqTransport"]

_log = logging.getLogger("bus.zeromq.node")

#: Message copies this node may have sent (or queued for a peer) and not yet seen settled.
DEFAULT_WINDOW = 8192
#: Messages another node may have in flight to this one at once (advertised in HELLO).
DEFAULT_CREDIT = 4096
#: Message ids remembered to drop duplicates (a resend after a gap or a re-link).
DEFAULT_DEDUP_WINDOW = 65_536
#: What ``stats()`` counts; every part adds to the one dict.
_COUNTERS = (
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
    "released",
)


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
        _check_options(
            curve, server_key, heartbeat, liveness, max_frame, batch_max, batch_delay, window,
            credit, dedup_window,
        )  # fmt: skip
        self.endpoint = connect
        self.node = node or f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        problem = node_name_problem(self.node)
        if problem is not None:
            raise ValueError(f"ZmqTransport: {problem}")
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
        self._ctx: zmq.asyncio.Context | None = None
        self._auth: Any = None
        self._port: BusPort | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._incarnation = int.from_bytes(os.urandom(4), "big")
        self._counts = dict.fromkeys(_COUNTERS, 0)
        self._reactor = reactor = Reactor()
        self._directory = Directory(self.node, self._counts)
        self._routes = self._directory.routes  # one dict for life: the hot path holds it
        self._session = BrokerSession(
            node=self.node,
            endpoint=connect,
            incarnation=self._incarnation,
            credit=credit,
            curve=curve,
            server_key=server_key,
            max_frame=max_frame,
            heartbeat=heartbeat,
            liveness=liveness,
            connect_timeout=connect_timeout,
            reactor=reactor,
            counts=self._counts,
            on_directory=self._on_directory,
            on_new_broker=self._on_new_broker,
            on_reset=self._on_reset,
        )
        self._out = Outbound(
            node=self.node,
            incarnation=self._incarnation,
            reactor=reactor,
            counts=self._counts,
            curve=curve,
            max_frame=max_frame,
            batch_max=batch_max,
            batch_delay=batch_delay,
            window=window,
            heartbeat=heartbeat,
            to_wire=self._wire_offset,
        )
        self._handover = Handover(
            node=self.node,
            out=self._out,
            directory=self._directory,
            session=self._session,
            reactor=reactor,
            counts=self._counts,
        )
        self._inbox = Inbox(
            node=self.node,
            reactor=reactor,
            counts=self._counts,
            max_frame=max_frame,
            dedup_window=dedup_window,
            flush_outbound=self._out.flush_all,
            to_wire=self._wire_offset,
        )

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, port: BusPort) -> None:
        if self._ctx is not None:
            raise TransportError(f"ZmqTransport {self.node!r} is already started")
        self._port = self._inbox.port = self._handover.port = port
        self._loop = loop = asyncio.get_running_loop()
        self._reactor.start(loop)
        self._ctx = self._out.ctx = zmq.asyncio.Context()
        try:
            self._bind_server()
        except BaseException:
            if self._auth is not None:
                self._auth.stop()  # its ZAP socket would keep term() waiting forever
                self._auth = None
            self._ctx.term()
            self._ctx = self._out.ctx = None
            raise
        assert self.data_endpoint is not None
        self._session.data_endpoint = self.data_endpoint
        try:
            await self._session.join(self._ctx)
        except BaseException:
            self._closed = True
            await self._teardown(linger=0)
            raise
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
        if key in self._directory.keys:
            return True
        _log.info("node %s refused a data link from key %s (not listed)", self.node, key.decode())
        return False

    async def aclose(self) -> None:
        """Leave: send what is batched, wait (up to ``heartbeat * liveness``) for it to be
        settled, say BYE, close. Anything still unsettled then is dead-lettered here with
        reason ``bus_closed``; the others redeliver what this node had not settled, including
        what its closing bus gave back (see ``FrameReceipt``)."""
        if self._closed:
            return
        self._closed = True
        if self._session.sock is None:
            return
        out = self._out
        out.flush_all()
        self._inbox.flush()
        if out.in_flight and self._session.connected:
            try:
                async with asyncio.timeout(self.heartbeat * self.liveness):
                    await out.idle()
            except TimeoutError:
                pass
        for peer in list(self._directory.peers.values()):
            self._handover.dead_letter_all(peer, "bus_closed")
        self._inbox.flush()
        if self._session.connected:
            self._session.send(msgspec.msgpack.encode(Bye()))
        await self._teardown()

    async def _teardown(self, linger: int | None = None) -> None:
        self._session.close(linger)
        self._inbox.close(linger)
        self._out.close(self.node)
        await self._reactor.stop()
        for peer in self._directory.peers.values():
            self._out.disconnect(peer)
        self._directory.peers.clear()
        if self._auth is not None:
            self._auth.stop()
            self._auth = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = self._out.ctx = None

    # -- the Transport contract ----------------------------------------------------------------

    def advertise(self, subscriptions: Iterable[tuple[str, str]]) -> None:
        self._session.advertise(sorted(subscriptions))
        self._reindex()
        if not self._closed:
            self._session.send_subs()

    async def sync(self) -> None:
        """Wait until the broker's directory has this node's latest subscriptions and every
        other node acknowledged it (their routing and ``has_remote`` reflect them)."""
        session = self._session
        while session.subs_acked < session.subs_version and not self._closed:
            await session.wait_subs()
        # The others sent what they routed by the old directory before acknowledging, but
        # on other sockets than the broker's: take in what has reached ours already.
        while not self._closed and self._inbox.waiting():  # noqa: ASYNC110 - a socket state
            await asyncio.sleep(0.001)

    def has_remote(self, topic: str) -> bool:
        route = self._routes.get(topic)
        if route is None:
            route = self._directory.route(topic)
        return bool(route.groups)

    def try_send(self, envelope: Envelope) -> bool:
        if self._closed:
            raise TransportError(f"transport {self.node!r} is closed")
        out = self._out
        if out.in_flight >= self.window:
            return False
        env = envelope
        route = self._routes.get(env.topic)
        if route is None:
            route = self._directory.route(env.topic)
        reply = env.reply
        request = reply is not None and isinstance(reply, asyncio.Future)
        wire: tuple[Any, ...] | msgspec.Raw  # the envelope's fields, or (to many) their encoding
        wire = wire_of(env, self._session.to_wire)
        single = route.single
        if single is not None:
            out.encode(single, wire, route.single_names, request)
        else:
            targets = self._directory.pick(route)
            if not targets:
                return True
            if len(targets) > 1:
                wire = msgspec.Raw(out.encode_env(wire))
            for peer, names in targets:
                out.encode(peer, wire, names, request)
        if request:
            fut: asyncio.Future[Any] = envelope.reply
            requests = out.requests
            requests[env.id] = (fut, env.topic)

            def forget(_f: asyncio.Future[Any], i: int = env.id) -> None:
                requests.pop(i, None)

            fut.add_done_callback(forget)
        return True

    async def send(self, envelope: Envelope) -> None:
        while not self.try_send(envelope):
            await self._out.wait_credit()

    async def flush(self) -> None:
        """Wait until every message sent so far is settled by its receivers."""
        if self._session.sock is None or self._closed:
            return
        self._out.flush_all()
        await self._out.idle()

    def stats(self) -> dict[str, Any]:
        """Counters since start, the links' state, and the clock offset to the broker
        (``clock_offset_ns``: broker wall clock minus ours; ``clock_shared``: this node reads
        the broker's monotonic clock, so the offset is known exactly, else it is estimated
        from the lowest-delay of the last heartbeats, NTP style, to within half of
        ``rtt_ns``, that heartbeat's round trip)."""
        peers = self._directory.peers.values()
        out = self._out
        return {
            "node": self.node,
            "endpoint": self.endpoint,
            "data_endpoint": self.data_endpoint,
            "connected": self._session.connected,
            "in_flight": out.in_flight,
            "window": self.window,
            "peers": {
                p.name: {
                    "data": p.data,
                    "sent": p.sent,
                    "backlog": p.load() - p.sent,
                    "unsettled_frames": len(p.unsettled),
                }
                for p in peers
            },
            "unsettled_frames": sum(len(p.unsettled) for p in peers),
            "parked_frames": len(self._inbox.parked),
            "links_in": len(self._inbox.links),
            "pending_requests": len(out.requests),
            "clock_offset_ns": self._session.offset,
            "clock_shared": self._session.shared_clock,
            "rtt_ns": self._session.rtt,
            "sent": out.sent,
            "settled_by": dict(out.settled_by),
            **self._counts,
        }

    # -- what crosses the parts ------------------------------------------------------------------

    def _wire_offset(self) -> int:
        return self._session.to_wire

    def _reindex(self) -> None:
        self._directory.reindex(self._session.subs)
        if self.on_change is not None:
            self.on_change()

    def _on_directory(self, peers: list[PeerInfo]) -> None:
        self._set_directory(self._directory.checked(peers))
        # What this turn batched was routed by the old directory: out before the ack,
        # which tells a node that is leaving a group that we route around it now.
        self._out.flush_all()

    def _on_new_broker(self, settle: float) -> None:
        # Keep unlisted peers while the new broker run hears from every live node (see
        # Directory.apply).
        assert self._loop is not None
        self._directory.settling_until = self._loop.time() + settle

    def _on_reset(self) -> None:
        # Back after this broker reset us: the others dropped our links.
        for peer in self._directory.peers.values():
            self._out.relink(peer)

    def _set_directory(self, infos: list[PeerInfo]) -> None:
        """Link to the peers ``infos`` lists, and lose those it no longer does (see
        ``Directory.apply`` for the while after a broker restart)."""
        assert self._loop is not None
        directory = self._directory
        infos, lost = directory.apply(infos, self._loop.time())
        for info in infos:
            if info.name not in directory.peers and self._ctx is not None:
                peer = PeerLink(info)
                try:
                    self._out.connect(peer)
                except zmq.ZMQError as exc:
                    # What Directory.checked cannot foresee (libzmq's own limits): that entry.
                    self._counts["directory_dropped"] += 1
                    _log.warning(
                        "node %s cannot link to %s at %s: %s", self.node, info.name, info.data, exc
                    )
                    continue
                directory.peers[info.name] = peer
        self._inbox.forget_unlisted({f"{i.name}/{i.incarnation:x}".encode() for i in infos})
        self._reindex()
        for peer in lost:
            self._handover.peer_lost(peer)

    async def _beat(self) -> None:
        assert self._loop is not None
        loop = self._loop
        directory = self._directory
        while True:
            await asyncio.sleep(self.heartbeat)
            if directory.settling_until and loop.time() >= directory.settling_until:
                directory.settling_until = 0.0
                self._set_directory(directory.listed)
            self._session.beat()
            self._out.ping(list(directory.peers.values()))


def _check_options(
    curve: CurveKeys | None,
    server_key: bytes | None,
    heartbeat: float,
    liveness: int,
    max_frame: int,
    batch_max: int,
    batch_delay: float,
    window: int,
    credit: int,
    dedup_window: int,
) -> None:
    """A bad option is refused when the transport is made, naming it, not found later."""
    if (curve is None) != (server_key is None):
        raise ValueError("ZmqTransport: CURVE needs both curve (node keys) and server_key")
    if not (math.isfinite(heartbeat) and heartbeat > 0) or liveness < 1:  # nan too
        raise ValueError(
            f"ZmqTransport: heartbeat must be > 0 and liveness >= 1, got {heartbeat}, {liveness}"
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
    if credit > MAX_CREDIT:
        raise ValueError(f"ZmqTransport: credit must be <= {MAX_CREDIT}, got {credit}")


class _KeyGate:
    """ZAP credentials provider for a node's data socket (see ``ZmqTransport._admit``)."""

    def __init__(self, transport: ZmqTransport) -> None:
        self.transport = transport

    def callback(self, domain: str, key: bytes) -> bool:
        return self.transport._admit(key)
