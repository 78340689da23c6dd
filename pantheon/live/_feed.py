"""The live feed: a running bus publishes :class:`Snapshot` values to whoever watches.

Cost to the run, and why it is arranged this way:

* Counters, latency histograms, queue depths and breaker states are the bus's own; the feed
  reads them with one ``bus.stats()`` per tick (about a millisecond for the support team,
  four times a second), never per message.
* Dead letters and breaker transitions are rare; the feed keeps the last few of each from
  the bus's listeners.
* Recent traces need per-message data the counters do not have (which delivery of which
  request started and ended when), so the feed's delivery listener is a bounded ring's own
  ``append``, keeping the bus's :class:`~bus.Delivery` as it is (a C call, no Python frame).
  That append is the only per-message work; a feed made with ``trace_ring=0`` does none and
  shows no traces.
* Model usage (calls, tokens, cost per agent) is what the agents count anyway: the feed
  asks the run's ``usage`` callable once per snapshot and adds nothing to a model call, or
  to a run that makes none.
* Snapshots are only assembled when someone watches (an in-process subscriber or a socket
  client), and encoded once per tick for all clients.

Watchers never slow the run. Each one has a one-snapshot slot: a watcher that is still busy
with the last snapshot when the next one is ready finds only the newest in its slot (the
ones in between are dropped for it, and ``Snapshot.seq`` shows the gap). A socket client
that stops reading holds at most one frame in its transport buffer plus the newest in its
slot; its writer waits, the bus does not.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import stat
import time
from collections import defaultdict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Literal

from agents import BudgetState
from bus import BreakerEvent, Bus, DeadLetter, Delivery, ObserverHandle
from pantheon import readmodel
from pantheon.live._errors import FeedClosed, LiveError, ProtocolError
from pantheon.live._parts import PartsBoard, merge_parts, summed
from pantheon.live._snapshot import (
    BreakerState,
    Hello,
    HopBar,
    HopLatency,
    NodePart,
    OutcomeTally,
    Redrive,
    RedriveResult,
    Series,
    Snapshot,
    Totals,
    Trace,
)
from pantheon.live._wire import decode_client, encode, read_frame
from pantheon.readmodel import DRIVER, DeadLetterView, SessionUsage

__all__ = [
    "DEFAULT_HISTORY",
    "DEFAULT_INTERVAL",
    "DEFAULT_MAX_CLIENTS",
    "DEFAULT_MAX_DEAD_LETTERS",
    "DEFAULT_MAX_TRACES",
    "DEFAULT_TRACE_RING",
    "LiveFeed",
    "SnapshotStream",
    "label_of",
]

log = logging.getLogger("pantheon.live")

#: Seconds between snapshots (four a second).
DEFAULT_INTERVAL = 0.25
#: Throughput buckets kept per topic and agent (one per tick: a minute at the default).
DEFAULT_HISTORY = 240
#: Most recent dead letters a snapshot lists; older ones stay in the bus's DLQ and store.
DEFAULT_MAX_DEAD_LETTERS = 200
#: Most recent requests a snapshot carries with their waterfalls.
DEFAULT_MAX_TRACES = 50
#: Deliveries kept for traces. Requests whose input delivery fell out of the ring are not
#: shown; at 4,096 and the support team's ~8 deliveries per request, the last ~500.
DEFAULT_TRACE_RING = 4096
#: Socket clients served at once; further connections are closed at once.
DEFAULT_MAX_CLIENTS = 32
#: Breaker transitions a snapshot lists.
_MAX_BREAKER_EVENTS = 100
#: How long closing waits for clients to take the final snapshot.
_CLOSE_GRACE = 1.0


def label_of(payload: Any) -> str:
    """A short name for a request from its input's payload (an email's id and subject)."""
    if not isinstance(payload, Mapping):
        return ""
    ident = payload.get("id") or payload.get("email_id")
    text = payload.get("subject") or payload.get("message") or payload.get("error")
    return ": ".join(str(x) for x in (ident, text) if x)[:120]


class SnapshotStream:
    """One watcher's view of a feed: always the newest snapshot, never a backlog.

    ``async for snap in stream`` yields snapshots until the feed closes (the last one has
    the session's final status). A watcher slower than the feed skips snapshots."""

    __slots__ = ("_closed", "_feed", "_latest", "_ready")

    def __init__(self, feed: LiveFeed | None = None) -> None:
        self._feed = feed
        self._latest: Any = None
        self._ready = asyncio.Event()
        self._closed = False

    def put(self, item: Any) -> None:
        self._latest = item
        self._ready.set()

    def close(self) -> None:
        self._closed = True
        self._ready.set()

    async def get(self) -> Any:
        """The newest item not yet taken; raises :class:`FeedClosed` once closed and empty."""
        while self._latest is None:
            if self._closed:
                raise FeedClosed("the feed has closed")
            self._ready.clear()
            await self._ready.wait()
        item, self._latest = self._latest, None
        return item

    def __aiter__(self) -> AsyncIterator[Any]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Any]:
        try:
            while True:
                try:
                    yield await self.get()
                except FeedClosed:
                    return
        finally:
            if self._feed is not None:
                self._feed.unsubscribe(self)


class _Client:
    """One socket client: replies go out in order, snapshots through a one-frame slot."""

    __slots__ = ("replies", "slot", "task", "writer")

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.slot = SnapshotStream()
        self.replies: deque[bytes] = deque()
        self.task: asyncio.Task[None] | None = None

    def reply(self, frame: bytes) -> None:
        self.replies.append(frame)
        self.slot._ready.set()

    async def send(self) -> None:
        writer = self.writer
        slot = self.slot
        with contextlib.suppress(ConnectionError, FeedClosed):
            while True:
                if not self.replies and slot._latest is None:
                    if slot._closed:
                        return
                    slot._ready.clear()
                    await slot._ready.wait()
                while self.replies:
                    writer.write(self.replies.popleft())
                if slot._latest is not None:
                    writer.write(await slot.get())
                await writer.drain()


class LiveFeed:
    """Publishes snapshots of a running ``bus`` every ``interval`` seconds to in-process
    subscribers (:meth:`subscribe`) and, when ``path`` is given, to clients of a Unix
    socket there (mode 0600: a client may redrive dead letters).

    Start it inside the bus's event loop (``await feed.start()`` or ``async with``), once
    the bus exists; :meth:`aclose` publishes a last snapshot with the session's final
    status, closes every client and removes the socket file. Limits: ``history`` buckets of
    throughput, the last ``max_dead_letters`` dead letters and ``max_traces`` traces, a ring
    of ``trace_ring`` deliveries (0: no traces, no per-message work), ``max_clients``.
    ``usage`` says what the run's model calls have used so far (per agent; the runtime
    reads its team's); without it, snapshots show no model usage. ``budget`` says what each
    budget scope has spent and refused (the team's ledgers). ``outcomes`` likewise says
    what the team has decided so far. ``nodes`` places a multi-process run's agents (agent
    name -> node, as :func:`pantheon.readmodel.placement` reads them off the scenario): the
    node of each hop and dead letter is its subscriber's (``driver`` for an agent no node
    runs); without it, they have none, as in a single-process run.

    In a multi-process run (:mod:`pantheon.live._parts`): ``own_topics`` says what this
    bus published itself per topic (its stats also count what crossed to it), ``here``
    names the process the feed runs in (``driver`` unless said), and the driver's feed adds
    the newest part of every node on ``board`` to its snapshots; :meth:`part` is a node
    feed's contribution. A feed made with ``ticking=False`` samples its bus only when asked
    (a node's, whose part is asked for while someone watches the driver's).
    """

    def __init__(
        self,
        bus: Bus,
        *,
        session_id: str | None = None,
        scenario: str | None = None,
        path: str | os.PathLike[str] | None = None,
        interval: float = DEFAULT_INTERVAL,
        history: int = DEFAULT_HISTORY,
        max_dead_letters: int = DEFAULT_MAX_DEAD_LETTERS,
        max_traces: int = DEFAULT_MAX_TRACES,
        trace_ring: int = DEFAULT_TRACE_RING,
        max_clients: int = DEFAULT_MAX_CLIENTS,
        usage: Callable[[], SessionUsage] | None = None,
        budget: Callable[[], tuple[BudgetState, ...]] | None = None,
        outcomes: Callable[[], OutcomeTally] | None = None,
        nodes: Mapping[str, str] | None = None,
        here: str | None = None,
        own_topics: Callable[[], Mapping[str, int]] | None = None,
        board: PartsBoard | None = None,
        ticking: bool = True,
    ) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be a positive number of seconds, got {interval!r}")
        for name, value in (
            ("history", history),
            ("max_dead_letters", max_dead_letters),
            ("max_traces", max_traces),
            ("trace_ring", trace_ring),
            ("max_clients", max_clients),
        ):
            if value < 0:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        self.bus = bus
        self.session_id = session_id or bus.session_id or "unrecorded"
        self.scenario = scenario
        self.path = None if path is None else Path(path)
        self.interval = interval
        self.max_traces = max_traces
        self.max_clients = max_clients
        self.status = "running"
        self.usage = usage
        self.budget = budget
        self.outcomes = outcomes
        self.nodes = dict(nodes or {})
        hosts: dict[str, list[str]] = {}
        for agent, node in self.nodes.items():
            hosts.setdefault(node, []).append(agent)
        #: The processes, a line each, as snapshots carry them (the driver's agents are
        #: the ones no node runs, which the placement does not list).
        self._node_lines = tuple(
            f"node {node}: {', '.join(agents)}" for node, agents in hosts.items()
        )
        self._here = here or (DRIVER if self.nodes else None)
        self.own_topics = own_topics
        self.board = board
        self.ticking = ticking
        #: Called with each entry id a client redrove successfully (the runtime marks it in
        #: the session store).
        self.on_redrive: list[Callable[[int], Awaitable[None]]] = []
        self._seq = 0
        self._origin_ns: int | None = None
        self._origin_wall = 0.0
        self._started_ns = time.monotonic_ns()
        self._samples: deque[tuple[int, dict[str, int], dict[str, int]]] = deque(maxlen=history + 1)
        self._dead: deque[DeadLetter] = deque(maxlen=max_dead_letters)
        self._dead_seen = 0
        self._redriven: set[int] = set()
        self._breaker_events: deque[tuple[int, BreakerEvent]] = deque(maxlen=_MAX_BREAKER_EVENTS)
        self._breaker_reason: dict[str, str] = {}
        self._ring: deque[Delivery] = deque(maxlen=trace_ring)
        self._trace_ring = trace_ring
        self._streams: set[SnapshotStream] = set()
        self._clients: set[_Client] = set()
        self._server: asyncio.base_events.Server | None = None
        self._ticker: asyncio.Task[None] | None = None
        self._handle: ObserverHandle | None = None
        self._hello = encode(Hello(self.session_id, scenario))
        self._stats = bus.stats()
        self._handlers: set[asyncio.Task[Any]] = set()
        self._last: Snapshot | None = None
        self._last_frame: bytes | None = None
        self._closed = False

    def __repr__(self) -> str:
        where = f", path={str(self.path)!r}" if self.path else ""
        return f"LiveFeed({self.session_id!r}{where}, {self.status})"

    async def __aenter__(self) -> LiveFeed:
        await self.start()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self.aclose("failed" if exc_type is not None else "completed")

    @property
    def clients(self) -> int:
        """Socket clients connected now."""
        return len(self._clients)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Hook the bus's listeners, open the socket (if any) and start ticking."""
        if self._ticker is not None or self._closed:
            raise RuntimeError(f"{self!r} was already started")
        tap = SimpleNamespace(on_dead_letter=self._on_dead_letter, on_breaker=self._on_breaker)
        if self._trace_ring:
            # The ring's own ``append``: a C call per delivery keeping the bus's Delivery
            # (a gc=False Struct) as it is. A Python listener building a tuple cost a frame
            # and a cycle-tracked object per message (~8 ms and more GC per 26,000
            # deliveries of a 3,000-email run).
            tap.on_delivery = self._ring.append
        self._handle = self.bus.observe(tap)
        if self.path is not None:
            await self._listen(self.path)
        self._sample()
        if self.ticking:
            self._ticker = asyncio.get_running_loop().create_task(
                self._tick(), name=f"pantheon-live:{self.session_id}"
            )

    async def _listen(self, path: Path) -> None:
        if _existing_socket(path):
            if await _answers(path):
                raise LiveError(f"another live feed already listens on {path}")
            path.unlink(missing_ok=True)  # noqa: ASYNC240 - left by a run that died
        old_umask = os.umask(0o177)  # the socket is created 0600: only its owner connects
        try:
            self._server = await asyncio.start_unix_server(self._serve, path=str(path))
        finally:
            os.umask(old_umask)

    async def aclose(self, status: str = "completed") -> None:
        """Publish the final snapshot (``status``: the session's outcome), then stop."""
        if self._closed:
            return
        self._closed = True
        self.status = status
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        if self._handle is not None:
            self._handle.close()
        self._sample()
        self._publish(force=True)
        for stream in list(self._streams):
            stream.close()
        clients = list(self._clients)
        for client in clients:
            client.slot.close()
        tasks = [c.task for c in clients if c.task is not None]
        if tasks:
            # Give each client the final snapshot; one that does not read gets cut off.
            _, pending = await asyncio.wait(tasks, timeout=_CLOSE_GRACE)
            for task in pending:
                task.cancel()
        for client in clients:
            client.writer.close()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=_CLOSE_GRACE)
        if self._server is not None:
            # The path goes first: a watcher that finds it while the session is still
            # "running" in the store must find someone listening, not a refusing socket.
            if self.path is not None:
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()
            self._server.close()
            await self._server.wait_closed()

    # -- watching ------------------------------------------------------------------------------

    def subscribe(self) -> SnapshotStream:
        """A stream of this feed's snapshots (the latest one at once, if any)."""
        stream = SnapshotStream(self)
        if self._closed:
            if self._last is not None:
                stream.put(self._last)
            stream.close()
            return stream
        self._streams.add(stream)
        self._watchers_changed()
        stream.put(self.snapshot())
        return stream

    def unsubscribe(self, stream: SnapshotStream) -> None:
        self._streams.discard(stream)
        self._watchers_changed()

    async def serve_messages(
        self,
        recv: Callable[[], Awaitable[bytes | None]],
        send: Callable[[bytes], Awaitable[None]],
    ) -> int:
        """Serve one client over a message-framed link (the gateway's ``/v1/live``
        WebSocket): the socket's frames without their length prefix, the hello first, then
        the newest snapshot whenever there is one, and an answer to each redrive.
        ``recv()`` returns ``None`` when the client has gone. Returns once it has, or once
        the feed has sent its last snapshot; the count is of frames that were not client
        frames (ignored)."""
        stream = self.subscribe()
        malformed = 0

        async def snapshots() -> None:
            await send(self._hello[4:])
            async for snap in stream:
                await send(encode(snap)[4:])

        sender = asyncio.get_running_loop().create_task(snapshots())
        receiver = asyncio.ensure_future(recv())
        try:
            while True:
                await asyncio.wait((sender, receiver), return_when=asyncio.FIRST_COMPLETED)
                if sender.done():
                    return malformed  # the feed ended (or the link broke while sending)
                body = receiver.result()
                if body is None:
                    return malformed
                try:
                    frame = decode_client(body)
                except ProtocolError:
                    malformed += 1
                else:
                    if isinstance(frame, Redrive):
                        result = await self.redrive(frame.entry_id, request=frame.request)
                        await send(encode(result)[4:])
                receiver = asyncio.ensure_future(recv())
        finally:
            self.unsubscribe(stream)
            stream.close()
            for task in (sender, receiver):
                task.cancel()
            await asyncio.gather(sender, receiver, return_exceptions=True)

    async def redrive(self, entry_id: int, *, request: int = 0) -> RedriveResult:
        """Re-publish dead letter ``entry_id`` to its subscription, in this process; in the
        driver of a multi-process run, ``entry_id`` is the store's (as its snapshots show
        them) and a node's letter is redriven by that node."""
        board = self.board
        if board is None:
            return await self._redrive_here(entry_id, entry_id, request)
        node, own = board.node_of(entry_id)
        if node is None:
            return await self._redrive_here(own, entry_id, request)
        if board.redrive is None or not node:
            why = "no such node in this run" if not node else "its node cannot be asked"
            return RedriveResult(request, entry_id, False, f"dead letter {entry_id}: {why}")
        ok, message = await board.redrive(node, own)
        if ok:
            await self._redriven_hooks(entry_id)
        return RedriveResult(request, entry_id, ok, f"node {node}: {message}")

    async def _redriven_hooks(self, entry_id: int) -> None:
        for hook in self.on_redrive:
            try:
                await hook(entry_id)
            except Exception:
                log.exception("live feed %s: on_redrive hook failed", self.session_id)

    async def _redrive_here(self, entry_id: int, shown: int, request: int) -> RedriveResult:
        """Redrive this bus's own letter ``entry_id`` (``shown``: its id in snapshots and
        in the session store, which the hooks are given)."""
        try:
            taken = await self.bus.dlq.redrive([entry_id])
        except KeyError:
            return RedriveResult(
                request,
                shown,
                False,
                f"no dead letter {shown} in the running bus (already redriven, or evicted)",
            )
        except Exception as exc:  # a full mailbox refuses; the entry stays listed
            return RedriveResult(request, shown, False, f"{type(exc).__name__}: {exc}")
        if not taken:
            return RedriveResult(
                request, shown, False, "its subscription is gone or the bus is closing"
            )
        self._redriven.add(entry_id)
        await self._redriven_hooks(shown)
        return RedriveResult(request, shown, True, "re-published to its subscription")

    # -- listeners (bus thread) ----------------------------------------------------------------

    def _on_dead_letter(self, entry: DeadLetter) -> None:
        self._dead.append(entry)
        self._dead_seen += 1

    def _on_breaker(self, ev: BreakerEvent) -> None:
        self._breaker_events.append((time.monotonic_ns(), ev))
        self._breaker_reason[ev.breaker] = ev.reason

    # -- ticking -------------------------------------------------------------------------------

    async def _tick(self) -> None:
        loop = asyncio.get_running_loop()
        next_at = loop.time() + self.interval
        while True:
            await asyncio.sleep(max(0.0, next_at - loop.time()))
            next_at += self.interval
            if next_at < loop.time():  # fell behind (a busy loop): skip, do not burst
                next_at = loop.time() + self.interval
            try:
                self._sample()
                self._publish()
            except Exception:
                # A snapshot bug must not take the run down with it; say so and go on.
                log.exception("live feed %s: snapshot failed", self.session_id)

    def _watchers_changed(self) -> None:
        """Tell the board whether anyone watches: a node sends its part only then."""
        if self.board is not None:
            self.board.watch(bool(self._streams or self._clients))

    def _spread_jumps(self) -> None:
        """Counters a node brought after a silence count as if they had been there all along
        (flat), not as one tick's rate: it sent nothing while nobody watched."""
        jumps = self.board.jumps if self.board is not None else ({}, {})
        if not any(jumps):
            return
        for _, topics, agents in self._samples:
            for counts, jump in zip((topics, agents), jumps, strict=True):
                for key, n in jump.items():
                    counts[key] = counts.get(key, 0) + n
        for jump in jumps:
            jump.clear()

    def _sample(self) -> None:
        stats = self.bus.stats()
        if self.own_topics is not None:
            topics = dict(self.own_topics())
        else:
            topics = {t: s.published for t, s in stats.topics.items()}
        agents = {n: s.delivered + s.dead_lettered for n, s in stats.subscribers.items()}
        if self.board is not None:
            parts = self.board.parts()
            topics = summed(topics, parts, lambda p: p.topics)
            agents = summed(agents, parts, lambda p: p.agents)
            self._spread_jumps()
        self._samples.append((time.monotonic_ns(), topics, agents))
        self._stats = stats

    def _publish(self, *, force: bool = False) -> None:
        if not (self._streams or self._clients or force):
            return
        snap = self.snapshot(sampled=True)
        self._last = snap
        for stream in self._streams:
            stream.put(snap)
        if self._clients:
            frame = self._last_frame = encode(snap)
            for client in self._clients:
                client.slot.put(frame)
        else:
            self._last_frame = None

    # -- snapshots -----------------------------------------------------------------------------

    def _origin(self) -> int:
        if self._origin_ns is None:
            if not self._ring and self._samples and not self._samples[-1][1]:
                return self._started_ns  # nothing published yet: not fixed until something is
            created = [d.envelope.created for d in self._ring if d.envelope.created]
            self._origin_ns = min(created) if created else self._started_ns
            self._origin_wall = time.time() - (time.monotonic_ns() - self._origin_ns) / 1e9
        return self._origin_ns

    def snapshot(self, *, sampled: bool = False) -> Snapshot:
        """The session now. ``sampled``: reuse the counters of the last tick."""
        if not sampled:
            self._sample()
        origin = self._origin()
        now = self._samples[-1][0]
        self._seq += 1
        snap = Snapshot(
            session_id=self.session_id,
            scenario=self.scenario,
            status=self.status,
            live=self.status == "running",
            seq=self._seq,
            t_s=(now - origin) / 1e9,
            series=self._series(origin),
            budget=() if self.budget is None else self.budget(),
            **self._pieces(origin),
            nodes=self._node_lines,
        )
        if self.board is None:
            return snap
        return merge_parts(
            snap,
            self.board.parts(),
            origin_wall=self._origin_wall,
            board=self.board,
            max_traces=self.max_traces,
            max_dead_letters=self._dead.maxlen or 0,
        )

    def _totals(self) -> Totals:
        stats = self._stats
        subs = stats.subscribers.values()
        return Totals(
            published=stats.published
            if self.own_topics is None
            else sum(self.own_topics().values()),
            delivered=sum(s.delivered for s in subs),
            dead_lettered=sum(s.dead_lettered for s in subs),
            shed=sum(s.shed for s in subs),
            rejected=sum(s.rejected for s in subs),
            failures=sum(s.failures for s in subs),
            retries=sum(s.retries for s in subs),
            queued=sum(s.queued for s in subs),
            in_flight=sum(s.in_flight for s in subs),
            dlq_size=self._dead_seen,
        )

    def _breaker_timeline(self, origin: int) -> tuple[readmodel.BreakerEvent, ...]:
        # A breaker of this bus, in the process this feed runs in.
        return tuple(
            readmodel.BreakerEvent.of(ev, t_s=(t - origin) / 1e9, node=self._here)
            for t, ev in self._breaker_events
        )

    def part(self) -> NodePart:
        """This feed's bus as its node's part of the driver's feed (a node's feed: made with
        ``here``, the node's name, and ``own_topics``). Sampled afresh; no series (the
        driver samples the sums)."""
        self._sample()
        _, topics, agents = self._samples[-1]
        origin = self._origin()
        return NodePart(
            node=self._here or "",
            origin_wall=self._origin_wall,
            topics=topics,
            agents=agents,
            **self._pieces(origin),
        )

    def _pieces(self, origin: int) -> dict[str, Any]:
        """What a snapshot and a node's part both carry, read from the last sample."""
        return {
            "totals": self._totals(),
            "hops": self._hops(),
            "breakers": self._breakers(),
            "breaker_events": self._breaker_timeline(origin),
            "dead_letters": self._dead_letters(),
            "traces": self._traces(origin),
            "usage": SessionUsage() if self.usage is None else self.usage(),
            "outcomes": OutcomeTally() if self.outcomes is None else self.outcomes(),
        }

    def _node(self, subscriber: str) -> str | None:
        """The process a subscription's agent runs on (None in a single-process run)."""
        if not self.nodes:
            return None
        return self.nodes.get(subscriber.partition(":")[0], DRIVER)

    def _series(self, origin: int) -> tuple[Series, ...]:
        samples = list(self._samples)
        if len(samples) < 2:
            return ()
        start_s = (samples[0][0] - origin) / 1e9
        bucket_s = (samples[-1][0] - samples[0][0]) / 1e9 / (len(samples) - 1) or self.interval
        out = []
        # Each kind with the index of its counts in a sample.
        kinds: tuple[tuple[Literal["topic", "agent"], Literal[1, 2]], ...] = (
            ("topic", 1),
            ("agent", 2),
        )
        for kind, index in kinds:
            for key in sorted(samples[-1][index]):
                values = [s[index].get(key, 0) for s in samples]
                counts = tuple(max(0, b - a) for a, b in itertools.pairwise(values))
                out.append(Series(kind, key, bucket_s, start_s, counts, values[-1]))
        return tuple(out)

    def _hops(self) -> tuple[HopLatency, ...]:
        stats = self._stats
        out = []
        for name in sorted(stats.subscribers):
            s = stats.subscribers[name]
            w, h = s.queue_wait, s.handling
            out.append(
                HopLatency(
                    "agent", name, h.count,
                    w.p50_us / 1000, w.p95_us / 1000, w.p99_us / 1000,
                    h.p50_us / 1000, h.p95_us / 1000, h.p99_us / 1000,
                )
            )  # fmt: skip
        for e in sorted(stats.edges, key=lambda e: (e.source, e.target)):
            w = e.queue_wait
            out.append(
                HopLatency(
                    "edge", f"{e.source} -> {e.target}", w.count,
                    w.p50_us / 1000, w.p95_us / 1000, w.p99_us / 1000, None, None, None,
                )
            )  # fmt: skip
        return tuple(out)

    def _breakers(self) -> tuple[BreakerState, ...]:
        out = []
        for name, state in sorted(self._stats.breakers.items()):
            breaker = self.bus.breaker(name)
            out.append(
                BreakerState(
                    name,
                    state,
                    breaker.trips,
                    breaker.retry_after() if state == "open" else None,
                    self._breaker_reason.get(name),
                    self._here,
                )
            )
        return tuple(out)

    def _dead_letters(self) -> tuple[DeadLetterView, ...]:
        wall = self._origin_wall
        return tuple(
            DeadLetterView.of(
                e,
                t_s=e.time - wall if wall else 0.0,
                redriven=e.entry_id in self._redriven,
                payload=e.envelope.payload,
                correlation_id=e.envelope.correlation_id,
                node=self._node(e.subscriber),
            )
            for e in self._dead
        )

    def _traces(self, origin: int) -> tuple[Trace, ...]:
        if not self.max_traces or not self._ring:
            return ()
        by_request: dict[int, list[Delivery]] = defaultdict(list)
        last_end: dict[int, int] = {}
        for d in self._ring:
            env = d.envelope
            cid = env.correlation_id or env.id
            by_request[cid].append(d)
            last_end[cid] = max(last_end.get(cid, 0), d.ended)
        errors = {
            (e.envelope.id, e.subscriber): f"{e.error_type}: {e.error}" if e.error_type else None
            for e in self._dead
        }
        dead = {e.envelope.id for e in self._dead}
        # The requests active most recently; an old one may have its first hops out of the
        # ring already, and shows the hops the ring still has.
        latest = sorted(last_end, key=last_end.__getitem__)[-self.max_traces :]
        out = []
        for cid in latest:
            items = by_request[cid]
            root = min((d.envelope for d in items), key=lambda env: (env.id != cid, env.hops))
            items.sort(key=lambda d: (d.started, d.envelope.hops, d.subscriber))
            hops = tuple(
                HopBar(
                    envelope_id=d.envelope.id,
                    causation_id=d.envelope.causation_id,
                    topic=d.envelope.topic,
                    agent=d.subscriber,
                    depth=d.envelope.hops,
                    enqueued_ms=(d.envelope.created - origin) / 1e6,
                    start_ms=(d.started - origin) / 1e6,
                    end_ms=(d.ended - origin) / 1e6,
                    queue_wait_ms=(d.started - d.envelope.created) / 1e6,
                    handling_ms=(d.ended - d.started) / 1e6,
                    outcome=d.outcome,
                    error=errors.get((d.envelope.id, d.subscriber)),
                    node=self._node(d.subscriber),
                )
                for d in items
            )
            end = max(h.end_ms for h in hops)
            if any(h.envelope_id in dead for h in hops):
                outcome = "dead_letter"
            elif any(h.outcome != "delivered" for h in hops):
                outcome = "failed"
            else:
                outcome = "ok"
            start_ms = (root.created - origin) / 1e6
            out.append(
                Trace(
                    correlation_id=cid,
                    topic=root.topic,
                    label=label_of(root.payload),
                    start_ms=start_ms,
                    total_ms=end - start_ms,
                    hop_count=len(hops),
                    outcome=outcome,
                    hops=hops,
                )
            )
        return tuple(out)

    # -- the socket ----------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self._closed or len(self._clients) >= self.max_clients:
            writer.close()
            return
        handler = asyncio.current_task()
        if handler is not None:
            self._handlers.add(handler)
            handler.add_done_callback(self._handlers.discard)
        client = _Client(writer)
        client.reply(self._hello)
        last = self._last if self._last is not None else self.snapshot()
        client.slot.put(self._last_frame or encode(last))
        self._clients.add(client)
        self._watchers_changed()
        client.task = asyncio.get_running_loop().create_task(client.send())
        try:
            while True:
                frame = decode_client(await read_frame(reader))
                if isinstance(frame, Redrive):
                    result = await self.redrive(frame.entry_id, request=frame.request)
                    client.reply(encode(result))
        except (FeedClosed, ConnectionError):
            pass  # the client went away
        except ProtocolError as exc:
            log.warning("live feed %s: dropping a client: %s", self.session_id, exc)
        finally:
            # Also when the feed is closing: aclose() may have listed its clients before
            # this one left, or after; either way its socket is closed here.
            self._clients.discard(client)
            self._watchers_changed()
            client.slot.close()
            client.task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await client.task
            writer.close()


def _existing_socket(path: Path) -> bool:
    """Make the socket's directory; whether a socket file is already there (refusing to
    replace anything that is not a socket)."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return False
    if not stat.S_ISSOCK(mode):
        raise LiveError(f"{path} exists and is not a socket; refusing to replace it")
    return True


async def _answers(path: Path) -> bool:
    """Whether something accepts connections on the Unix socket ``path``."""
    try:
        _, writer = await asyncio.open_unix_connection(str(path))
    except OSError:
        return False
    writer.close()
    with contextlib.suppress(ConnectionError):
        await writer.wait_closed()
    return True
