"""NatsTransport: the bus over NATS JetStream, durable and clustered.

Mapping (see ``_subjects.py``): team ``T`` has one stream ``PANTHEON_T`` capturing
``pantheon.T.>`` (file storage by default, a ``dedup_window`` for ``Nats-Msg-Id``). A message
on topic ``a.b`` with priority HIGH, from a bus of session ``S``, is published on
``pantheon.T.high.S.a.b`` with ``Nats-Msg-Id`` = the envelope id, so a publish repeated after
a lost ack is stored once; a message a handler emitted is named by what caused it instead
(see :meth:`_msg_id`), so a member that handles a message again after another died mid-way
publishes nothing twice. Each subscription name is a consumer group of the session: one
durable pull consumer per priority lane (``critical``, ``high``, ``normal``), shared by every
process of the session hosting that name, with ``max_ack_pending`` = ``credit``. The
directory of nodes (who hosts which ``(name, pattern)``) is a JetStream key-value bucket,
``pantheon_nodes_T``, keyed by session and node; dead letters of every team go to the
``PANTHEON_DLQ`` stream (subjects ``pantheon.dlq.T.<publishing node>``).

*One session never handles another's messages.* The stream outlives runs: a run whose
processes died (its driver SIGKILLed) leaves its unacknowledged messages in its consumers,
and an earlier version that named consumers by team alone handed them to the team's next
run, which handled them as its own. Subjects, consumers and directory entries are therefore
the bus's session's (:class:`~bus.BusPort` ``session_id``; a bus without one shares the
team-wide scope): another session's messages never reach this node, and what a dead one
left stays in the stream untouched, for ``pantheon resume`` (which reads the stream itself,
not the consumers). :meth:`NatsTransport.leftovers` counts it per session;
:meth:`NatsTransport.discard` deletes a finished session's consumers (the messages stay).

Publishing (``_publisher``): ``try_send`` encodes the envelope and queues a PUB asking for
its stream ack; at most ``window`` wait for one, past that the bus awaits ``send``; an
unacknowledged one goes again under the same ``Nats-Msg-Id``. Groups hosted on this node were
served locally by the bus; the envelope names them (``skip``) and their consumers acknowledge
it without delivering. Receiving (``_consumers``): each hosted group pulls on its lanes within
``credit`` and hands each message to its own subscription with a :class:`StreamReceipt`, which
acks, naks with backoff, gives it back (the bus closed) or dead-letters it to the DLQ stream
after ``max_deliver`` deliveries. Each failed delivery is also in the receiving bus's own DLQ,
with its traceback, as on any transport; the stream holds the message once, for every
publisher to list and redrive (:meth:`NatsTransport.dead_letters`,
:meth:`NatsTransport.redrive`). A node that dies holds nothing: after ``ack_wait`` the server
gives its messages to another member. ``flush`` waits for the stream acks and then until every
remote group's consumer has acknowledged past the last message this node published to it (its
ack floor), so ``Bus.drain`` covers remote work as it does on ZeroMQ.

The state lives in the parts, one per file, and this module composes them: ``_publisher``
(:class:`Outbox`: the one write-out queue; :class:`Publisher`: the window, stream acks,
resends, ack floors), ``_consumers`` (:class:`Consumers`: groups, lanes, pull requests,
receipts, settling, per-group dead-lettering), ``_directory`` (:class:`Directory`: the node
entries in the bucket, sync, routes), ``_replies`` (:class:`Replies`: requests awaiting an
answer), ``_dlq`` (listing and redriving the DLQ stream), ``_connect`` (connection and
JetStream setup) and ``_wire`` (the codecs). What crosses parts goes through here: the
heartbeat tick, a reconnect, applying subscriptions, closing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import secrets
import socket
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import partial
from typing import Any

from bus._clock import mono_to_wall as read_mono_to_wall
from bus._envelope import Envelope
from bus._errors import EncodeError, TransportError
from bus._topics import matches
from bus._transport import BusPort, Transport, wake
from bus.backends.nats import _backlog, _dlq, _history, _journal
from bus.backends.nats._backlog import Waiting
from bus.backends.nats._connect import connect, ensure_streams
from bus.backends.nats._connect import probe as probe_server
from bus.backends.nats._consumers import Consumers, Group
from bus.backends.nats._directory import Directory
from bus.backends.nats._dlq import DeadLetterEntry
from bus.backends.nats._errors import ConnectError
from bus.backends.nats._journal import JournalReader
from bus.backends.nats._options import check_options, credentials
from bus.backends.nats._publisher import Outbox, Publisher
from bus.backends.nats._replies import Replies
from bus.backends.nats._subjects import (
    LANES,
    NO_SESSION,
    check_token,
    consumer_name,
    directory_bucket,
    dlq_subject,
    scope_of,
    stream_name,
    sync_subject,
)
from bus.backends.nats._wire import Wire, decode_wire, encode, envelope_of

__all__ = ["DeadLetterEntry", "NatsTransport"]

_log = logging.getLogger("bus.nats")

#: Handlings whose emits :meth:`NatsTransport._msg_id` numbers (the oldest forgotten first).
_ORDINALS = 65_536

#: What ``stats()`` counts; every part adds to the one dict.
_COUNTERS = (
    "published",
    "acked_by_stream",
    "duplicates",
    "duplicates_dropped",
    "resent",
    "received",
    "looped",
    "redelivered",
    "skipped",
    "acked",
    "naked",
    "released",
    "dead_lettered",
    "dlq_received",
    "malformed",
    "reconnects",
    "replies_sent",
    "replies_received",
)


class NatsTransport(Transport):
    """A :class:`~bus.Transport` over NATS JetStream: ``Bus(transport=NatsTransport(url))``.

    ``url`` is one server or several (a cluster), ``team`` names the stream every process of
    one team shares, ``node`` this process (default host-pid-random). Credentials: ``user``
    and ``password``, ``nkey_seed`` (a seed file), ``creds`` (a .creds file) or ``token``.
    ``storage`` is ``file`` or ``memory``; ``replicas`` the stream's (1 or, on a 3-server
    cluster, 3). ``credit`` bounds messages one group holds here and its consumer's
    ``max_ack_pending``; ``batch`` one pull request; ``window`` publishes awaiting their
    stream ack. A failed message is naked with delay ``backoff[0] * 2**(n-1)`` (at most
    ``backoff[1]``) and dead-lettered after ``max_deliver`` deliveries. A node silent for
    ``heartbeat * liveness`` seconds leaves the others' directory view.

    Subjects, consumer groups and directory entries are those of the bus's session (see the
    module docstring): processes of one session share them, other sessions of the team (an
    earlier run that died, a concurrent one) have their own.

    ``fed_remotely`` names groups this node's bus never serves in memory: its own publishes
    reach them through the stream like anyone's, so what one of their members held is
    still in the stream when it dies (a standby member elsewhere takes it after
    ``ack_wait``), at the cost of a round trip to the server per hop.

    ``warm`` makes this node a warm standby of some groups: subscription name -> the nodes
    ahead of it. Such a group pulls nothing while one of those nodes is in the directory
    hosting it, and starts once none is (a node that closed, or silent for ``heartbeat *
    liveness`` seconds): one instance of a stateful agent at a time, where a hot standby
    (the default) shares the work from the start. What the dead member held comes back
    after ``ack_wait``, as for a hot standby.
    """

    def __init__(
        self,
        url: str | Sequence[str] = "nats://127.0.0.1:4222",
        *,
        team: str = "default",
        node: str | None = None,
        user: str | None = None,
        password: str | None = None,
        nkey_seed: str | None = None,
        creds: str | None = None,
        token: str | None = None,
        storage: str = "file",
        replicas: int = 1,
        dedup_window: float = 120.0,
        max_age: float = 86_400.0,
        credit: int = 256,
        batch: int = 64,
        window: int = 4096,
        max_deliver: int = 5,
        ack_wait: float = 30.0,
        backoff: tuple[float, float] = (0.1, 5.0),
        ack_timeout: float = 2.0,
        heartbeat: float = 1.0,
        liveness: int = 3,
        connect_timeout: float = 10.0,
        fed_remotely: Iterable[str] = (),
        warm: Mapping[str, Sequence[str]] | None = None,
    ) -> None:
        self.fed_remotely = frozenset(fed_remotely)
        self.warm = {name: tuple(ahead) for name, ahead in (warm or {}).items() if ahead}
        self.urls = [url] if isinstance(url, str) else list(url)
        if not self.urls:
            raise ValueError("NatsTransport: url needs at least one server")
        self.team = check_token(team, "team")
        if team == "dlq":
            raise ValueError("NatsTransport: team 'dlq' is reserved for the dead letter stream")
        default = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.node = check_token(node or default.replace(".", "-"), "node")
        check_options(
            storage, user, password, replicas, credit, batch, window, max_deliver, liveness,
            dedup_window, max_age, ack_wait, ack_timeout, heartbeat, connect_timeout, backoff,
        )  # fmt: skip
        self.credentials = credentials(user, password, nkey_seed, creds, token)
        self.storage = storage
        self.replicas = replicas
        self.dedup_window = dedup_window
        self.max_age = max_age
        self.credit = credit
        self.batch = min(batch, credit)
        self.window = window
        self.max_deliver = max_deliver
        self.ack_wait = ack_wait
        self.backoff = backoff
        self.ack_timeout = ack_timeout
        self.heartbeat = heartbeat
        self.liveness = liveness
        self.connect_timeout = connect_timeout
        self.stream = stream_name(self.team)
        self._nc: Any = None
        self._js: Any = None
        self._kv: Any = None
        self._port: BusPort | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._connected = False
        self._started = False
        #: The bus's session as a subject token (``_subjects.scope_of``), set by ``start``.
        self.scope = NO_SESSION
        self._tasks: list[asyncio.Task[None]] = []
        prefix = f"_INBOX.pantheon.{self.node}.{secrets.token_hex(4)}"
        self._ack_prefix = f"{prefix}.ack"
        self._reply_prefix = f"{prefix}.reply"
        # ``created`` crosses NATS as wall-clock ns: on one machine every process reads the
        # same wall and monotonic clocks, so the shifts agree to within the tens of ns each
        # is read to (a single unbracketed read is off by any preemption between its two
        # calls); across machines a queue wait is as right as the hosts' NTP sync.
        self._mono_to_wall = mono_to_wall = read_mono_to_wall()
        self._counts = counts = dict.fromkeys(_COUNTERS, 0)
        self._outbox = outbox = Outbox(self.node)
        self._replies = replies = Replies(
            counts=counts, send=outbox.send, mono_to_wall=mono_to_wall
        )
        groups: dict[tuple[str, str], Group] = {}
        self._directory = directory = Directory(
            node=self.node,
            team=self.team,
            bucket=directory_bucket(self.team),
            counts=counts,
            groups=groups,
            send=outbox.send,
            on_change=self._directory_changed,
            fed=self.fed_remotely,
        )
        self._publisher = publisher = Publisher(
            node=self.node,
            stream=self.stream,
            ack_prefix=self._ack_prefix,
            window=window,
            outbox=outbox,
            counts=counts,
            requests=replies.requests,
            live_consumers=directory.live_consumers,
        )
        self._consumers = Consumers(
            node=self.node,
            team=self.team,
            stream=self.stream,
            pull_prefix=f"{prefix}.pull",
            credit=credit,
            batch=self.batch,
            ack_wait=ack_wait,
            max_deliver=max_deliver,
            backoff=backoff,
            replicas=replicas,
            mono_to_wall=mono_to_wall,
            counts=counts,
            tasks=self._tasks,
            groups=groups,
            outbox=outbox,
            answer=replies.answer,
            local_names=directory.local_names,
            local_names_of=directory.local_names_of,
        )
        self._groups = groups
        # What the hot path reads: each one object for the node's life, held directly.
        self._pending = publisher.pending
        self._publish = publisher.publish
        self._routes = directory.routes
        self._route = directory.route
        self._requests = replies.requests
        self._forget_request = replies.forget
        # subscriptions and sync
        self._ordinals: OrderedDict[tuple[int, str], int] = OrderedDict()
        self._wanted: list[tuple[str, str]] = []
        self._wanted_version = 0
        self._applier: asyncio.Task[None] | None = None
        self._applied = asyncio.Event()

    @property
    def endpoint(self) -> str:
        """The server URLs, comma-separated: what a node process of the run connects to."""
        return ",".join(self.urls)

    @property
    def started(self) -> bool:
        """Whether :meth:`start` got through (connected, streams and subscriptions set up),
        whatever happened since. One that never did left nothing of its session on the
        server: no consumer group to delete."""
        return self._started

    # -- lifecycle ---------------------------------------------------------------------------

    async def probe(self) -> None:
        """Connect once and leave, before anything depends on the server: raises
        :class:`ConnectError` (``connection refused`` within a second when nothing listens
        at the URLs) or :class:`AuthorizationError`, as :meth:`start` would. A run calls it
        before it records a session or starts a process."""
        await probe_server(self.urls, f"{self.node}-probe", self.credentials, self.connect_timeout)

    async def start(self, port: BusPort) -> None:
        if self._nc is not None:
            raise TransportError(f"NatsTransport {self.node!r} is already started")
        self._port = self._publisher.port = self._consumers.port = port
        self.scope = self._consumers.scope = scope_of(port.session_id)
        self._directory.set_scope(self.scope)
        self._loop = self._outbox.loop = self._consumers.loop = asyncio.get_running_loop()
        self._publisher.track_wake = asyncio.Event()
        self._applied = asyncio.Event()
        self._nc = nc = await connect(
            self.urls,
            self.node,
            self.credentials,
            self.connect_timeout,
            closed=lambda: self._closed,
            disconnected_cb=self._on_disconnected,
            reconnected_cb=self._on_reconnected,
        )
        self._outbox.nc = self._consumers.nc = nc
        try:
            self._js = self._publisher.js = self._consumers.js = nc.jetstream()
            async with asyncio.timeout(self.connect_timeout):
                self._kv = self._directory.kv = await ensure_streams(
                    self._js,
                    node=self.node,
                    team=self.team,
                    stream=self.stream,
                    storage=self.storage,
                    replicas=self.replicas,
                    dedup_window=self.dedup_window,
                    max_age=self.max_age,
                )
            directory = self._directory
            await nc.subscribe(f"{self._ack_prefix}.*", cb=self._publisher.on_ack)
            await nc.subscribe(f"{self._reply_prefix}.*", cb=self._replies.on_answer)
            await nc.subscribe(sync_subject(self.team, self.scope, self.node), cb=directory.on_sync)
            await nc.subscribe(dlq_subject(self.team, self.node), cb=self._replies.on_dead)
            await nc.subscribe(f"{directory.kv_prefix}>", cb=directory.on_entry)
            await directory.load()
            await directory.put_entry()
        except TimeoutError:
            await nc.close()
            raise ConnectError(
                f"NATS at {', '.join(self.urls)}: JetStream not ready within "
                f"{self.connect_timeout}s (is the server started with -js?)"
            ) from None
        except BaseException:
            await nc.close()
            raise
        self._connected = self._started = True
        self._tasks.append(self._loop.create_task(self._tick(), name=f"nats:{self.node}:tick"))
        self._tasks.append(
            self._loop.create_task(self._publisher.track(), name=f"nats:{self.node}:track")
        )

    async def _on_disconnected(self) -> None:
        self._connected = False

    async def _on_reconnected(self) -> None:
        """Pull requests died with the old connection: make new ones; resend what waits for
        a stream ack now rather than at its timeout."""
        self._connected = True
        self._counts["reconnects"] += 1
        self._consumers.reconnected()
        self._publisher.reconnected()
        self._directory.reconnected()

    async def aclose(self) -> None:
        """Leave: wait (up to ``ack_timeout`` + a heartbeat) for the stream to acknowledge
        what was published, give back every message held here unsettled (nak, no delay:
        another member takes it), leave the directory, close the connection."""
        if self._closed:
            return
        self._closed = self._consumers.closed = True
        if self._nc is None:
            return
        publisher = self._publisher
        if self._pending and self._connected:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.ack_timeout + self.heartbeat):
                    while self._pending:
                        await self._wait(publisher.idle_waiters)
        await self._consumers.close(self.heartbeat + 2)
        with contextlib.suppress(Exception):
            if self._kv is not None and self._connected:
                async with asyncio.timeout(self.heartbeat):
                    await self._kv.delete(self._directory.key)
        await self._outbox.write_out()
        tasks = [t for t in [*self._tasks, self._outbox.writer, self._applier] if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._consumers.stop_waiting()
        publisher.close()
        wake(self._directory.sync_waiters)
        with contextlib.suppress(Exception):
            await self._nc.flush(timeout=1)
        with contextlib.suppress(Exception):
            await self._nc.close()

    # -- the Transport contract --------------------------------------------------------------

    def advertise(self, subscriptions: Iterable[tuple[str, str]]) -> None:
        self._wanted = sorted(subscriptions)
        self._wanted_version += 1
        self._directory.set_local(self._wanted)
        self._applied.clear()
        if (
            self._loop is not None
            and not self._closed
            and (self._applier is None or self._applier.done())
        ):
            self._applier = self._loop.create_task(self._apply())

    async def _apply(self) -> None:
        """Create the consumers of new groups (before anyone routes to them), start pulling,
        stop pulling for groups gone, then publish this node's entry in the directory."""
        groups, consumers, directory = self._groups, self._consumers, self._directory
        while True:
            version = self._wanted_version
            wanted = set(self._wanted)
            try:
                for key in [k for k in groups if k not in wanted]:
                    consumers.leave(groups.pop(key))
                for name, pattern in sorted(wanted - set(groups)):
                    passive = self._ahead(name, pattern)
                    group = await consumers.open_group(name, pattern, passive)
                    groups[(name, pattern)] = group
                    if name in self.warm:
                        # The directory may have changed while the group was being opened,
                        # when it was in no list _directory_changed goes through.
                        consumers.set_passive(group, self._ahead(name, pattern))
                directory.version += 1
                await directory.put_entry()
            except Exception:
                if self._closed:
                    return
                _log.exception("NATS node %s: applying subscriptions failed", self.node)
                await asyncio.sleep(0.2)
                continue
            if version == self._wanted_version:
                self._applied.set()
                wake(directory.sync_waiters)
                return

    async def sync(self) -> None:
        """Wait until this node's latest subscriptions are in the directory and every other
        live node confirmed it has seen them (its ``has_remote`` reflects them)."""
        directory = self._directory
        while not self._closed:
            if not self._applied.is_set():
                await self._applied.wait()
                continue
            if not directory.unsynced():
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heartbeat):
                    await self._wait(directory.sync_waiters)

    def has_remote(self, topic: str) -> bool:
        route = self._routes.get(topic)
        if route is None:
            route = self._route(topic)
        return route.remote

    def try_send(self, envelope: Envelope) -> bool:
        if self._closed:
            raise TransportError(f"transport {self.node!r} is closed")
        if len(self._pending) >= self.window:
            return False
        env = envelope
        route = self._routes.get(env.topic)
        if route is None:
            route = self._route(env.topic)
        if not route.remote:
            return True
        subject = route.subjects[env.priority]
        reply = env.reply
        inbox = None
        if reply is not None and isinstance(reply, asyncio.Future):
            inbox = f"{self._reply_prefix}.{env.id}"
            self._requests[env.id] = reply
            reply.add_done_callback(partial(self._forget_request, env.id))
        wire = Wire(
            env.topic,
            env.payload,
            env.priority,
            env.id,
            env.session_id,
            env.correlation_id,
            env.causation_id,
            env.trace,
            env.created + self._mono_to_wall,
            env.hops,
            env.source,
            self.node,
            route.skip,
            None,
            inbox,
        )
        try:
            body = encode(wire)
        except Exception as exc:  # TypeError, OverflowError, RecursionError, ...
            if inbox is not None:
                self._requests.pop(env.id, None)
            raise EncodeError(f"payload of {env.topic!r} is not msgpack-encodable: {exc}") from exc
        if len(body) > self._nc.max_payload:
            if inbox is not None:
                self._requests.pop(env.id, None)
            raise EncodeError(
                f"message on {env.topic!r} is {len(body)} bytes encoded; the NATS server takes "
                f"at most {self._nc.max_payload} (its max_payload)"
            )
        msg_id = str(env.id) if inbox is not None else self._msg_id(env)
        self._publish(env, subject, body, msg_id, route.tracked[env.priority])
        return True

    def _msg_id(self, env: Envelope) -> str:
        """The ``Nats-Msg-Id`` of a publish: for the k-th message subscription ``source``
        emitted while handling message ``cause``, ``cause.source.k``; else the envelope id.

        A member that dies after publishing what it emitted but before its ack reached the
        server leaves the message to another member after ``ack_wait``; that one emits the
        same messages again, under the same names, and the stream (within ``dedup_window``)
        stores each once: no item gets its outcome twice. A request keeps its envelope id
        (its asker waits on an inbox of its own). The ordinals are counted per handling for
        the latest :data:`_ORDINALS` handlings: a handler still emitting for one message
        after that many others began would restart at 0, and a repeat within the window
        would be dropped."""
        cause = env.causation_id
        source = env.source
        if cause is None or source is None:
            return str(env.id)
        ordinals = self._ordinals
        key = (cause, source)
        n = ordinals.get(key)
        if n is None:
            n = 0
            if len(ordinals) >= _ORDINALS:
                ordinals.popitem(last=False)
        ordinals[key] = n + 1
        return f"{cause}.{source}.{n}"

    async def send(self, envelope: Envelope) -> None:
        while not self.try_send(envelope):
            await self._wait(self._publisher.credit_waiters)

    async def flush(self) -> None:
        """Wait until the stream acknowledged every publish, and every remote group's
        consumer acknowledged past what this node published to it."""
        if self._nc is None or self._closed:
            return
        publisher = self._publisher
        while publisher.busy():
            await self._wait(publisher.idle_waiters)

    def stats(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "team": self.team,
            "url": self.urls[0] if len(self.urls) == 1 else list(self.urls),
            "connected": self._connected,
            "in_flight": self._publisher.in_flight(),
            "held": self._consumers.held(),
            "awaiting_stream_ack": len(self._pending),
            "peers": sorted(self._directory.others),
            # A warm standby's groups that wait for the nodes ahead of them to go.
            "standing_by": sorted(g.name for g in self._groups.values() if g.passive),
            **self._counts,
        }

    # -- dead letters --------------------------------------------------------------------------

    async def journal_append(self, key: str, seq: int, data: bytes, end: bool = False) -> None:
        """Store a recorder's shipment ``seq`` (opaque bytes) of recording ``key`` from this
        node on the team's stream; returns once the server acknowledged it (``_journal``)."""
        if self._js is None:
            raise TransportError(f"NatsTransport {self.node!r} is not started")
        await _journal.append(self._js, self.team, key, self.node, seq, data, end)

    def journal_reader(
        self,
        key: str,
        on_shipment: Callable[[str, int, bytes, bool], None],
        done: dict[str, int] | None = None,
    ) -> JournalReader:
        """A reader of recording ``key``'s shipments from every node (``_journal``)."""
        if self._js is None:
            raise TransportError(f"NatsTransport {self.node!r} is not started")
        return JournalReader(self._js, self.team, key, on_shipment, done)

    async def published(self, origin: str, session_id: str) -> list[Envelope]:
        """The messages of ``session_id`` that node ``origin`` published and the team's
        stream still holds (``_history``): a dead process's sent messages, exactly."""
        if self._js is None:
            raise TransportError(f"NatsTransport {self.node!r} is not started")
        return await _history.published(self._js, self.team, origin, session_id)

    async def dead_letters(self) -> list[DeadLetterEntry]:
        """Every message of this team in the DLQ stream, oldest first."""
        return await _dlq.dead_letters(self._js, self.team, self._mono_to_wall)

    async def redrive(self, seqs: Iterable[int] | None = None) -> int:
        """Republish dead letters (all of this team's, or those ``seqs``) to the subscription
        that failed them, then remove them from the DLQ stream; returns how many went."""
        return await _dlq.redrive(self._js, self.team, self.node, self._mono_to_wall, seqs)

    # -- what waits in the stream --------------------------------------------------------------

    async def backlog(self, groups: Iterable[tuple[str, str]]) -> dict[tuple[str, str], int]:
        """Per ``(name, pattern)`` group, the messages its consumers have not had
        acknowledged (held by a member, or not handed out yet), over every lane."""
        out: dict[tuple[str, str], int] = {}
        for name, pattern in groups:
            out[(name, pattern)] = sum(
                [
                    await _backlog.count_waiting(
                        self._js, self.stream, consumer_name(self.scope, name, pattern, lane)
                    )
                    for lane in range(len(LANES))
                ]
            )
        return out

    async def waiting(self, groups: Iterable[tuple[str, str]], timeout: float) -> Waiting:
        """What the stream holds for groups that have no live member, read as the group
        would receive it; nothing is acknowledged (see :class:`Waiting`). ``timeout``: how
        long to wait for what a dead member held to come back (``ack_wait`` after its
        death is enough); past it, ``complete`` is False."""
        assert self._loop is not None
        deadline = self._loop.time() + timeout
        waiting: dict[tuple[str, str], list[Envelope]] = {}
        handed: dict[tuple[str, str], list[Envelope]] = {}
        complete = True
        for name, pattern in groups:
            mine = waiting[(name, pattern)] = []
            served = handed[(name, pattern)] = []
            for lane in range(len(LANES)):
                consumer = consumer_name(self.scope, name, pattern, lane)
                bodies, whole = await _backlog.read_waiting(
                    self._nc, self._js, self.stream, consumer, self.batch, deadline
                )
                complete = complete and whole
                for body in bodies:
                    try:
                        wire = decode_wire(body)
                    except ValueError:
                        continue  # malformed: dead-lettered by whoever reads it, not an item
                    if (wire.only is not None and name not in wire.only) or not matches(
                        pattern, wire.topic
                    ):
                        continue
                    env = envelope_of(wire, self._mono_to_wall)
                    (served if wire.skip is not None and name in wire.skip else mine).append(env)
        return Waiting(waiting, handed, complete)

    async def leftovers(self) -> dict[str, int]:
        """What other sessions of this team left in the stream: per session whose consumer
        groups hold unacknowledged messages and have no member pulling (a run whose
        processes died), how many. This bus's consumers never see them (they filter its own
        session's subjects); ``pantheon resume`` finishes such a run from the stream."""
        if self._js is None:
            raise TransportError(f"NatsTransport {self.node!r} is not started")
        return await _backlog.leftovers(self._js, self.stream, self.scope)

    async def discard(self, session: str) -> int:
        """Delete the consumer groups of ``session``, a session no process runs any more
        (finished, or resumed), from the server; returns how many consumers went. Its
        messages stay in the stream until ``max_age``: only the record of who had taken
        them goes, so no later listing counts them as left."""
        if self._js is None:
            raise TransportError(f"NatsTransport {self.node!r} is not started")
        return await _backlog.discard(self._js, self.stream, scope_of(session))

    # -- what crosses the parts ----------------------------------------------------------------

    async def _tick(self) -> None:
        """Once per heartbeat-ish: resend unacknowledged publishes, keep held messages
        alive, expire silent nodes and pull requests, refresh this node's entry."""
        beat_every = self.heartbeat
        next_beat = time.monotonic() + beat_every
        step = min(0.25, self.ack_timeout / 2, beat_every / 2)
        while True:
            await asyncio.sleep(step)
            now = time.monotonic()
            if self._connected:
                self._publisher.resend(now, self.ack_timeout)
                self._consumers.keep_alive(now)
            if now >= next_beat and self._connected:
                # Only while connected: cut off from the server, this node hears nobody, and
                # forgetting them would stop it publishing to groups that are still there.
                next_beat = now + beat_every
                self._directory.expire(now, beat_every * self.liveness)
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(beat_every):
                        await self._directory.put_entry()

    def _ahead(self, name: str, pattern: str) -> bool:
        """Whether a node ahead of this warm standby hosts the group (see ``warm``)."""
        ahead = self.warm.get(name)
        if not ahead:
            return False
        others = self._directory.others
        return any(
            (entry := others.get(node)) is not None and (name, pattern) in entry.subs
            for node in ahead
        )

    def _directory_changed(self) -> None:
        if self.warm:
            for (name, pattern), group in list(self._groups.items()):
                if name in self.warm:
                    self._consumers.set_passive(group, self._ahead(name, pattern))
        if self.on_change is not None:
            self.on_change()

    async def _wait(
        self, waiters: list[asyncio.Future[None]] | deque[asyncio.Future[None]]
    ) -> None:
        assert self._loop is not None
        fut = self._loop.create_future()
        waiters.append(fut)
        await fut
