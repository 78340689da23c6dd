"""NatsTransport: the bus over NATS JetStream, durable and clustered.

Mapping (see ``_subjects.py``): team ``T`` has one stream ``PANTHEON_T`` capturing
``pantheon.T.>`` (file storage by default, a ``dedup_window`` for ``Nats-Msg-Id``). A message
on topic ``a.b`` with priority HIGH is published on ``pantheon.T.high.a.b`` with
``Nats-Msg-Id`` = the envelope id, so a publish repeated after a lost ack is stored once.
Each subscription name is a consumer group: one durable pull consumer per priority lane
(``critical``, ``high``, ``normal``), shared by every process hosting that name, with
``max_ack_pending`` = ``credit``. The directory of nodes (who hosts which ``(name,
pattern)``) is a JetStream key-value bucket, ``pantheon_nodes_T``; dead letters of every team
go to the ``PANTHEON_DLQ`` stream (subjects ``pantheon.dlq.T.<publishing node>``).

Publishing: ``try_send`` encodes the envelope and queues a PUB whose reply subject is this
node's ack inbox; one task per loop turn writes what was queued. At most ``window`` publishes
wait for their stream ack; past that ``try_send`` says "wait" and the bus awaits ``send``.
A publish not acknowledged within ``ack_timeout`` (the server restarted, a route moved) is
sent again with the same ``Nats-Msg-Id``, so the stream dedups it. Groups hosted on this
node were served locally by the bus; the envelope names them (``skip``) and their consumers
acknowledge it without delivering.

Receiving: for each group it hosts, the node keeps pull requests (``batch`` messages, long
poll) outstanding on each lane, requesting CRITICAL's first, never more than ``credit`` held
at once (requested + parked + in the bus). A pulled message becomes an envelope with a
:class:`_Receipt` and goes to ``BusPort.deliver`` for that group's subscription only. When a
``block`` mailbox is full, deliver returns an awaitable: the group stops pulling and what
its outstanding requests still bring is parked (bounded by ``credit``) until the mailbox has
room. The receipt, once the subscription is done, acknowledges (handled), naks with an
exponential delay (failed, to be redelivered), naks without delay (the bus closed:
:meth:`_Receipt.release`), or, after ``max_deliver`` deliveries, publishes the message to the
DLQ stream with its delivery count and last error, then terminates it. Each failed delivery
is also in the receiving bus's own DLQ, with its traceback, as a failure is on any transport;
the stream holds the message once, for every publisher to list and redrive
(:meth:`NatsTransport.dead_letters`, :meth:`NatsTransport.redrive`). A message held longer
than half of ``ack_wait`` is kept alive with ``+WPI``; a node that dies holds nothing: after
``ack_wait`` the server gives its messages to another member.

``flush`` waits for the stream acks and then until every remote group's consumer has
acknowledged past the last message this node published to it (its ack floor), so
``Bus.drain`` covers remote work as it does on ZeroMQ.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import secrets
import socket
import time
from collections import deque
from collections.abc import Awaitable, Iterable, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.aio.msg import Msg
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    RetentionPolicy,
    StorageType,
    StreamConfig,
)

from bus._envelope import Envelope
from bus._errors import BusClosedError, EncodeError, QueueFullError, TransportError
from bus._topics import GlobIndex
from bus._transport import BusPort, Receipt, Transport, wake
from bus.backends.nats._errors import AuthorizationError, ConnectError, RemoteHandlerError
from bus.backends.nats._subjects import (
    DLQ_STREAM,
    DLQ_SUBJECTS,
    LANES,
    check_token,
    consumer_name,
    directory_bucket,
    dlq_subject,
    filter_subject,
    stream_name,
    subject_of,
    sync_subject,
)

__all__ = ["DeadLetterEntry", "NatsTransport"]

_log = logging.getLogger("bus.nats")

#: Seconds a pull request waits on the server for messages (a long poll).
_PULL_EXPIRES = 5.0
#: Seconds between looks at the remote groups' ack floors while a flush waits for them, and
#: while nothing waits (``stats()['in_flight']`` is then at most this stale).
_TRACK_EVERY = 0.02
_TRACK_IDLE = 0.2
#: Handled message ids remembered per group (at least this many) to drop redeliveries.
_DEDUP_IDS = 65_536
_ACK = b"+ACK"
_TERM = b"+TERM"
_WPI = b"+WPI"


class _Wire(msgspec.Struct, array_like=True, gc=False):
    """An envelope on the wire, plus what only the transport reads."""

    topic: str
    payload: Any
    priority: int
    id: int
    session_id: str | None
    correlation_id: int
    causation_id: int | None
    trace: str | None
    created: int  # wall-clock ns (monotonic clocks differ between processes)
    hops: int
    source: str | None
    origin: str  # the publishing node: its DLQ subject
    skip: list[str] | None = None  # groups the publisher served locally
    only: list[str] | None = None  # a redrive: for these groups only
    reply: str | None = None  # a request: where the answer goes


class _Answer(msgspec.Struct, array_like=True):
    ok: bool
    value: Any
    error_type: str | None = None
    error: str | None = None
    topic: str = ""


class _NodeEntry(msgspec.Struct):
    """A node's record in the directory bucket."""

    node: str
    version: int
    subs: list[tuple[str, str]]
    host: str
    pid: int


class _SyncAck(msgspec.Struct, array_like=True):
    node: str
    version: int


_encode = msgspec.msgpack.Encoder().encode
_decode_wire = msgspec.msgpack.Decoder(_Wire).decode
_decode_answer = msgspec.msgpack.Decoder(_Answer).decode
_decode_node = msgspec.msgpack.Decoder(_NodeEntry).decode
_decode_sync = msgspec.msgpack.Decoder(_SyncAck).decode
_decode_json = msgspec.json.decode


@dataclass(frozen=True, slots=True)
class DeadLetterEntry:
    """One message in the DLQ stream: what failed, where, how often, and why."""

    seq: int
    envelope: Envelope
    subscriber: str
    deliveries: int
    error_type: str
    error: str
    node: str
    subject: str


class _Lane:
    __slots__ = ("api", "consumer", "index", "outstanding", "requests")

    def __init__(self, stream: str, consumer: str, index: int) -> None:
        self.consumer = consumer
        self.index = index
        self.api = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
        self.requests: dict[int, list[float]] = {}  # request id -> [remaining, deadline]
        self.outstanding = 0


class _Group:
    """A consumer group this node hosts: one subscription name with its pattern."""

    __slots__ = (
        "active",
        "closing",
        "deferred",
        "done",
        "done_old",
        "gid",
        "held",
        "lanes",
        "name",
        "parked",
        "pattern",
        "sub",
        "waiting",
    )

    def __init__(self, gid: int, name: str, pattern: str, lanes: list[_Lane]) -> None:
        self.gid = gid
        self.name = name
        self.pattern = pattern
        self.lanes = lanes
        self.held: dict[str, _Receipt] = {}
        self.parked: deque[Msg] = deque()
        self.waiting: asyncio.Task[None] | None = None
        self.active = True
        self.sub: Any = None  # its own pull inbox, so leaving ends its requests on the server
        self.closing: asyncio.Task[None] | None = None
        self.deferred: list[str] = []  # acks to give back once the inbox is gone
        # Ids handled and acknowledged here, two generations: a redelivery of one of them
        # (its ack lost when the server restarted) is acknowledged again, not handled twice.
        self.done: set[int] = set()
        self.done_old: set[int] = set()


class _Receipt(Receipt):
    """Settled by the bus once per subscription that took the message; then acks, naks,
    releases or dead-letters it on the server (see :meth:`_finish`)."""

    __slots__ = (
        "ack",
        "answered",
        "armed",
        "data",
        "delivered",
        "env",
        "error",
        "expected",
        "finished",
        "group",
        "pending",
        "released",
        "reply_to",
        "since",
        "transport",
    )

    def __init__(
        self,
        transport: NatsTransport,
        group: _Group,
        ack: str,
        delivered: int,
        env: Envelope,
        data: bytes,
        reply_to: str | None,
    ) -> None:
        self.transport = transport
        self.group = group
        self.ack = ack
        self.delivered = delivered
        self.env = env
        self.data = data
        self.reply_to = reply_to
        self.pending = 0
        self.expected = False
        self.armed = False
        self.finished = False
        self.released = False
        self.answered = False
        self.error: BaseException | None = None
        self.since = time.monotonic()

    def expect(self, count: int) -> None:
        self.pending += count
        self.expected = True
        self._maybe_finish()

    def settle(self, result: Any, error: BaseException | None) -> None:
        self.pending -= 1
        if error is not None:
            if isinstance(error, BusClosedError):
                self.released = True  # the bus closed before handling it: give it back
            elif self.error is None:
                self.error = error
        elif result is not None and self.reply_to is not None and not self.answered:
            self.answered = True
            self.transport._answer(self.reply_to, _Answer(True, result))
        self._maybe_finish()

    def release(self) -> None:
        """One subscription gives the message back unhandled (its bus is closing): nak with
        no delay once every subscription is done, so another member takes it."""
        self.released = True
        self.pending -= 1
        self._maybe_finish()

    def give_back(self) -> None:
        """The bus refused the message outright (closed): give it back now."""
        self.released = True
        self.expected = self.armed = True
        self.pending = 0
        self._maybe_finish()

    def arm(self) -> None:
        """The bus has taken (or refused) the message; finish once it is settled."""
        self.armed = True
        self._maybe_finish()

    def _maybe_finish(self) -> None:
        if self.armed and self.expected and self.pending <= 0 and not self.finished:
            self.finished = True
            self.transport._finish(self)


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
    ) -> None:
        self.urls = [url] if isinstance(url, str) else list(url)
        if not self.urls:
            raise ValueError("NatsTransport: url needs at least one server")
        self.team = check_token(team, "team")
        if team == "dlq":
            raise ValueError("NatsTransport: team 'dlq' is reserved for the dead letter stream")
        default = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(3)}"
        self.node = check_token(node or default.replace(".", "-"), "node")
        if storage not in ("file", "memory"):
            raise ValueError(f"NatsTransport: storage must be 'file' or 'memory', got {storage!r}")
        if (user is None) != (password is None):
            raise ValueError("NatsTransport: user and password go together")
        for label, value in (
            ("replicas", replicas),
            ("credit", credit),
            ("batch", batch),
            ("window", window),
            ("max_deliver", max_deliver),
            ("liveness", liveness),
        ):
            if value < 1:
                raise ValueError(f"NatsTransport: {label} must be >= 1, got {value}")
        for label, seconds in (
            ("dedup_window", dedup_window),
            ("max_age", max_age),
            ("ack_wait", ack_wait),
            ("ack_timeout", ack_timeout),
            ("heartbeat", heartbeat),
            ("connect_timeout", connect_timeout),
            ("backoff[1]", backoff[1]),
        ):
            if seconds <= 0:
                raise ValueError(f"NatsTransport: {label} must be > 0, got {seconds}")
        if backoff[0] < 0 or backoff[0] > backoff[1]:
            raise ValueError(
                f"NatsTransport: backoff must be (base >= 0, max >= base), got {backoff}"
            )
        self.credentials: dict[str, Any] = {
            k: v
            for k, v in (
                ("user", user),
                ("password", password),
                ("nkeys_seed", nkey_seed),
                ("user_credentials", creds),
                ("token", token),
            )
            if v is not None
        }
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
        self._tasks: list[asyncio.Task[None]] = []
        prefix = f"_INBOX.pantheon.{self.node}.{secrets.token_hex(4)}"
        self._ack_prefix = f"{prefix}.ack"
        self._reply_prefix = f"{prefix}.reply"
        self._pull_prefix = f"{prefix}.pull"
        self._kv_prefix = f"$KV.{directory_bucket(self.team)}."
        self._mono_to_wall = time.time_ns() - time.monotonic_ns()
        # outbound
        self._out: deque[tuple[str, str, bytes, dict[str, str] | None]] = deque()
        self._writer: asyncio.Task[None] | None = None
        self._pub_seq = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._credit_waiters: deque[asyncio.Future[None]] = deque()
        self._idle_waiters: list[asyncio.Future[None]] = []
        self._requests: dict[int, asyncio.Future[Any]] = {}
        self._tracked: dict[str, deque[int]] = {}
        self._track_wake = asyncio.Event()
        # routing
        self._local_index: GlobIndex[str] = GlobIndex()
        self._local_names: dict[str, frozenset[str]] = {}
        self._others: dict[str, _NodeEntry] = {}
        self._seen_at: dict[str, float] = {}
        self._remote_index: GlobIndex[tuple[str, str]] = GlobIndex()
        self._routes: dict[str, _Route] = {}
        # subscriptions and sync
        self._wanted: list[tuple[str, str]] = []
        self._wanted_version = 0
        self._version = 0  # published in the directory
        self._applier: asyncio.Task[None] | None = None
        self._applied = asyncio.Event()
        self._synced: dict[str, int] = {}
        self._sync_waiters: list[asyncio.Future[None]] = []
        self._groups: dict[tuple[str, str], _Group] = {}
        self._by_gid: dict[int, _Group] = {}
        self._by_consumer: dict[str, tuple[_Group, _Lane]] = {}
        self._gids = itertools.count(1)
        self._req_ids = itertools.count(1)
        self._counts = dict.fromkeys(
            (
                "published",
                "acked_by_stream",
                "duplicates",
                "duplicates_dropped",
                "resent",
                "received",
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
            ),
            0,
        )

    @property
    def endpoint(self) -> str:
        """The server URLs, comma-separated: what a node process of the run connects to."""
        return ",".join(self.urls)

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, port: BusPort) -> None:
        if self._nc is not None:
            raise TransportError(f"NatsTransport {self.node!r} is already started")
        self._port = port
        self._loop = asyncio.get_running_loop()
        self._track_wake = asyncio.Event()
        self._applied = asyncio.Event()
        self._nc = await self._connect()
        try:
            self._js = self._nc.jetstream()
            async with asyncio.timeout(self.connect_timeout):
                await self._ensure_streams()
            nc = self._nc
            await nc.subscribe(f"{self._ack_prefix}.*", cb=self._on_ack)
            await nc.subscribe(f"{self._reply_prefix}.*", cb=self._on_answer)
            await nc.subscribe(sync_subject(self.team, self.node), cb=self._on_sync)
            await nc.subscribe(dlq_subject(self.team, self.node), cb=self._on_dead)
            await nc.subscribe(f"{self._kv_prefix}>", cb=self._on_directory)
            await self._load_directory()
            await self._put_entry()
        except TimeoutError:
            await self._nc.close()
            raise ConnectError(
                f"NATS at {', '.join(self.urls)}: JetStream not ready within "
                f"{self.connect_timeout}s (is the server started with -js?)"
            ) from None
        except BaseException:
            await self._nc.close()
            raise
        self._connected = True
        self._tasks.append(self._loop.create_task(self._tick(), name=f"nats:{self.node}:tick"))
        self._tasks.append(self._loop.create_task(self._track(), name=f"nats:{self.node}:track"))

    async def _connect(self) -> Any:
        refused: list[BaseException] = []

        async def error_cb(exc: BaseException) -> None:
            if "authorization" in str(exc).lower() or "authentication" in str(exc).lower():
                refused.append(exc)
            elif not self._closed:
                _log.warning("NATS node %s: %s", self.node, exc)

        async def disconnected_cb() -> None:
            self._connected = False

        async def reconnected_cb() -> None:
            self._connected = True
            self._counts["reconnects"] += 1
            self._reconnected()

        where = ", ".join(self.urls)
        nc = NATS()
        connecting = asyncio.ensure_future(
            nc.connect(
                servers=self.urls,
                name=self.node,
                allow_reconnect=True,
                max_reconnect_attempts=-1,
                # nats-py annotates these int; it sleeps and times out on them as floats.
                reconnect_time_wait=0.1,  # type: ignore[arg-type]
                connect_timeout=min(2.0, self.connect_timeout),  # type: ignore[arg-type]
                error_cb=error_cb,
                disconnected_cb=disconnected_cb,
                reconnected_cb=reconnected_cb,
                **self.credentials,
            )
        )
        try:
            async with asyncio.timeout(self.connect_timeout):
                # The client retries a refused connection like a dropped one: a refusal of
                # the credentials ends the wait at once instead of at the timeout.
                while not connecting.done() and not refused:
                    await asyncio.wait({connecting}, timeout=0.05)
                if refused:
                    connecting.cancel()
                    with contextlib.suppress(BaseException):
                        await connecting
                    with contextlib.suppress(Exception):
                        await nc.close()
                    raise nats.errors.Error("authorization violation")
                await connecting
                return nc
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            if not connecting.done():
                connecting.cancel()
                with contextlib.suppress(BaseException):
                    await connecting
            with contextlib.suppress(Exception):
                await nc.close()
            text = f"{exc} {' '.join(map(str, refused))}".lower()
            if refused or "authorization" in text or "authentication" in text:
                raise AuthorizationError(
                    f"NATS at {where} refused node {self.node!r}: authorization violation "
                    "(check transport.credentials: user/password, nkey or creds)"
                ) from None
            raise ConnectError(
                f"cannot connect to NATS at {where} within {self.connect_timeout}s: "
                f"{type(exc).__name__} {exc}".rstrip()
            ) from None

    async def _ensure_streams(self) -> None:
        """The team's stream, the DLQ stream and the directory bucket; retried while a
        cluster is still electing its JetStream leader."""
        storage = StorageType.FILE if self.storage == "file" else StorageType.MEMORY
        configs = [
            StreamConfig(
                name=self.stream,
                subjects=[f"pantheon.{self.team}.>"],
                retention=RetentionPolicy.LIMITS,
                storage=storage,
                num_replicas=self.replicas,
                duplicate_window=self.dedup_window,
                max_age=self.max_age,
            ),
            StreamConfig(
                name=DLQ_STREAM,
                subjects=[DLQ_SUBJECTS],
                retention=RetentionPolicy.LIMITS,
                storage=storage,
                num_replicas=self.replicas,
                duplicate_window=self.dedup_window,
            ),
        ]
        while True:
            try:
                for config in configs:
                    await self._add_stream(config)
                await self._js.create_key_value(
                    KeyValueConfig(
                        bucket=directory_bucket(self.team),
                        history=1,
                        storage=storage,
                        replicas=self.replicas,
                    )
                )
                self._kv = await self._js.key_value(directory_bucket(self.team))
                return
            except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError) as exc:
                _log.info("NATS node %s: JetStream not ready yet (%s)", self.node, exc)
                await asyncio.sleep(0.2)
            except nats.js.errors.APIError as exc:
                if exc.code in (500, 503):
                    await asyncio.sleep(0.2)  # no meta leader yet
                    continue
                raise ConnectError(
                    f"NATS refused to set up JetStream for {self.team!r}: {exc}"
                ) from None

    async def _add_stream(self, config: StreamConfig) -> None:
        try:
            await self._js.add_stream(config)
        except nats.js.errors.BadRequestError as exc:
            if exc.err_code != 10058:  # already exists with another config: keep that one
                raise
            await self._js.stream_info(config.name)

    async def aclose(self) -> None:
        """Leave: wait (up to ``ack_timeout`` + a heartbeat) for the stream to acknowledge
        what was published, give back every message held here unsettled (nak, no delay:
        another member takes it), leave the directory, close the connection."""
        if self._closed:
            return
        self._closed = True
        if self._nc is None:
            return
        if self._pending and self._connected:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.ack_timeout + self.heartbeat):
                    while self._pending:
                        await self._wait(self._idle_waiters)
        for group in self._groups.values():
            self._deactivate(group)
        closing = [g.closing for g in self._groups.values() if g.closing is not None]
        if closing:
            await asyncio.wait(closing, timeout=self.heartbeat + 2)
        for group in self._groups.values():
            # The bus is closed: what it never settled (a delivery still waiting on a full
            # mailbox) goes back too, with whatever arrived after the group's close.
            for receipt in list(group.held.values()):
                if not receipt.finished:
                    group.deferred.append(receipt.ack)
            group.held.clear()
            self._give_back(group)
        with contextlib.suppress(Exception):
            if self._kv is not None and self._connected:
                async with asyncio.timeout(self.heartbeat):
                    await self._kv.delete(self.node)
        await self._write_out()
        for task in [*self._tasks, self._writer, self._applier]:
            if task is not None:
                task.cancel()
        await asyncio.gather(
            *(t for t in [*self._tasks, self._writer, self._applier] if t is not None),
            return_exceptions=True,
        )
        for group in self._groups.values():
            if group.waiting is not None:
                group.waiting.cancel()
        for fut in self._credit_waiters:
            if not fut.done():
                fut.set_exception(TransportError(f"transport {self.node!r} is closed"))
        wake(self._idle_waiters)
        wake(self._sync_waiters)
        with contextlib.suppress(Exception):
            await self._nc.flush(timeout=1)
        with contextlib.suppress(Exception):
            await self._nc.close()

    # -- the Transport contract --------------------------------------------------------------

    def advertise(self, subscriptions: Iterable[tuple[str, str]]) -> None:
        self._wanted = sorted(subscriptions)
        self._wanted_version += 1
        index: GlobIndex[str] = GlobIndex()
        for name, pattern in self._wanted:
            index.add(pattern, name)
        self._local_index = index
        self._local_names.clear()
        self._routes.clear()
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
        while True:
            version = self._wanted_version
            wanted = set(self._wanted)
            try:
                for key in [k for k in self._groups if k not in wanted]:
                    self._deactivate(self._groups.pop(key))
                for name, pattern in sorted(wanted - set(self._groups)):
                    self._groups[(name, pattern)] = await self._open_group(name, pattern)
                self._version += 1
                await self._put_entry()
            except Exception:
                if self._closed:
                    return
                _log.exception("NATS node %s: applying subscriptions failed", self.node)
                await asyncio.sleep(0.2)
                continue
            if version == self._wanted_version:
                self._applied.set()
                wake(self._sync_waiters)
                return

    async def _open_group(self, name: str, pattern: str) -> _Group:
        lanes = []
        for lane in range(len(LANES)):
            durable = consumer_name(name, pattern, lane)
            config = ConsumerConfig(
                durable_name=durable,
                filter_subject=filter_subject(self.team, lane, pattern),
                ack_policy=AckPolicy.EXPLICIT,
                deliver_policy=DeliverPolicy.NEW,
                ack_wait=self.ack_wait,
                max_deliver=-1,  # this transport counts deliveries and dead-letters itself
                max_ack_pending=self.credit,
                max_waiting=512,
                num_replicas=self.replicas,
            )
            try:
                await self._js.add_consumer(self.stream, config)
            except nats.js.errors.BadRequestError:
                await self._js.consumer_info(self.stream, durable)  # exists: keep its config
            lanes.append(_Lane(self.stream, durable, lane))
        gid = next(self._gids)
        group = _Group(gid, name, pattern, lanes)
        group.sub = await self._nc.subscribe(f"{self._pull_prefix}.{gid}.>", cb=self._on_pull)
        self._by_gid[gid] = group
        for lane_ in lanes:
            self._by_consumer[lane_.consumer] = (group, lane_)
        self._arm(group)
        return group

    async def sync(self) -> None:
        """Wait until this node's latest subscriptions are in the directory and every other
        live node confirmed it has seen them (its ``has_remote`` reflects them)."""
        while not self._closed:
            if not self._applied.is_set():
                await self._applied.wait()
                continue
            missing = [n for n in self._others if self._synced.get(n, 0) < self._version]
            if not missing:
                return
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.heartbeat):
                    await self._wait(self._sync_waiters)

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
        wire = _Wire(
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
            body = _encode(wire)
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
        self._publish(env, subject, body, str(env.id), route.tracked[env.priority])
        return True

    def _forget_request(self, env_id: int, _fut: asyncio.Future[Any]) -> None:
        self._requests.pop(env_id, None)

    async def send(self, envelope: Envelope) -> None:
        while not self.try_send(envelope):
            await self._wait(self._credit_waiters)

    async def flush(self) -> None:
        """Wait until the stream acknowledged every publish, and every remote group's
        consumer acknowledged past what this node published to it."""
        if self._nc is None or self._closed:
            return
        while self._pending or any(self._tracked.values()):
            await self._wait(self._idle_waiters)

    def stats(self) -> dict[str, Any]:
        tracked = sum(len(d) for d in self._tracked.values())
        held = sum(len(g.held) + len(g.parked) for g in self._groups.values())
        return {
            "node": self.node,
            "team": self.team,
            "url": self.urls[0] if len(self.urls) == 1 else list(self.urls),
            "connected": self._connected,
            "in_flight": len(self._pending) + tracked,
            "held": held,
            "awaiting_stream_ack": len(self._pending),
            "peers": sorted(self._others),
            **self._counts,
        }

    # -- dead letters --------------------------------------------------------------------------

    async def dead_letters(self) -> list[DeadLetterEntry]:
        """Every message of this team in the DLQ stream, oldest first."""
        prefix = f"pantheon.dlq.{self.team}."
        info = await self._js.stream_info(DLQ_STREAM)
        entries = []
        if not info.state.messages:
            return []
        for seq in range(max(1, info.state.first_seq), info.state.last_seq + 1):
            try:
                raw = await self._js.get_msg(DLQ_STREAM, seq)
            except nats.js.errors.NotFoundError:
                continue
            if not raw.subject.startswith(prefix):
                continue
            headers = raw.headers or {}
            wire = _decode_wire(raw.data)
            entries.append(
                DeadLetterEntry(
                    seq=seq,
                    envelope=self._envelope(wire),
                    subscriber=headers.get("Pantheon-Subscriber", "?"),
                    deliveries=int(headers.get("Pantheon-Deliveries", "0")),
                    error_type=headers.get("Pantheon-Error-Type", ""),
                    error=headers.get("Pantheon-Error", ""),
                    node=headers.get("Pantheon-Node", ""),
                    subject=headers.get("Pantheon-Subject", ""),
                )
            )
        return entries

    async def redrive(self, seqs: Iterable[int] | None = None) -> int:
        """Republish dead letters (all of this team's, or those ``seqs``) to the subscription
        that failed them, then remove them from the DLQ stream; returns how many went."""
        chosen = None if seqs is None else set(seqs)
        done = 0
        for entry in await self.dead_letters():
            if chosen is not None and entry.seq not in chosen:
                continue
            raw = await self._js.get_msg(DLQ_STREAM, entry.seq)
            wire = _decode_wire(raw.data)
            wire.only = [entry.subscriber]
            wire.skip = None
            wire.origin = self.node
            wire.reply = None
            await self._js.publish(
                entry.subject, _encode(wire), headers={"Nats-Msg-Id": f"{wire.id}.r{entry.seq}"}
            )
            await self._js.delete_msg(DLQ_STREAM, entry.seq)
            done += 1
        return done

    # -- publishing ----------------------------------------------------------------------------

    def _publish(
        self, env: Envelope | None, subject: str, body: bytes, msg_id: str, tracked: list[str]
    ) -> None:
        seq = next(self._pub_seq)
        pub = _Pending(env, subject, body, msg_id, tracked, time.monotonic())
        self._pending[seq] = pub
        self._counts["published"] += 1
        self._out.append((subject, f"{self._ack_prefix}.{seq}", body, {"Nats-Msg-Id": msg_id}))
        self._schedule_write()

    def _send(self, subject: str, body: bytes) -> None:
        self._out.append((subject, "", body, None))
        self._schedule_write()

    def _schedule_write(self) -> None:
        if (self._writer is None or self._writer.done()) and self._loop is not None:
            self._writer = self._loop.create_task(self._write_out())

    async def _write_out(self) -> None:
        nc = self._nc
        out = self._out
        while out:
            subject, reply, body, headers = out.popleft()
            try:
                await nc.publish(subject, body, reply=reply, headers=headers)
            except Exception as exc:  # disconnected with a full buffer, closed: resent later
                if reply:
                    continue  # a publish: the ack timeout sends it again
                _log.warning("NATS node %s: could not send to %s: %s", self.node, subject, exc)

    async def _on_ack(self, msg: Msg) -> None:
        seq = int(msg.subject[len(self._ack_prefix) + 1 :])
        pub = self._pending.get(seq)
        if pub is None:
            return  # the ack of a publish resent meanwhile
        headers = msg.headers
        if headers and headers.get("Status") == "503":
            return  # no stream answered (yet): the ack timeout resends it
        del self._pending[seq]
        try:
            answer = _decode_json(msg.data)
        except msgspec.DecodeError:
            answer = {"error": {"description": f"unreadable ack {msg.data[:80]!r}"}}
        error = answer.get("error")
        if error is not None:
            self._refused(pub, str(error.get("description", error)))
        else:
            self._counts["acked_by_stream"] += 1
            if answer.get("duplicate"):
                self._counts["duplicates"] += 1
            stream_seq = answer.get("seq", 0)
            for consumer in pub.tracked:
                dq = self._tracked.get(consumer)
                if dq is None:
                    dq = self._tracked[consumer] = deque()
                dq.append(stream_seq)
            if pub.tracked:
                self._track_wake.set()
        self._after_ack()

    def _refused(self, pub: _Pending, why: str) -> None:
        if pub.env is None or self._port is None:
            _log.warning("NATS node %s: %s refused: %s", self.node, pub.subject, why)
            return
        error = TransportError(f"NATS refused {pub.subject!r}: {why}")
        fut = self._requests.pop(pub.env.id, None)
        if fut is not None and not fut.done():
            fut.set_exception(error)
        self._port.dead_letter(pub.env, "<remote>", "transport_error", error)

    def _after_ack(self) -> None:
        if self._credit_waiters and len(self._pending) < self.window:
            self._wake_one(self._credit_waiters)
        if self._idle_waiters and not self._pending:
            wake(self._idle_waiters)

    async def _track(self) -> None:
        """Follow the ack floor of each remote group this node published to, so ``flush``
        and ``in_flight`` know when receivers are done."""
        while True:
            await self._track_wake.wait()
            self._track_wake.clear()
            while any(self._tracked.values()):
                live = self._live_consumers()
                for consumer, dq in list(self._tracked.items()):
                    if not dq:
                        continue
                    if consumer not in live:
                        dq.clear()  # that group left the directory: nobody to wait for
                        continue
                    try:
                        info = await self._js.consumer_info(self.stream, consumer)
                    except nats.js.errors.NotFoundError:
                        dq.clear()
                        continue
                    except Exception:  # disconnected, timeout: look again
                        break
                    floor = info.ack_floor.stream_seq if info.ack_floor else 0
                    while dq and dq[0] <= floor:
                        dq.popleft()
                if self._idle_waiters and not any(self._tracked.values()):
                    wake(self._idle_waiters)
                # Often while a flush waits on it; otherwise only to keep ``in_flight`` fresh
                # (each look is a JetStream API call per consumer).
                await asyncio.sleep(_TRACK_EVERY if self._idle_waiters else _TRACK_IDLE)
            if self._idle_waiters and not self._pending:
                wake(self._idle_waiters)

    def _live_consumers(self) -> set[str]:
        return {
            consumer_name(name, pattern, lane)
            for entry in self._others.values()
            for name, pattern in entry.subs
            for lane in range(len(LANES))
        }

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
                for seq, pub in list(self._pending.items()):
                    if now - pub.sent > self.ack_timeout:
                        pub.sent = now
                        self._counts["resent"] += 1
                        self._out.append(
                            (
                                pub.subject,
                                f"{self._ack_prefix}.{seq}",
                                pub.body,
                                {"Nats-Msg-Id": pub.msg_id},
                            )
                        )
                if self._out:
                    self._schedule_write()
                for group in list(self._groups.values()):
                    for receipt in group.held.values():
                        if now - receipt.since > self.ack_wait / 2:
                            receipt.since = now
                            self._send(receipt.ack, _WPI)
                    expired = False
                    for lane in group.lanes:
                        for rid, (remaining, deadline) in list(lane.requests.items()):
                            if now > deadline:
                                del lane.requests[rid]
                                lane.outstanding -= int(remaining)
                                expired = True
                    if expired:
                        self._arm(group)
            if now >= next_beat and self._connected:
                # Only while connected: cut off from the server, this node hears nobody, and
                # forgetting them would stop it publishing to groups that are still there.
                next_beat = now + beat_every
                lost = [n for n, t in self._seen_at.items() if now - t > beat_every * self.liveness]
                for node in lost:
                    self._forget_node(node)
                if lost:
                    self._directory_changed()
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(beat_every):
                        await self._put_entry()

    def _reconnected(self) -> None:
        """Pull requests died with the old connection: make new ones; resend what waits for
        a stream ack now rather than at its timeout."""
        for group in self._groups.values():
            for lane in group.lanes:
                lane.requests.clear()
                lane.outstanding = 0
            self._arm(group)
        for pub in self._pending.values():
            pub.sent = 0.0
        now = time.monotonic()
        for node in self._seen_at:
            self._seen_at[node] = now  # heard again from the next heartbeat on

    # -- receiving -----------------------------------------------------------------------------

    def _arm(self, group: _Group) -> None:
        """Ask for more messages while this group holds fewer than ``credit``, CRITICAL's
        lane first. Nothing while a full mailbox makes it wait."""
        if not group.active or group.waiting is not None or self._closed or self._nc is None:
            return
        lanes = group.lanes
        room = self.credit - len(group.held) - len(group.parked)
        room -= sum(lane.outstanding for lane in lanes)
        half = self.batch // 2
        now = time.monotonic()
        # An idle lane's long poll holds its request's credit: each lane asks for at most its
        # share of the room, so CRITICAL (asked first) cannot starve NORMAL of credit.
        share = max(1, min(self.batch, self.credit // len(lanes)))
        for lane in lanes:
            if room <= 0:
                break
            if lane.outstanding > min(half, share // 2):
                continue
            n = min(share - lane.outstanding, room)
            if n <= 0:
                continue
            rid = next(self._req_ids)
            lane.requests[rid] = [n, now + _PULL_EXPIRES + 2.0]
            lane.outstanding += n
            room -= n
            request = b'{"batch":%d,"expires":%d}' % (n, int(_PULL_EXPIRES * 1e9))
            self._out.append(
                (lane.api, f"{self._pull_prefix}.{group.gid}.{lane.index}.{rid}", request, None)
            )
        self._schedule_write()

    async def _on_pull(self, msg: Msg) -> None:
        ack = msg.reply
        if not ack:
            # A status on the request's own inbox: it expired, found nothing, was refused.
            tokens = msg.subject.rsplit(".", 3)
            group = self._by_gid.get(int(tokens[1]))
            if group is not None:
                lane = group.lanes[int(tokens[2])]
                request = lane.requests.pop(int(tokens[3]), None)
                if request is not None:
                    lane.outstanding -= int(request[0])
                self._arm(group)
            return
        # A message keeps its own subject; its ack subject names the consumer. The server
        # serves a consumer's waiting requests in order, so it fills the oldest one.
        found = self._by_consumer.get(_consumer_of(ack))
        if found is None:
            self._nak(ack, 0)  # not ours any more: straight to another member
            self._counts["released"] += 1
            return
        group, lane = found
        for rid, request in lane.requests.items():
            request[0] -= 1
            lane.outstanding -= 1
            if request[0] <= 0:
                del lane.requests[rid]
            break
        if not group.active:
            group.deferred.append(ack)  # given back once the group's inbox is gone
            return
        if group.waiting is not None:
            group.parked.append(msg)
            return
        self._take(group, msg)
        self._arm(group)

    def _take(self, group: _Group, msg: Msg) -> None:
        """Offer one pulled message to the group's subscription."""
        ack = msg.reply
        try:
            wire = _decode_wire(msg.data)
            if not 0 <= wire.priority <= 2:
                raise ValueError(f"priority {wire.priority!r} out of range")
        except (msgspec.DecodeError, ValueError) as exc:
            self._counts["malformed"] += 1
            _log.warning(
                "NATS node %s: dropped a malformed message on %s: %s", self.node, msg.subject, exc
            )
            self._send(ack, _TERM)
            return
        name = group.name
        if (wire.skip is not None and name in wire.skip) or (
            wire.only is not None and name not in wire.only
        ):
            self._counts["skipped"] += 1
            self._send(ack, _ACK)
            return
        if wire.only is None and (wire.id in group.done or wire.id in group.done_old):
            self._counts["duplicates_dropped"] += 1
            self._send(ack, _ACK)
            return
        names = self._local_names.get(wire.topic)
        if names is None:
            names = self._local_names[wire.topic] = frozenset(self._local_index.resolve(wire.topic))
        if name not in names:  # the consumer filter is a superset of the pattern
            self._counts["skipped"] += 1
            self._send(ack, _ACK)
            return
        env = self._envelope(wire)
        delivered = _delivered(ack)
        if delivered > 1:
            self._counts["redelivered"] += 1
        receipt = _Receipt(self, group, ack, delivered, env, msg.data, wire.reply)
        env.reply = receipt
        group.held[ack] = receipt
        self._counts["received"] += 1
        assert self._port is not None
        try:
            waiting = self._port.deliver(env, (name,))
        except BusClosedError:
            receipt.give_back()
            return
        except QueueFullError as exc:
            receipt.error = exc  # a full ``reject`` mailbox: redelivered after a backoff
            receipt.expect(0)
            receipt.arm()
            return
        except Exception as exc:
            _log.exception("NATS node %s: delivering %s failed", self.node, env.topic)
            receipt.error = exc
            receipt.expect(0)
            receipt.arm()
            return
        if waiting is None:
            receipt.arm()
            return
        assert self._loop is not None
        group.waiting = self._loop.create_task(self._unblock(group, waiting, receipt))

    async def _unblock(self, group: _Group, waiting: Awaitable[None], receipt: _Receipt) -> None:
        """A full ``block`` mailbox: wait for room, then offer what was parked meanwhile."""
        try:
            await waiting
        except QueueFullError as exc:
            receipt.error = exc
        except BusClosedError:
            receipt.give_back()
        finally:
            receipt.arm()
            group.waiting = None
        while group.parked and group.waiting is None and group.active:
            self._take(group, group.parked.popleft())
        self._arm(group)

    def _envelope(self, wire: _Wire) -> Envelope:
        return Envelope(
            wire.topic,
            wire.payload,
            wire.priority,
            wire.id,
            wire.session_id,
            wire.correlation_id,
            wire.causation_id,
            wire.trace,
            wire.created - self._mono_to_wall,
            wire.hops,
            wire.source,
        )

    def _finish(self, receipt: _Receipt) -> None:
        """The subscription is done with the message: tell the server."""
        group = receipt.group
        group.held.pop(receipt.ack, None)
        if receipt.released:
            # The bus is closing: stop pulling first, or the server hands the message
            # straight back to this node's own outstanding requests.
            group.deferred.append(receipt.ack)
            self._leave(group)
            if group.closing is not None and group.closing.done():
                self._give_back(group)
            return
        elif receipt.error is None:
            self._counts["acked"] += 1
            self._send(receipt.ack, _ACK)
            group.done.add(receipt.env.id)
            if len(group.done) >= _DEDUP_IDS:
                group.done_old = group.done
                group.done = set()
        elif receipt.delivered >= self.max_deliver:
            assert self._loop is not None
            task = self._loop.create_task(self._dead_letter(receipt))
            self._tasks.append(task)
            task.add_done_callback(self._tasks.remove)
        else:
            self._counts["naked"] += 1
            base, most = self.backoff
            self._nak(receipt.ack, min(most, base * 2 ** (receipt.delivered - 1)))
        self._arm(group)

    def _nak(self, ack: str, delay: float) -> None:
        body = b"-NAK" if delay <= 0 else b'-NAK {"delay":%d}' % int(delay * 1e9)
        self._send(ack, body)

    async def _dead_letter(self, receipt: _Receipt) -> None:
        """After ``max_deliver`` deliveries: to the DLQ stream (every publisher lists and
        redrives it there), then terminated here; a request's asker gets the error."""
        error = receipt.error
        assert error is not None
        wire = _decode_wire(receipt.data)
        text = " ".join(str(error).split())[:1000] or "(no message)"
        headers = {
            "Nats-Msg-Id": f"dlq.{wire.id}.{receipt.group.gid}.{receipt.group.name}",
            "Pantheon-Subscriber": receipt.group.name,
            "Pantheon-Deliveries": str(receipt.delivered),
            "Pantheon-Error-Type": type(error).__name__,
            "Pantheon-Error": text,
            "Pantheon-Node": self.node,
            "Pantheon-Subject": subject_of(self.team, wire.priority, wire.topic),
        }
        while not self._closed:
            try:
                await self._js.publish(
                    dlq_subject(self.team, wire.origin), receipt.data, headers=headers
                )
                break
            except Exception as exc:  # disconnected: the message stays held until it goes
                _log.warning("NATS node %s: DLQ publish failed, retrying: %s", self.node, exc)
                await asyncio.sleep(0.2)
        else:
            self._nak(receipt.ack, 0)
            return
        self._counts["dead_lettered"] += 1
        self._send(receipt.ack, _TERM)
        if receipt.reply_to is not None and not receipt.answered:
            receipt.answered = True
            self._answer(
                receipt.reply_to,
                _Answer(False, None, type(error).__name__, text, receipt.env.topic),
            )

    async def _on_dead(self, msg: Msg) -> None:
        """A message this node published went to the DLQ stream: a request waiting for it
        fails now rather than at its timeout. (It is not added to this bus's DLQ: the
        receiving bus lists the failure with its traceback, as on any transport, and the
        stream is where every publisher sees and redrives it.)"""
        headers = msg.headers or {}
        try:
            env = self._envelope(_decode_wire(msg.data))
        except msgspec.DecodeError:
            self._counts["malformed"] += 1
            return
        self._counts["dlq_received"] += 1
        fut = self._requests.pop(env.id, None)
        if fut is not None and not fut.done():
            fut.set_exception(
                RemoteHandlerError(
                    env.topic,
                    headers.get("Pantheon-Error-Type", "Exception"),
                    f"{headers.get('Pantheon-Error', '')} (after "
                    f"{headers.get('Pantheon-Deliveries', '?')} deliveries, last on node "
                    f"{headers.get('Pantheon-Node', '?')!r})",
                )
            )

    def _answer(self, reply_to: str, answer: _Answer) -> None:
        try:
            body = _encode(answer)
        except Exception as exc:
            body = _encode(
                _Answer(False, None, "EncodeError", f"reply is not msgpack-encodable: {exc}")
            )
        self._counts["replies_sent"] += 1
        self._send(reply_to, body)

    async def _on_answer(self, msg: Msg) -> None:
        fut = self._requests.pop(int(msg.subject.rsplit(".", 1)[1]), None)
        if fut is None or fut.done():
            return
        self._counts["replies_received"] += 1
        try:
            answer = _decode_answer(msg.data)
        except msgspec.DecodeError:
            self._counts["malformed"] += 1
            return
        if answer.ok:
            fut.set_result(answer.value)
        else:
            fut.set_exception(
                RemoteHandlerError(
                    answer.topic, answer.error_type or "Exception", answer.error or ""
                )
            )

    def _deactivate(self, group: _Group) -> None:
        """Stop pulling for ``group`` (unsubscribed, or the bus is closing); what it parked
        goes back once its requests are gone (see :meth:`_close_group`)."""
        self._leave(group)

    def _leave(self, group: _Group) -> None:
        if group.closing is not None or self._loop is None:
            return
        group.active = False
        group.closing = self._loop.create_task(self._close_group(group))

    async def _close_group(self, group: _Group) -> None:
        """End the group's pull requests on the server (its inbox unsubscribed: the server
        drops a request nobody listens to), then nak what it held and what was parked, with
        no delay: the server gives them to another member at once."""
        with contextlib.suppress(Exception):
            await group.sub.unsubscribe()
            await self._nc.flush(timeout=2)
        self._by_gid.pop(group.gid, None)
        for lane in group.lanes:
            if self._by_consumer.get(lane.consumer, (None,))[0] is group:
                del self._by_consumer[lane.consumer]
        while group.parked:
            group.deferred.append(group.parked.popleft().reply)
        self._give_back(group)

    def _give_back(self, group: _Group) -> None:
        for ack in group.deferred:
            self._nak(ack, 0)
            self._counts["released"] += 1
        group.deferred.clear()

    # -- directory -----------------------------------------------------------------------------

    async def _put_entry(self) -> None:
        entry = _NodeEntry(
            self.node,
            self._version,
            sorted(self._groups),
            socket.gethostname(),
            os.getpid(),
        )
        await self._kv.put(self.node, _encode(entry))

    async def _load_directory(self) -> None:
        try:
            keys = await self._kv.keys()
        except nats.js.errors.NoKeysError:
            return
        now = time.monotonic()
        for key in keys:
            if key == self.node:
                continue
            try:
                entry = await self._kv.get(key)
            except nats.js.errors.KeyNotFoundError:
                continue
            if entry.value:
                node = _decode_node(entry.value)
                self._others[key] = node
                self._seen_at[key] = now
                self._send(sync_subject(self.team, key), _encode(_SyncAck(self.node, node.version)))
        self._directory_changed()

    async def _on_directory(self, msg: Msg) -> None:
        key = msg.subject[len(self._kv_prefix) :]
        if key == self.node:
            return
        op = (msg.headers or {}).get("KV-Operation")
        if op in ("DEL", "PURGE"):
            if key in self._others:
                self._forget_node(key)
                self._directory_changed()
            return
        try:
            entry = _decode_node(msg.data)
        except msgspec.DecodeError:
            self._counts["malformed"] += 1
            return
        self._seen_at[key] = time.monotonic()
        old = self._others.get(key)
        self._others[key] = entry
        if old is None or old.version != entry.version or old.subs != entry.subs:
            self._directory_changed()
            self._send(sync_subject(self.team, key), _encode(_SyncAck(self.node, entry.version)))

    def _forget_node(self, node: str) -> None:
        self._others.pop(node, None)
        self._seen_at.pop(node, None)
        self._synced.pop(node, None)

    def _directory_changed(self) -> None:
        index: GlobIndex[tuple[str, str]] = GlobIndex()
        for pair in {tuple(p) for e in self._others.values() for p in e.subs}:
            index.add(pair[1], (pair[0], pair[1]))
        self._remote_index = index
        self._routes.clear()
        wake(self._sync_waiters)
        if self.on_change is not None:
            self.on_change()

    async def _on_sync(self, msg: Msg) -> None:
        try:
            ack = _decode_sync(msg.data)
        except msgspec.DecodeError:
            self._counts["malformed"] += 1
            return
        if ack.version > self._synced.get(ack.node, 0):
            self._synced[ack.node] = ack.version
        wake(self._sync_waiters)

    def _route(self, topic: str) -> _Route:
        local = set(self._local_index.resolve(topic))
        groups = sorted({g for g in self._remote_index.resolve(topic) if g[0] not in local})
        if groups:
            subjects = tuple(subject_of(self.team, lane, topic) for lane in range(len(LANES)))
            tracked = [[consumer_name(n, p, lane) for n, p in groups] for lane in range(len(LANES))]
        else:
            subjects = ("", "", "")
            tracked = [[], [], []]
        route = _Route(bool(groups), sorted(local) or None, subjects, tracked)
        self._routes[topic] = route
        return route

    # -- helpers -------------------------------------------------------------------------------

    async def _wait(
        self, waiters: list[asyncio.Future[None]] | deque[asyncio.Future[None]]
    ) -> None:
        assert self._loop is not None
        fut = self._loop.create_future()
        waiters.append(fut)
        await fut

    @staticmethod
    def _wake_one(waiters: deque[asyncio.Future[None]]) -> None:
        while waiters:
            fut = waiters.popleft()
            if not fut.done():
                fut.set_result(None)
                return


class _Pending:
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


class _Route:
    """Where a topic's messages go from here: whether any remote group takes them, the
    local groups the publisher served (``skip``), the subject per lane and the remote
    consumers per lane whose ack floor ``flush`` follows."""

    __slots__ = ("remote", "skip", "subjects", "tracked")

    def __init__(
        self,
        remote: bool,
        skip: list[str] | None,
        subjects: tuple[str, ...],
        tracked: list[list[str]],
    ) -> None:
        self.remote = remote
        self.skip = skip
        self.subjects = subjects
        self.tracked = tracked


def _consumer_of(ack: str) -> str:
    """The consumer named in a JetStream ack subject."""
    tokens = ack.split(".")
    return tokens[3] if len(tokens) == 9 else tokens[5]


def _delivered(ack: str) -> int:
    """The delivery count in a JetStream ack subject (``$JS.ACK.<stream>.<consumer>.<n>...``
    or, with a domain and account hash, two tokens later)."""
    tokens = ack.split(".")
    return int(tokens[4] if len(tokens) == 9 else tokens[6])
