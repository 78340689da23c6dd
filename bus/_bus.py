"""The bus: routing, mailboxes, workers, backpressure, breakers, retries, dead letters.

Hot path, and why it is shaped this way (the budget is about 1.5 µs per message):

* ``emit`` builds one Envelope (a C-built msgspec Struct), finds the topic's route in a dict
  (resolved once per topic by :class:`~bus._topics.GlobIndex`, then cached), and appends the
  envelope to each matching subscription's per-priority deque. No task, no lock, no copy.
* Each subscription has ``concurrency`` long-lived worker tasks. A worker pops the highest
  priority message, awaits the handler, and bumps integer counters and histogram slots
  inline. An idle worker parks on a future that the next append resolves.
* The only per-message allocations are the Envelope and, when a worker sleeps, its wake-up
  future; everything else is preallocated.

Accounting invariant, per subscription: every message accepted into a mailbox
(``published``) ends as exactly one of ``delivered``, ``dead_lettered`` or ``shed``, and the
last two are listed in the DLQ with their reason. Messages a filter or sample declines are
counted in ``filtered`` and were never published to that subscription; a ``reject`` or a
``block`` that timed out raises :class:`QueueFullError` to the publisher and counts in
``rejected``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any, NoReturn, Protocol, TypedDict, TypeVar, Unpack, cast, overload

from bus._breaker import CLOSED, HALF_OPEN, CircuitBreaker
from bus._clock import Clock, SystemClock
from bus._config import (
    DEFAULT_BLOCK_TIMEOUT,
    DEFAULT_BREAKER,
    DEFAULT_MAX_QUEUE,
    DEFAULT_PUBLISHER_BREAKER,
    NO_RETRY,
    BreakerPolicy,
    Overflow,
    Priority,
    Retry,
)
from bus._dlq import DEFAULT_DLQ_SIZE, DeadLetter, DeadLetterQueue
from bus._envelope import Envelope, next_id
from bus._errors import (
    BusClosedError,
    CircuitOpenError,
    EncodeError,
    NoRouteError,
    QueueFullError,
    RequestTimeout,
)
from bus._metrics import (
    BusStats,
    EdgeStats,
    Histogram,
    SubscriberStats,
    TopicStats,
)
from bus._topics import GlobIndex, matches, validate_pattern
from bus._transport import BusPort, InProcessTransport, Receipt, Transport

__all__ = [
    "DEFAULT_ROUTE_CACHE",
    "UNSAMPLED",
    "Bus",
    "DeliveryListener",
    "Handler",
    "Subscription",
    "Tracer",
    "current_envelope",
    "current_subscription",
    "is_sampled",
]

Handler = Callable[[Envelope], Awaitable[Any]]
DeliveryListener = Callable[[str, Envelope, int, int, str], None]
H = TypeVar("H", bound=Callable[..., Any])


class _OnOptions(TypedDict, total=False):
    """The keyword options of :meth:`Bus.on`, for its overloads (defaults are on ``on``)."""

    name: str | None
    concurrency: int
    max_queue: int
    overflow: Overflow
    block_timeout: float
    filter: Callable[[Any], bool] | None
    sample_rate: float
    retry: Retry
    breaker: BreakerPolicy | None


#: Distinct topics whose routes are cached. Past this the oldest route is dropped (its
#: per-topic count is folded into the totals first), so high-cardinality topics cost a
#: bounded amount of memory.
DEFAULT_ROUTE_CACHE = 10_000
#: Per-topic publish counters kept in the snapshot; the rest are summed under ``"<other>"``.
MAX_TOPIC_STATS = 10_000
#: A worker yields to the loop after this many back-to-back messages, so a subscriber whose
#: handler never suspends cannot starve the others.
_FAIRNESS_BATCH = 128
#: Each worker times every message it handles up to this many, then one in _TIME_SAMPLE
#: (always every message while a recorder listens). Counters are exact either way.
_TIME_ALL_UNTIL = 4096
_TIME_SAMPLE = 16
_SYSTEM_BREAKER_TOPIC = "system.breaker."
#: Remote sends ``emit_nowait`` may leave waiting for transport credit in background tasks;
#: past this it raises QueueFullError (``emit`` waits for credit instead).
MAX_BACKGROUND_SENDS = 1024

_monotonic_ns = time.monotonic_ns


def _cancelling() -> int:
    """Non-zero when this task is being cancelled, as opposed to a handler's own await
    raising CancelledError (e.g. it awaited a future someone else cancelled)."""
    task = asyncio.current_task()
    return task.cancelling() if task is not None else 0


class _Worker:
    """What a running handler knows about itself: emits read it to fill in causation."""

    __slots__ = ("env", "sub")

    def __init__(self, sub: Subscription) -> None:
        self.sub = sub
        self.env: Envelope | None = None


_current: contextvars.ContextVar[_Worker | None] = contextvars.ContextVar(
    "pantheon_bus_worker", default=None
)


def current_envelope() -> Envelope | None:
    """The envelope whose handler is running in this task, or ``None`` outside handlers."""
    worker = _current.get()
    return None if worker is None else worker.env


def current_subscription() -> str | None:
    """The name of the subscription whose handler is running in this task, or ``None``."""
    worker = _current.get()
    return None if worker is None else worker.sub.name


#: Last hex digit of a W3C ``traceparent`` whose ``sampled`` flag (bit 0) is set.
_SAMPLED_DIGITS = "13579bdf"
#: The trace context of a message whose root a tracer declined to sample: W3C flags ``00``
#: and no ids (making them would cost every unsampled root what skipping a span saves).
#: Descendants inherit it, and the bus recognises this very object by identity.
UNSAMPLED = "00-00000000000000000000000000000000-0000000000000000-00"


def is_sampled(trace: str | None) -> bool:
    """Whether a W3C ``traceparent`` carries the sampled flag (``None``: no trace context)."""
    return trace is not None and trace is not UNSAMPLED and trace[-1] in _SAMPLED_DIGITS


class Tracer(Protocol):
    """What the bus tells a tracer installed as ``bus.tracer`` (``None`` by default).

    The bus knows nothing of OpenTelemetry; ``pantheon.telemetry`` implements this with the
    SDK. The bus calls the tracer only for messages that need it, so an unsampled message
    costs an identity test and no call:

    * ``skip``: how many upcoming roots (envelopes with ``trace`` ``None``) the tracer has
      already declined. The bus stamps those with :data:`UNSAMPLED` itself, counting
      ``skip`` down, so declining a root costs no call either.
    * ``on_publish(env)`` for each other envelope this bus publishes whose ``trace`` is
      ``None`` (a root: the tracer decides sampling once and must set ``env.trace``; every
      descendant inherits it) or sampled. A sampled envelope arriving from another bus is not
      re-published: its process spans parent to the remote producer.
    * ``start_process(subscription, env)`` before a subscription handles a sampled envelope;
      whatever it returns goes to ``end_process(token, outcome, error)`` after, with the
      outcome the delivery listener gets (``delivered``, ``failed``, ``circuit_open``, or
      ``bus_closed`` when closing cancelled the handler) and the first exception raised.
      Both run in the worker's task, so the tracer may keep the current span in a context
      variable that emits inside the handler read.
    * ``span(name, attributes, kind)``: a context manager for a child of the current span,
      or ``None`` when there is no sampled span to be a child of (agents use it for their
      GenAI spans; ``kind`` is ``"internal"`` or ``"client"``).
    """

    skip: int

    def on_publish(self, env: Envelope) -> None: ...

    def start_process(self, subscription: str, env: Envelope) -> Any: ...

    def end_process(self, token: Any, outcome: str, error: BaseException | None) -> None: ...

    def span(
        self, name: str, attributes: dict[str, Any], kind: str = "internal"
    ) -> contextlib.AbstractContextManager[Any] | None: ...


class _Route:
    __slots__ = ("inbound", "published", "remote", "single", "subs")

    def __init__(
        self, subs: tuple[Subscription, ...], remote: bool, leaving: tuple[Subscription, ...]
    ) -> None:
        self.subs = subs
        self.remote = remote
        self.published = 0
        #: What a message from another bus may reach: ``subs``, and subscriptions that
        #: ``off()`` is removing, which other buses may still route to until they know.
        self.inbound = subs + leaving if leaving else subs
        #: The one subscription of a topic that has exactly one, with neither filter nor
        #: sampling (``plain`` never changes, and the route is rebuilt when subscriptions
        #: do): a message from another bus then goes straight to its mailbox.
        self.single = subs[0] if len(subs) == 1 and subs[0].plain and not leaving else None


class Subscription:
    """One handler on one pattern, with its own bounded mailbox, workers, breaker and stats."""

    __slots__ = (
        "block_timeout",
        "breaker",
        "concurrency",
        "dead_lettered",
        "delivered",
        "edges",
        "failures",
        "filter",
        "filtered",
        "handler",
        "handling",
        "idle",
        "in_flight",
        "max_queue",
        "name",
        "overflow",
        "pattern",
        "plain",
        "published",
        "putters",
        "queues",
        "rejected",
        "retries",
        "retry",
        "sample_acc",
        "sample_rate",
        "shed",
        "size",
        "workers",
    )

    def __init__(
        self,
        name: str,
        pattern: str,
        handler: Handler,
        *,
        concurrency: int,
        max_queue: int,
        overflow: Overflow,
        block_timeout: float,
        filter: Callable[[Any], bool] | None,
        sample_rate: float,
        retry: Retry,
        breaker: CircuitBreaker,
    ) -> None:
        if concurrency < 1:
            raise ValueError(f"subscription {name!r}: concurrency must be >= 1")
        if max_queue < 1:
            raise ValueError(f"subscription {name!r}: max_queue must be >= 1")
        if overflow not in ("block", "shed", "reject"):
            raise ValueError(
                f"subscription {name!r}: overflow must be 'block', 'shed' or 'reject', "
                f"got {overflow!r}"
            )
        if not 0.0 < sample_rate <= 1.0:
            raise ValueError(f"subscription {name!r}: sample_rate must be in (0, 1]")
        self.name = name
        self.pattern = pattern
        self.handler = handler
        self.concurrency = concurrency
        self.max_queue = max_queue
        self.overflow = overflow
        self.block_timeout = block_timeout
        self.filter = filter
        self.sample_rate = sample_rate
        self.sample_acc = 0.0
        self.retry = retry
        self.breaker = breaker
        # No filter and no sampling: emit may append without looking further.
        self.plain = filter is None and sample_rate == 1.0
        self.queues: tuple[deque[Envelope], deque[Envelope], deque[Envelope]] = (
            deque(),
            deque(),
            deque(),
        )
        self.size = 0
        self.idle: list[asyncio.Future[None]] = []
        self.putters: deque[asyncio.Future[None]] = deque()
        self.in_flight = 0
        self.published = self.delivered = self.dead_lettered = self.shed = 0
        self.rejected = self.filtered = self.failures = self.retries = 0
        self.handling = Histogram()
        self.edges: dict[str | None, Histogram] = {}
        self.workers: list[asyncio.Task[None]] = []

    def stats(self) -> SubscriberStats:
        wait = Histogram()
        for h in self.edges.values():
            wait.merge(h)
        return SubscriberStats(
            pattern=self.pattern,
            published=self.published,
            delivered=self.delivered,
            dead_lettered=self.dead_lettered,
            shed=self.shed,
            rejected=self.rejected,
            filtered=self.filtered,
            failures=self.failures,
            retries=self.retries,
            queued=self.size,
            in_flight=self.in_flight,
            max_queue=self.max_queue,
            breaker=self.breaker.state,
            breaker_trips=self.breaker.trips,
            queue_wait=wait.summary(),
            handling=self.handling.summary(),
        )


def _as_async(handler: Callable[[Envelope], Any]) -> Handler:
    call_method = getattr(type(handler), "__call__", None)  # noqa: B004 - async callables
    if inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(call_method):
        return handler

    async def call(env: Envelope) -> Any:
        result = handler(env)
        # A plain function may hand back a coroutine (``lambda env: agent.handle(env)``);
        # run it, or the work is silently dropped with a "never awaited" warning.
        if result is not None and inspect.isawaitable(result):
            result = await result
        return result

    return call


#: Stands in ``_dispatch``'s list of blocked subscriptions for "the transport had no credit
#: for this envelope": ``_wait_blocked`` awaits ``transport.send`` for it, so a slow remote
#: consumer slows ``emit`` exactly as a full local ``block`` mailbox does.
_REMOTE = cast(Subscription, object())


class Bus:
    """An asyncio event bus with per-subscriber mailboxes. Use as ``async with Bus() as bus``.

    ``session_id`` is stamped on every outside message (the runtime sets it per run);
    ``clock`` drives breakers and retry backoff (:class:`bus.testing.FakeClock` in tests);
    ``transport`` connects this bus to others (in-process and alone by default).
    """

    def __init__(
        self,
        *,
        transport: Transport | None = None,
        clock: Clock | None = None,
        session_id: str | None = None,
        dlq_size: int = DEFAULT_DLQ_SIZE,
        route_cache: int = DEFAULT_ROUTE_CACHE,
        publisher_breaker: BreakerPolicy | None = DEFAULT_PUBLISHER_BREAKER,
    ) -> None:
        self.transport: Transport = transport if transport is not None else InProcessTransport()
        if route_cache < 1:
            raise ValueError(f"route_cache must be >= 1, got {route_cache}")
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.session_id = session_id
        self.dlq = DeadLetterQueue(self._redeliver, dlq_size)
        self._index: GlobIndex[Subscription] = GlobIndex()
        self._subs: dict[str, Subscription] = {}
        self._leaving: dict[str, Subscription] = {}  # off() in progress (see _Route.inbound)
        # OrderedDict, not dict: evicting the oldest of a plain dict with next(iter()) scans
        # past every deleted slot at its front (2-10 µs per miss once the cache is full).
        self._routes: OrderedDict[str, _Route] = OrderedDict()
        self._route_cache = route_cache
        self._topic_counts: dict[str, int] = {}
        self._outstanding = 0
        self._drain_waiters: list[asyncio.Future[None]] = []
        # Remote sends waiting for transport credit (drain waits for them), and the
        # background tasks emit_nowait leaves them in.
        self._sending = 0
        self._send_tasks: set[asyncio.Task[None]] = set()
        # Workers of subscriptions their own handler removed, by the task that stops them.
        self._retiring: dict[asyncio.Task[None], asyncio.Task[None]] = {}
        self._publisher_policy = publisher_breaker
        self._publisher_breakers: dict[str, CircuitBreaker] = {}
        self._publisher_open: dict[str, CircuitBreaker] = {}
        self._running = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        #: Called with (breaker name, old state, new state, reason) on every transition, for
        #: recorders; the same change is also published as ``system.breaker.<name>``.
        self.breaker_listeners: list[Callable[[str, str, str, str], None]] = []
        #: Called with every envelope this bus publishes or receives, for recorders.
        self.publish_listeners: list[Callable[[Envelope], None]] = []
        #: Called after every handling with (subscriber, envelope, started_ns, ended_ns,
        #: outcome), outcome one of ``delivered``, ``failed``, ``circuit_open``. One slot, not
        #: a list: the worker loop reads it per message and an ``is None`` test is the cheapest.
        self.delivery_listener: DeliveryListener | None = None
        #: Stamped on every envelope this bus creates; the runtime puts its effect runner here
        #: so plain handlers reach it as ``env.context``.
        self.context: Any = None
        #: Spans for publishes and handlings (see :class:`Tracer`); ``None`` costs one test.
        self.tracer: Tracer | None = None

    # -- lifecycle -------------------------------------------------------------------------

    async def __aenter__(self) -> Bus:
        await self.start()
        return self

    async def __aexit__(self, exc_type: object, exc: object, tb: object) -> None:
        await self.aclose(drain=exc_type is None)

    async def start(self) -> None:
        if self._running:
            return
        if self._closed:
            raise BusClosedError("a closed bus cannot be restarted")
        self._loop = asyncio.get_running_loop()
        self._running = True
        self.transport.on_change = self._routes_changed
        try:
            await self.transport.start(BusPort(self._inbound, self._remote_dead_letter))
        except BaseException:
            self._running = False  # e.g. no broker: the bus did not start, and says why
            raise
        for sub in self._subs.values():
            self._start_workers(sub)
        self._advertise()

    async def aclose(self, *, drain: bool = True, timeout: float | None = 30.0) -> None:
        """Stop the bus. With ``drain`` it first waits (up to ``timeout``) for every queued
        message to finish; whatever is still queued afterwards is dead-lettered with reason
        ``bus_closed``, so closing never loses a message silently."""
        if self._closed:
            return
        if drain and self._running:
            with contextlib.suppress(TimeoutError):
                await self.drain(timeout=timeout)
        self._running = False
        self._closed = True
        workers = [t for sub in self._subs.values() for t in sub.workers]
        for retire, worker in list(self._retiring.items()):
            workers += (retire, worker)
        for task in workers:
            task.cancel()
        await asyncio.gather(*workers, return_exceptions=True)
        for sub in self._subs.values():
            sub.workers.clear()
            self._flush(sub, "bus_closed")
        self._routes_changed()  # folds per-topic counts into the totals, so stats() keeps them
        await self.transport.aclose()

    def _start_workers(self, sub: Subscription) -> None:
        assert self._loop is not None
        for i in range(sub.concurrency):
            task = self._loop.create_task(self._work(sub), name=f"bus:{sub.name}:{i}")
            sub.workers.append(task)

    def _flush(self, sub: Subscription, reason: str) -> None:
        for q in sub.queues:
            while q:
                env = q.popleft()
                sub.size -= 1
                self._outstanding -= 1
                sub.dead_lettered += 1
                self.dlq.add(env, sub.name, reason)
                self._release(env, BusClosedError(f"subscription {sub.name!r} closed"))
        for fut in sub.putters:
            if not fut.done():
                fut.set_exception(BusClosedError(f"subscription {sub.name!r} closed"))
        sub.putters.clear()
        self._wake_drainers()

    # -- subscriptions ---------------------------------------------------------------------

    @overload
    def on(
        self, pattern: str, handler: None = None, **options: Unpack[_OnOptions]
    ) -> Callable[[H], H]: ...

    @overload
    def on(self, pattern: str, handler: H, **options: Unpack[_OnOptions]) -> H: ...

    def on(
        self,
        pattern: str,
        handler: Callable[[Envelope], Any] | None = None,
        *,
        name: str | None = None,
        concurrency: int = 1,
        max_queue: int = DEFAULT_MAX_QUEUE,
        overflow: Overflow = "block",
        block_timeout: float = DEFAULT_BLOCK_TIMEOUT,
        filter: Callable[[Any], bool] | None = None,
        sample_rate: float = 1.0,
        retry: Retry = NO_RETRY,
        breaker: BreakerPolicy | None = DEFAULT_BREAKER,
    ) -> Any:
        """Subscribe ``handler`` to topics matching the token ``pattern``.

        ``*`` is exactly one dot-separated token (``order.*.paid``) and ``>`` as the last token
        one or more (``order.>``; ``>`` alone is every topic), as in NATS. A wildcard inside a
        token (``order.*-paid``, ``order*``), ``*`` alone and ``?``/``[...]`` are refused here
        with a ``ValueError`` naming the spelling to use: tokens are matched whole so the index
        costs a topic's depth, not the number of patterns (see :mod:`bus._topics`).

        Works as a decorator (``@bus.on("a.*")``) or a call; returns the handler either way.
        ``name`` identifies the subscription in stats, the DLQ and breakers (default: the
        handler's qualified name) and must be unique on this bus. ``breaker=None`` turns the
        consumer breaker off. A handler answers a :meth:`request` by returning a value other
        than ``None``.
        """
        validate_pattern(pattern)

        def register(fn: H) -> H:
            sub_name = name or getattr(fn, "__qualname__", None) or repr(fn)
            if sub_name in self._subs:
                raise ValueError(f"subscription name {sub_name!r} is already used on this bus")
            policy = (
                breaker
                if breaker is not None
                else BreakerPolicy(consecutive_failures=2**62, min_calls=2**62)
            )
            sub = Subscription(
                sub_name,
                pattern,
                _as_async(fn),
                concurrency=concurrency,
                max_queue=max_queue,
                overflow=overflow,
                block_timeout=block_timeout,
                filter=filter,
                sample_rate=sample_rate,
                retry=retry,
                breaker=CircuitBreaker(sub_name, policy, self.clock, self._breaker_changed),
            )
            self._subs[sub_name] = sub
            self._index.add(pattern, sub)
            self._routes_changed()
            if self._running:
                self._start_workers(sub)
                self._advertise()
            return fn

        if handler is None:
            return register
        return register(handler)

    async def off(self, name: str) -> None:
        """Unsubscribe: no new messages; queued ones are handled first, then workers stop.

        Other buses learn of it only eventually, so until the transport's ``sync`` says
        they all have, what they still route here is handled as before; anything that
        arrives later still is dead-lettered as ``unsubscribed``, never dropped."""
        sub = self._subs.get(name)
        if sub is None or name in self._leaving:
            raise KeyError(f"no subscription named {name!r}")
        # Called from one of this subscription's own handlers, off() runs inside that worker:
        # its message stays in flight until off() returns, so waiting for it, or cancelling
        # and awaiting its task, would never end (and would hang drain()). That worker is
        # left to finish its message and is stopped once it is idle (_retire).
        own = asyncio.current_task()
        if own not in sub.workers:
            own = None
        self._index.remove(sub.pattern, sub)
        self._leaving[name] = sub
        self._routes_changed()
        self._advertise()
        try:
            if self._running:
                await self.transport.sync()
            while sub.size or sub.in_flight > (own is not None):  # noqa: ASYNC110 - rare path
                await asyncio.sleep(0.001)
        finally:
            del self._leaving[name]
            self._routes_changed()
        others = [task for task in sub.workers if task is not own]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        sub.workers.clear()
        del self._subs[name]
        if own is not None:
            self._retire(sub, cast("asyncio.Task[None]", own))

    def _retire(self, sub: Subscription, worker: asyncio.Task[None]) -> None:
        """Stop ``worker``, whose handler unsubscribed its own subscription, once it has
        finished that message. aclose() stops it sooner if the bus closes first."""

        async def retire() -> None:
            try:
                while sub.in_flight:  # noqa: ASYNC110 - rare path, no waiter to wire
                    await asyncio.sleep(0.001)
                worker.cancel()
                await asyncio.gather(worker, return_exceptions=True)
            finally:
                self._retiring.pop(task, None)

        assert self._loop is not None
        task = self._loop.create_task(retire(), name=f"bus:{sub.name}:retire")
        self._retiring[task] = worker

    def subscriptions(self) -> dict[str, Subscription]:
        return dict(self._subs)

    def _advertise(self) -> None:
        # From the index, not ``_subs``: off() advertises before its subscription is gone.
        # A generator, not a set: building one here made each runtime subscribe O(n).
        if self._running:
            self.transport.advertise((s.name, s.pattern) for s in self._index.items())

    def _routes_changed(self) -> None:
        for topic, route in self._routes.items():
            self._fold_topic(topic, route.published)
        self._routes.clear()

    def _fold_topic(self, topic: str, count: int) -> None:
        if not count:
            return
        counts = self._topic_counts
        if topic in counts or len(counts) < MAX_TOPIC_STATS:
            counts[topic] = counts.get(topic, 0) + count
        else:
            counts["<other>"] = counts.get("<other>", 0) + count

    def _route(self, topic: str) -> _Route:
        if not self._running:
            raise BusClosedError(
                "bus is not running: use `async with Bus() as bus` or `await bus.start()`"
            )
        leaving = self._leaving
        route = _Route(
            tuple(self._index.resolve(topic)),
            self.transport.has_remote(topic),
            tuple(s for s in leaving.values() if matches(s.pattern, topic)) if leaving else (),
        )
        routes = self._routes
        if len(routes) >= self._route_cache:
            old_topic, old_route = routes.popitem(last=False)
            self._fold_topic(old_topic, old_route.published)
        routes[topic] = route
        return route

    # -- publishing ------------------------------------------------------------------------

    def _envelope(
        self, topic: str, payload: Any, priority: int, cause: Envelope | None
    ) -> Envelope:
        # Before anything is counted or recorded: 3 would raise IndexError in a mailbox after
        # the publish was counted, and -1 would be filed silently as NORMAL. Every emit path
        # builds its envelope here; a Priority member (nearly every call) is valid by type,
        # which costs one identity test, a third of the range comparison plain ints get.
        if priority.__class__ is not Priority and not 0 <= priority <= 2:
            raise ValueError(f"priority must be 0, 1 or 2 (bus.Priority), got {priority!r}")
        worker = _current.get()
        if cause is None and worker is not None:
            cause = worker.env
        if cause is None:
            id_ = next_id()
            return Envelope(
                topic, payload, priority, id_, self.session_id, id_, None, None,
                _monotonic_ns(), 0, None, self.context,
            )  # fmt: skip
        return Envelope(
            topic, payload, priority, next_id(), cause.session_id, cause.correlation_id,
            cause.id, cause.trace, _monotonic_ns(), cause.hops + 1,
            worker.sub.name if worker is not None else cause.source, self.context,
        )  # fmt: skip

    async def emit(
        self,
        topic: str,
        payload: Any = None,
        priority: int = Priority.NORMAL,
        *,
        cause: Envelope | None = None,
    ) -> Envelope:
        """Publish to every subscription matching ``topic``; returns the envelope.

        Waits only when a ``block`` subscriber's mailbox is full (up to its
        ``block_timeout``). Inside a handler the new message is caused by the one being
        handled; elsewhere pass ``cause=`` to link it.
        """
        if self._publisher_open:
            self._check_publisher(topic)
        env = self._envelope(topic, payload, priority, cause)
        blocked = self._dispatch(env)
        if blocked:
            await self._wait_blocked(env, blocked)
        return env

    def emit_nowait(
        self,
        topic: str,
        payload: Any = None,
        priority: int = Priority.NORMAL,
        *,
        cause: Envelope | None = None,
    ) -> Envelope:
        """Like :meth:`emit` but never waits: a full ``block`` mailbox raises
        :class:`QueueFullError` at once, as ``reject`` does. A message for remote
        subscribers that the transport has no credit for yet is sent by a background task
        (at most ``MAX_BACKGROUND_SENDS`` at once; past that, QueueFullError)."""
        if self._publisher_open:
            self._check_publisher(topic)
        env = self._envelope(topic, payload, priority, cause)
        blocked = self._dispatch(env)
        if blocked:
            self._not_waiting(env, blocked)
        return env

    def _not_waiting(self, env: Envelope, blocked: list[Subscription]) -> None:
        """What ``emit_nowait`` does with mailboxes that would make it wait: a remote send
        goes to a background task, a full local mailbox refuses (QueueFullError)."""
        if _REMOTE in blocked:
            blocked = [sub for sub in blocked if sub is not _REMOTE]
            self._send_later(env)
        if blocked:
            self._refuse(env, blocked)

    async def emit_many(
        self,
        topic: str,
        payloads: Iterable[Any],
        priority: int = Priority.NORMAL,
        *,
        cause: Envelope | None = None,
    ) -> int:
        """Publish several payloads on one topic; returns the count.

        Cheaper per message than a loop of :meth:`emit` (no per-message coroutine) with the
        same backpressure: it waits whenever a mailbox is full.
        """
        n = 0
        for payload in payloads:
            if self._publisher_open:
                self._check_publisher(topic)
            env = self._envelope(topic, payload, priority, cause)
            blocked = self._dispatch(env)
            if blocked:
                await self._wait_blocked(env, blocked)
            n += 1
        return n

    async def publish(self, env: Envelope) -> None:
        """Publish an envelope built elsewhere (a replay, a redrive) as it is."""
        if not 0 <= env.priority <= 2:
            raise ValueError(f"priority must be 0, 1 or 2 (bus.Priority), got {env.priority!r}")
        blocked = self._dispatch(env)
        if blocked:
            await self._wait_blocked(env, blocked)

    def _dispatch(
        self,
        env: Envelope,
        only: tuple[Subscription, ...] | None = None,
        *,
        redrive: bool = False,
    ) -> list[Subscription] | None:
        """Offer ``env`` to its subscribers; return those whose mailbox was full and block.

        ``only`` limits delivery to those of the topic's subscriptions. A ``redrive`` is not
        sent to other buses and skips filters and sampling: the message was chosen once
        already, and declining it now would lose it (it left the DLQ as ``filtered``).
        ``_REMOTE`` in the result: the transport had no credit. Messages from other buses
        take :meth:`_inbound` instead."""
        topic = env.topic
        route = self._routes.get(topic)
        if route is None:
            route = self._route(topic)
        route.published += 1
        tracer = self.tracer
        if tracer is not None:
            trace = env.trace
            # A root gets its sampling decision here, once; a sampled message gets a publish
            # span (one that arrived from another bus does not: see _inbound).
            if trace is None:
                if tracer.skip:
                    tracer.skip -= 1
                    env.trace = UNSAMPLED
                else:
                    tracer.on_publish(env)
            elif trace is not UNSAMPLED and trace[-1] in _SAMPLED_DIGITS:
                tracer.on_publish(env)
        if self.publish_listeners:
            for listener in self.publish_listeners:
                listener(env)
        blocked = None
        rejected = None
        for sub in route.subs if only is None else only:
            if sub.plain and sub.size < sub.max_queue:
                # _enqueue, inlined: this is the path nearly every delivery takes.
                sub.queues[env.priority].append(env)
                sub.size += 1
                sub.published += 1
                self._outstanding += 1
                if sub.idle:
                    fut = sub.idle.pop()
                    if not fut.done():
                        fut.set_result(None)
                continue
            verdict = self._admit(sub, env) if redrive else self._offer(sub, env)
            if verdict == "block":
                if blocked is None:
                    blocked = []
                blocked.append(sub)
            elif verdict == "reject":
                if rejected is None:
                    rejected = []
                rejected.append(sub)
        if route.remote and not redrive and not self.transport.try_send(env):
            if blocked is None:
                blocked = []
            blocked.append(_REMOTE)
        if rejected:
            if not blocked:
                self._refuse(env, rejected)
            # Raising now would skip the wait for the ``block`` subscribers and lose their
            # copy silently: _wait_blocked refuses these after it, with any that time out.
            blocked.extend(rejected)
        if self._publisher_breakers and not blocked:
            self._publisher_succeeded(topic)
        return blocked

    def _offer(self, sub: Subscription, env: Envelope) -> str | None:
        """The slow path: filter, sample, overflow. Returns None when settled here."""
        if sub.filter is not None:
            try:
                keep = sub.filter(env.payload)
            except Exception as exc:
                sub.published += 1
                sub.dead_lettered += 1
                self.dlq.add(env, sub.name, "filter_error", exc, traceback.format_exc())
                self._release(env, exc)
                return None
            if not keep:
                sub.filtered += 1
                return None
        if sub.sample_rate < 1.0:
            # Deterministic sampling: exactly ``rate`` of messages, evenly spread, and the same
            # ones again on replay (a random draw would make replays diverge). The tolerance
            # absorbs binary rounding: ten additions of 0.1 sum to 0.9999999999999999.
            sub.sample_acc += sub.sample_rate
            if sub.sample_acc < 1.0 - 1e-9:
                sub.filtered += 1
                return None
            sub.sample_acc -= 1.0
        return self._admit(sub, env)

    def _admit(self, sub: Subscription, env: Envelope) -> str | None:
        """Overflow, then the mailbox: :meth:`_offer` past the filter and the sample."""
        if sub.size >= sub.max_queue:
            if sub.overflow == "shed" and self._shed(sub, env):
                return None
            if sub.overflow == "reject":
                return "reject"
            return "block"
        self._enqueue(sub, env)
        return None

    def _enqueue(self, sub: Subscription, env: Envelope) -> None:
        sub.queues[env.priority].append(env)
        sub.size += 1
        sub.published += 1
        self._outstanding += 1
        if sub.idle:
            fut = sub.idle.pop()
            if not fut.done():
                fut.set_result(None)

    def _shed(self, sub: Subscription, env: Envelope) -> bool:
        """Make room by dropping the oldest message of the lowest waiting priority, or the new
        one if it is lower still. CRITICAL is never shed: returns False (block instead) when
        only CRITICAL messages compete for the room."""
        lowest = next((p for p in (2, 1) if sub.queues[p]), None)
        if env.priority > (lowest if lowest is not None else 0):
            sub.published += 1
            sub.shed += 1
            self.dlq.add(env, sub.name, "shed")
            self._release(env, QueueFullError(env.topic, [sub.name]))
            return True
        if lowest is None:
            return False
        victim = sub.queues[lowest].popleft()
        sub.size -= 1
        sub.shed += 1
        self._outstanding -= 1
        self.dlq.add(victim, sub.name, "shed")
        self._release(victim, QueueFullError(victim.topic, [sub.name]))
        self._enqueue(sub, env)
        return True

    def _refuse(self, env: Envelope, subs: list[Subscription]) -> NoReturn:
        for sub in subs:
            sub.rejected += 1
        self._publisher_failed(env.topic)
        raise QueueFullError(env.topic, [s.name for s in subs])

    async def _wait_blocked(self, env: Envelope, subs: list[Subscription]) -> None:
        assert self._loop is not None
        late = []
        for sub in subs:
            if sub is _REMOTE:
                await self._send_remote(env)
                continue
            if sub.overflow == "reject":  # refused already in _dispatch
                late.append(sub)
                continue
            deadline = self._loop.time() + sub.block_timeout
            while sub.size >= sub.max_queue:
                fut = self._loop.create_future()
                sub.putters.append(fut)
                remaining = deadline - self._loop.time()
                try:
                    async with asyncio.timeout(max(remaining, 0)):
                        await fut
                except TimeoutError:
                    if fut in sub.putters:
                        sub.putters.remove(fut)
                    if sub.size >= sub.max_queue:
                        late.append(sub)
                        break
            else:
                self._enqueue(sub, env)
        if late:
            self._refuse(env, late)
        elif self._publisher_breakers:
            self._publisher_succeeded(env.topic)

    def _check_publisher(self, topic: str) -> None:
        breaker = self._publisher_open.get(topic)
        if breaker is not None:
            breaker.acquire()

    def _publisher_succeeded(self, topic: str) -> None:
        breaker = self._publisher_breakers.get(topic)
        if breaker is not None and breaker.dirty:
            breaker.record_success()

    def _publisher_failed(self, topic: str) -> None:
        # The bus's own breaker reports get no publisher breaker. A refused report feeding
        # one would trip it, whose report is refused in turn (on an ever longer topic, until
        # RecursionError under ``consecutive_failures=1``); and an open one would fail the
        # reports fast, losing them uncounted. Refused, a report counts in ``rejected``.
        if self._publisher_policy is None or topic.startswith(_SYSTEM_BREAKER_TOPIC):
            return
        breaker = self._publisher_breakers.get(topic)
        if breaker is None:
            if len(self._publisher_breakers) >= MAX_TOPIC_STATS:
                return
            breaker = CircuitBreaker(
                f"publish:{topic}", self._publisher_policy, self.clock, self._breaker_changed
            )
            self._publisher_breakers[topic] = breaker
        breaker.record_failure()

    def _inbound(self, env: Envelope, names: Collection[str] | None) -> Awaitable[None] | None:
        """A message from another bus: deliver locally only, never forward it back.

        Returns an awaitable only when a ``block`` mailbox is full, so a transport can
        deliver a batch without a coroutine per message. When ``env.reply`` is a
        :class:`Receipt`, tells it how many subscriptions took the message (each settles it
        once); counted from ``published``, which moves exactly when a mailbox takes it.

        :meth:`_dispatch` for a message that is delivered here only, written out because a
        receiving node runs it once per message: one route lookup, nothing for sending on
        (``try_send``, a sampled message's publish span), the receipt's count kept as the
        loop goes, and a topic with one plain subscription (``_Route.single``) takes a
        branch with no loop at all. It must offer, refuse and count exactly as
        ``_dispatch(env, names)`` would, minus the sending."""
        if not self._running:
            raise BusClosedError("bus is closed: it takes no more messages from other buses")
        if env.context is None:
            env.context = self.context
        topic = env.topic
        route = self._routes.get(topic)
        if route is None:
            route = self._route(topic)
        route.published += 1
        tracer = self.tracer
        if tracer is not None and env.trace is None:
            # A root from a bus without a tracer gets its sampling decision here. A traced
            # message gets no publish span: its process spans parent to the remote producer.
            if tracer.skip:
                tracer.skip -= 1
                env.trace = UNSAMPLED
            else:
                tracer.on_publish(env)
        if self.publish_listeners:
            for listener in self.publish_listeners:
                listener(env)
        sub = route.single
        if sub is not None and names is None and sub.size < sub.max_queue:
            # _enqueue, inlined: a receiving node's usual message takes only this branch.
            sub.queues[env.priority].append(env)
            sub.size += 1
            sub.published += 1
            self._outstanding += 1
            if sub.idle:
                fut = sub.idle.pop()
                if not fut.done():
                    fut.set_result(None)
            if self._publisher_breakers:
                self._publisher_succeeded(topic)
            receipt = env.reply
            if isinstance(receipt, Receipt):
                receipt.expect(1)
            return None
        took = 0
        blocked = None
        rejected = None
        matched = 0
        for sub in route.inbound:
            if names is not None and sub.name not in names:
                continue
            matched += 1
            if sub.plain and sub.size < sub.max_queue:
                sub.queues[env.priority].append(env)
                sub.size += 1
                sub.published += 1
                self._outstanding += 1
                took += 1
                if sub.idle:
                    fut = sub.idle.pop()
                    if not fut.done():
                        fut.set_result(None)
                continue
            mark = sub.published
            verdict = self._offer(sub, env)
            took += sub.published - mark
            if verdict == "block":
                if blocked is None:
                    blocked = []
                blocked.append(sub)
            elif verdict == "reject":
                if rejected is None:
                    rejected = []
                rejected.append(sub)
        if matched < (1 if names is None else len(names)):
            self._unsubscribed(env, names, route.inbound)
        receipt = env.reply
        if not isinstance(receipt, Receipt):
            receipt = None
        if rejected:
            if not blocked:
                try:
                    self._refuse(env, rejected)
                finally:
                    if receipt is not None:
                        receipt.expect(took)
            # As in _dispatch: _wait_blocked refuses these after the wait for the others.
            blocked.extend(rejected)
        if not blocked:
            if self._publisher_breakers:
                self._publisher_succeeded(topic)
            if receipt is not None:
                receipt.expect(took)
            return None
        if receipt is None:
            return self._wait_blocked(env, blocked)
        return self._inbound_blocked(env, blocked, receipt, took)

    async def _inbound_blocked(
        self, env: Envelope, blocked: list[Subscription], receipt: Receipt, took: int
    ) -> None:
        try:
            await self._wait_blocked(env, blocked)
        except QueueFullError as exc:
            receipt.expect(took + sum(1 for s in blocked if s.name not in exc.subscribers))
            raise
        receipt.expect(took + len(blocked))

    def _unsubscribed(
        self, env: Envelope, names: Collection[str] | None, here: tuple[Subscription, ...]
    ) -> None:
        """Another bus routed ``env`` to subscriptions of ours that are gone: it had not
        yet heard that ``off()`` removed them. Dead-lettered here, so nothing vanishes."""
        taken = {s.name for s in here}
        gone = ["<any>"] if names is None else [n for n in names if n not in taken]
        for name in gone:
            self.dlq.add(env, name, "unsubscribed")

    def _remote_dead_letter(
        self, env: Envelope, subscriber: str, reason: str, error: BaseException | None
    ) -> None:
        """A transport could not deliver ``env`` to the remote ``subscriber``: list it here,
        in the publishing bus's DLQ, so it shows in stats and the session like any other."""
        self.dlq.add(env, subscriber, reason, error)

    async def _send_remote(self, env: Envelope) -> None:
        """Send to remote subscribers, waiting for credit; drain waits for this."""
        self._sending += 1
        try:
            await self.transport.send(env)
        finally:
            self._sending -= 1
            if not self._sending and self._drain_waiters:
                self._wake_drainers()

    def _send_later(self, env: Envelope) -> None:
        if len(self._send_tasks) >= MAX_BACKGROUND_SENDS:
            raise QueueFullError(env.topic, ["<remote>"])
        assert self._loop is not None
        task = self._loop.create_task(self._send_background(env))
        self._send_tasks.add(task)
        task.add_done_callback(self._send_tasks.discard)

    async def _send_background(self, env: Envelope) -> None:
        try:
            await self._send_remote(env)
        except Exception as exc:
            # Nobody awaits this task: the message goes to the DLQ rather than vanishing.
            reason = "encode_error" if isinstance(exc, EncodeError) else "transport_error"
            self.dlq.add(env, "<remote>", reason, exc, traceback.format_exc())

    # -- request / reply -------------------------------------------------------------------

    async def request(
        self,
        topic: str,
        payload: Any = None,
        *,
        timeout: float = 5.0,
        priority: int = Priority.HIGH,
        cause: Envelope | None = None,
    ) -> Any:
        """Publish and wait for the first subscriber to return a value other than ``None``.

        Raises :class:`NoRouteError` when nothing subscribes, :class:`RequestTimeout` after
        ``timeout`` seconds, or the handler's own exception when it failed for good.
        """
        if self._publisher_open:
            self._check_publisher(topic)
        route = self._routes.get(topic) or self._route(topic)
        if not route.subs and not route.remote:
            raise NoRouteError(f"no subscriber for request topic {topic!r}")
        assert self._loop is not None
        env = self._envelope(topic, payload, priority, cause)
        env.reply = fut = self._loop.create_future()
        blocked = self._dispatch(env)
        if blocked:
            await self._wait_blocked(env, blocked)
        try:
            async with asyncio.timeout(timeout):
                return await fut
        except TimeoutError:
            raise RequestTimeout(f"no reply to {topic!r} within {timeout}s") from None
        finally:
            if not fut.done():
                fut.cancel()

    # -- workers ---------------------------------------------------------------------------

    async def _work(self, sub: Subscription) -> None:
        worker = _Worker(sub)
        _current.set(worker)
        q0, q1, q2 = sub.queues
        handler = sub.handler
        breaker = sub.breaker
        idle = sub.idle
        now = _monotonic_ns
        loop = asyncio.get_running_loop()
        batch = seen = 0
        start = 0
        while True:
            if q0:
                env = q0.popleft()
            elif q1:
                env = q1.popleft()
            elif q2:
                env = q2.popleft()
            else:
                batch = 0
                fut = loop.create_future()
                idle.append(fut)
                await fut
                continue
            sub.size -= 1
            if sub.putters:
                self._wake_putter(sub)
            sub.in_flight += 1
            worker.env = env
            seen += 1
            # Histograms take every message until they have a solid base, then one in
            # _TIME_SAMPLE: two clock reads and two bucket updates were half the worker's
            # cost. A recorder (delivery_listener) still gets every message's timestamps.
            sampled = seen <= _TIME_ALL_UNTIL or not seen % _TIME_SAMPLE
            listener = self.delivery_listener
            if sampled or listener is not None:
                start = now()
            span = None
            tracer = self.tracer
            if tracer is not None:
                trace = env.trace
                if trace is not UNSAMPLED and trace is not None and trace[-1] in _SAMPLED_DIGITS:
                    span = tracer.start_process(sub.name, env)
                    error: BaseException | None = None
            outcome = "delivered"
            if breaker.state is not CLOSED and not breaker.try_acquire():
                outcome = "circuit_open"
                sub.dead_lettered += 1
                self.dlq.add(
                    env,
                    sub.name,
                    "circuit_open",
                    CircuitOpenError(sub.name, breaker.retry_after()),
                )
                self._fail_request(env, CircuitOpenError(sub.name, breaker.retry_after()))
            else:
                try:
                    result = await handler(env)
                except Exception as exc:
                    error = exc
                    outcome = await self._failed(sub, env, exc)
                except asyncio.CancelledError as exc:
                    if _cancelling():  # aclose cancelled this worker: account, then stop
                        self._abandon(sub, env)
                        if span is not None and tracer is not None:
                            tracer.end_process(span, "bus_closed", exc)
                        raise
                    # The handler's own await was cancelled: a failure like any other.
                    error = exc
                    outcome = await self._failed(sub, env, exc)
                else:
                    sub.delivered += 1
                    if breaker.dirty:
                        breaker.record_success()
                    reply = env.reply
                    if reply is not None:
                        # _answer, inlined: every remote message carries a receipt.
                        if isinstance(reply, Receipt):
                            reply.settle(result, None)
                        elif result is not None and not reply.done():
                            reply.set_result(result)
            if sampled or listener is not None:
                end = now()
                if sampled:
                    self._timed(sub, env, start, end - start)
                if listener is not None:
                    listener(sub.name, env, start, end, outcome)
            if span is not None and tracer is not None:
                tracer.end_process(span, outcome, error)
            sub.in_flight -= 1
            self._outstanding -= 1
            if not self._outstanding and self._drain_waiters:
                self._wake_drainers()
            batch += 1
            if batch == _FAIRNESS_BATCH:
                batch = 0
                await asyncio.sleep(0)

    @staticmethod
    def _timed(sub: Subscription, env: Envelope, start: int, took: int) -> None:
        """Record one sampled delivery: queue wait on its edge and handling time.

        Bucket arithmetic is inlined (see bus._metrics.bucket): under a recorder this runs
        for every message, and two calls per record cost as much as the rest of it."""
        hist = sub.edges.get(env.source)
        if hist is None:
            hist = sub.edges[env.source] = Histogram()
        for h, d in ((hist, start - env.created), (sub.handling, took)):
            if d < 16:
                h.counts[d if d > 0 else 0] += 1
            else:
                shift = d.bit_length() - 4
                slot = (shift << 3) + (d >> shift)
                h.counts[slot if slot < 511 else 511] += 1
            h.total += d
            if d > h.max:
                h.max = d

    async def _failed(self, sub: Subscription, env: Envelope, exc: BaseException) -> str:
        """Retry per the subscription's policy; dead-letter when it is exhausted.

        Returns the outcome: ``delivered`` when a retry succeeded, else ``failed``."""
        retry = sub.retry
        breaker = sub.breaker
        attempts = 1
        while True:
            sub.failures += 1
            tb = "".join(traceback.format_exception(exc))
            breaker.record_failure(sub.delivered)
            if attempts >= retry.attempts or breaker.state != CLOSED:
                break
            try:
                await self.clock.sleep(retry.delay(attempts))
            except asyncio.CancelledError:
                self._abandon(sub, env)
                raise
            attempts += 1
            sub.retries += 1
            try:
                result = await sub.handler(env)
            except Exception as again:
                exc = again
                continue
            except asyncio.CancelledError as again:
                if _cancelling():
                    self._abandon(sub, env)
                    raise
                exc = again
                continue
            sub.delivered += 1
            if breaker.dirty:
                breaker.record_success()
            if env.reply is not None:
                self._answer(env, result)
            return "delivered"
        sub.dead_lettered += 1
        self.dlq.add(env, sub.name, "failed", exc, tb, attempts)
        self._fail_request(env, exc)
        return "failed"

    def _abandon(self, sub: Subscription, env: Envelope) -> None:
        """The worker handling ``env`` was cancelled (the bus is closing): dead-letter it
        with reason ``bus_closed`` so closing never loses an in-flight message silently."""
        sub.in_flight -= 1
        sub.dead_lettered += 1
        self._outstanding -= 1
        if sub.breaker.state is HALF_OPEN:
            sub.breaker.release()  # a cancelled probe has no outcome: free its slot
        self.dlq.add(env, sub.name, "bus_closed")
        self._fail_request(env, BusClosedError(f"subscription {sub.name!r} closed"))
        if not self._outstanding and self._drain_waiters:
            self._wake_drainers()

    @staticmethod
    def _answer(env: Envelope, result: Any) -> None:
        """A handler returned: answer a local request, or settle a remote message's receipt."""
        reply = env.reply
        if isinstance(reply, Receipt):
            reply.settle(result, None)
        elif result is not None and not reply.done():
            reply.set_result(result)

    @staticmethod
    def _fail_request(env: Envelope, exc: BaseException) -> None:
        reply = env.reply
        if reply is None:
            return
        if isinstance(reply, Receipt):
            reply.settle(None, exc)
        elif not reply.done():
            reply.set_exception(exc)

    @staticmethod
    def _release(env: Envelope, exc: BaseException) -> None:
        """Dead-lettered without a handler run (shed, filter error, closing): a remote
        message's receipt must still be settled, or its sender waits for it forever."""
        if isinstance(env.reply, Receipt):
            env.reply.settle(None, exc)

    @staticmethod
    def _wake_putter(sub: Subscription) -> None:
        while sub.putters:
            fut = sub.putters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

    def _wake_drainers(self) -> None:
        waiters, self._drain_waiters = self._drain_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    # -- drain, DLQ, breakers, stats -------------------------------------------------------

    async def drain(self, timeout: float | None = None) -> None:
        """Wait until every accepted message, including those emitted while draining, has
        been delivered, dead-lettered or shed, here and, for messages sent to other buses,
        there (``transport.flush()``). Raises TimeoutError after ``timeout``."""
        if not self._running:
            return
        assert self._loop is not None
        async with asyncio.timeout(timeout):
            while True:
                while self._outstanding or self._sending:
                    fut = self._loop.create_future()
                    self._drain_waiters.append(fut)
                    await fut
                # Let handlers' follow-up work scheduled with call_soon settle too.
                await asyncio.sleep(0)
                if self._outstanding or self._sending:
                    continue
                # Remote receivers may answer (replies, follow-up messages) while we wait.
                await self.transport.flush()
                if not (self._outstanding or self._sending):
                    return

    async def _redeliver(self, entry: DeadLetter) -> bool:
        sub = self._subs.get(entry.subscriber)
        if sub is None or not self._running:
            return False
        # The dead letter already left the subscription's accounting; taking it back is a
        # new publish to that one subscription. Uncount it only once the mailbox took it: a
        # refusal (QueueFullError) leaves the entry listed, so it must stay counted.
        blocked = self._dispatch(entry.envelope, (sub,), redrive=True)
        if blocked:
            await self._wait_blocked(entry.envelope, blocked)
        sub.dead_lettered -= entry.reason != "shed"
        sub.shed -= entry.reason == "shed"
        sub.published -= 1
        return True

    def breaker(self, name: str) -> CircuitBreaker:
        """The consumer breaker of subscription ``name`` or the publisher breaker
        ``publish:<topic>``, for manual ``force_open()`` / ``reset()``."""
        if name.startswith("publish:"):
            return self._publisher_breakers[name.removeprefix("publish:")]
        return self._subs[name].breaker

    def breakers(self) -> dict[str, str]:
        """Every breaker's state by name: ``closed``, ``open`` or ``half_open``."""
        states = {name: sub.breaker.state for name, sub in self._subs.items()}
        for topic, breaker in self._publisher_breakers.items():
            states[f"publish:{topic}"] = breaker.state
        return states

    def _breaker_changed(self, breaker: CircuitBreaker, old: str, new: str, why: str) -> None:
        if breaker.name.startswith("publish:"):
            topic = breaker.name.removeprefix("publish:")
            if new == CLOSED:
                self._publisher_open.pop(topic, None)
            else:
                self._publisher_open[topic] = breaker
        for listener in self.breaker_listeners:
            listener(breaker.name, old, new, why)
        if self._running:
            payload = {
                "breaker": breaker.name,
                "from": old,
                "to": new,
                "reason": why,
                "trips": breaker.trips,
                "retry_after": breaker.retry_after(),
            }
            # A full system subscriber refuses per its own policy, and that is counted there
            # (``rejected``). No publisher breaker guards these topics (see _publisher_failed),
            # so a report is never failed fast nor feeds another report.
            with contextlib.suppress(QueueFullError):
                self._report(_SYSTEM_BREAKER_TOPIC + breaker.name, payload, breaker)

    def _report(self, topic: str, payload: dict[str, Any], breaker: CircuitBreaker) -> None:
        """Publish a breaker's report, as ``emit_nowait`` would, to every subscriber but the
        one whose breaker it is. A failing catch-all handler (``*``) fed its own reports
        would make each one a failing call, or a failing half-open probe: trip, report,
        trip, thousands of times a second, and a drain that never ends."""
        env = self._envelope(topic, payload, Priority.HIGH, None)
        route = self._routes.get(topic) or self._route(topic)
        own = self._subs.get(breaker.name)
        only = None
        if own is not None and own.breaker is breaker and own in route.subs:
            only = tuple(sub for sub in route.subs if sub is not own)
        blocked = self._dispatch(env, only)
        if blocked:
            self._not_waiting(env, blocked)

    def stats(self) -> BusStats:
        """Counters, latency summaries and depths of the whole bus, read at one instant."""
        topics = dict(self._topic_counts)
        for topic, route in self._routes.items():
            if route.published:
                topics[topic] = topics.get(topic, 0) + route.published
        edges = [
            EdgeStats(source=src or "<outside>", target=sub.name, queue_wait=h.summary())
            for sub in self._subs.values()
            for src, h in sub.edges.items()
        ]
        return BusStats(
            published=sum(topics.values()),
            topics={t: TopicStats(published=n) for t, n in topics.items()},
            subscribers={name: sub.stats() for name, sub in self._subs.items()},
            edges=edges,
            dlq_size=len(self.dlq),
            dlq_evicted=self.dlq.evicted,
            breakers=self.breakers(),
        )

    @property
    def outstanding(self) -> int:
        """Messages accepted and not yet delivered, dead-lettered or shed."""
        return self._outstanding
