"""The bus's public verbs: emit, publish, request, on, off, drain, aclose, observe.

The state lives elsewhere, each piece with the object that owns it: mailboxes and the one
``offer`` every message enters them by (:mod:`bus._subscription`), topic routes
(:mod:`bus._routing`), workers, retries and timing (:mod:`bus._worker`), observers and the
tracer (:mod:`bus._hooks`). What stays here is what a publisher does.

Hot path, and why it is shaped this way (the budget is about 1.5 µs per message):

* ``emit`` builds one Envelope (a C-built msgspec Struct), finds the topic's route in a dict
  (resolved once per topic by :class:`~bus._routing.Routes`, then cached), and offers the
  envelope to each matching subscription. No task, no lock, no copy.
* Observers cost one empty-tuple test per message unless some are attached; an unsampled
  message costs the tracer one identity test.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Collection, Iterable
from typing import Any, TypedDict, TypeVar, Unpack, cast, overload

from bus._breaker import CircuitBreaker
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
from bus._errors import BusClosedError, NoRouteError, RequestTimeout
from bus._hooks import (
    BusObserver,
    Hooks,
    ObserverHandle,
    Tracer,
)
from bus._metrics import BusStats, bus_stats
from bus._publishing import Dispatcher
from bus._routing import DEFAULT_ROUTE_CACHE, Route, Routes
from bus._sched import LoopScheduling
from bus._subscription import Ledger, Subscription, as_async
from bus._topics import validate_pattern
from bus._transport import BusPort, InProcessTransport, Transport
from bus._worker import current_handler, work

__all__ = ["Bus"]

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


_monotonic_ns = time.monotonic_ns


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
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.session_id = session_id
        self.dlq = DeadLetterQueue(self._redeliver, dlq_size)
        self._routes = Routes(route_cache, self.transport.has_remote, self.transport.fed_remotely)
        self._cache = self._routes.cache  # the hot path's one dict lookup
        self._subs: dict[str, Subscription] = {}
        self._gone_unlisted = 0  # unlisted sheds of subscriptions since removed
        self.dlq.unlisted_sheds = self._unlisted_sheds
        self._ledger = Ledger()
        self._hooks = Hooks(self._hooks_changed)
        # Workers of subscriptions their own handler removed, by the task that stops them.
        self._retiring: dict[asyncio.Task[None], asyncio.Task[None]] = {}
        self._out = Dispatcher(
            cache=self._cache,
            route=self._route,
            hooks=self._hooks,
            transport=self.transport,
            dlq=self.dlq,
            ledger=self._ledger,
            clock=self.clock,
            policy=publisher_breaker,
            on_change=self._breaker_changed,
            envelope=self._envelope,
        )
        # The hot path's calls, bound once.
        self._open = self._out.open
        self._dispatch = self._out.dispatch
        self._wait_blocked = self._out.wait
        self._running = False
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._sched: LoopScheduling | None = None  # from start: the loop thread's CPU waits
        #: Stamped on every envelope this bus creates; the runtime puts its effect runner here
        #: so plain handlers reach it as ``env.context``.
        self.context: Any = None

    # -- observers -------------------------------------------------------------------------

    def observe(self, observer: BusObserver | Tracer) -> ObserverHandle:
        """Attach ``observer`` (see :class:`~bus.BusObserver`); ``handle.close()`` detaches
        exactly it. Only the methods it defines are called, so the rest cost nothing."""
        return self._hooks.attach(observer)

    @property
    def tracer(self) -> Tracer | None:
        """The observing tracer, if any (agents open their GenAI spans through it)."""
        return self._hooks.tracer

    def _hooks_changed(self, hooks: Hooks) -> None:
        self.dlq.observers = hooks.dead_letter
        if hooks.dead_letter:
            for sub in self._subs.values():
                sub.list_at = 0  # an observer gets every shed from now on

    def _unlisted_sheds(self) -> int:
        """Sheds counted but not listed in the DLQ, for its ``totals`` and ``evicted``."""
        return self._gone_unlisted + sum(s.shed - s.listed_sheds for s in self._subs.values())

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
        self._sched = LoopScheduling()
        self._running = True
        self.transport.on_change = self._routes.changed
        try:
            await self.transport.start(
                BusPort(self._inbound, self._remote_dead_letter, self.session_id)
            )
        except BaseException:
            self._running = False  # e.g. no broker: the bus did not start, and says why
            raise
        for sub in self._subs.values():
            self._start_workers(sub)
        self._advertise()

    async def aclose(self, *, drain: bool = True, timeout: float | None = 30.0) -> None:
        """Stop the bus. With ``drain`` it first waits (up to ``timeout``) for every queued
        message to finish; whatever is still queued afterwards (or waiting for a retry) is
        dead-lettered with reason ``bus_closed``, so closing never loses a message silently."""
        if self._closed:
            return
        if drain and self._running:
            with contextlib.suppress(TimeoutError):
                await self.drain(timeout=timeout)
        self._running = False
        self._closed = True
        tasks = [t for sub in self._subs.values() for t in (*sub.workers, *sub.waiting)]
        for retire, worker in list(self._retiring.items()):
            tasks += (retire, worker)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for sub in self._subs.values():
            sub.workers.clear()
            sub.flush("bus_closed")
        self._routes.changed()  # folds per-topic counts into the totals; stats() keeps them
        await self.transport.aclose()

    def _start_workers(self, sub: Subscription) -> None:
        assert self._loop is not None
        for i in range(sub.concurrency):
            task = self._loop.create_task(
                work(sub, self._hooks, self.clock), name=f"bus:{sub.name}:{i}"
            )
            sub.workers.append(task)

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
        than ``None``. A failed message with ``retry`` attempts left waits out its backoff
        outside the mailbox, so it holds neither a slot nor a worker meanwhile.
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
                as_async(fn),
                concurrency=concurrency,
                max_queue=max_queue,
                overflow=overflow,
                block_timeout=block_timeout,
                filter=filter,
                sample_rate=sample_rate,
                retry=retry,
                breaker=CircuitBreaker(sub_name, policy, self.clock, self._breaker_changed),
                ledger=self._ledger,
                dlq=self.dlq,
            )
            self._subs[sub_name] = sub
            self._routes.add(sub)
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
        if sub is None or self._routes.leaving(name):
            raise KeyError(f"no subscription named {name!r}")
        # Called from one of this subscription's own handlers, off() runs inside that worker:
        # its message stays in flight until off() returns, so waiting for it, or cancelling
        # and awaiting its task, would never end (and would hang drain()). That worker is
        # left to finish its message and is stopped once it is idle (_retire).
        own = asyncio.current_task()
        if own not in sub.workers:
            own = None
        self._routes.leave(sub)
        self._advertise()
        try:
            if self._running:
                await self.transport.sync()
            # Its own worker cannot handle the backlog while it waits here: _retire does.
            while (sub.size and own is None) or sub.in_flight > (own is not None):  # noqa: ASYNC110
                await asyncio.sleep(0.001)
        finally:
            self._routes.left(sub)
        others = [task for task in sub.workers if task is not own]
        for task in others:
            task.cancel()
        await asyncio.gather(*others, return_exceptions=True)
        sub.workers.clear()
        del self._subs[name]
        self._gone_unlisted += sub.shed - sub.listed_sheds
        if own is not None:
            self._retire(sub, cast("asyncio.Task[None]", own))

    def _retire(self, sub: Subscription, worker: asyncio.Task[None]) -> None:
        """Stop ``worker``, whose handler unsubscribed its own subscription, once it has
        finished that message and what was queued behind it. aclose() stops it sooner if
        the bus closes first."""

        async def retire() -> None:
            try:
                while sub.in_flight or sub.size:  # noqa: ASYNC110 - rare path, no waiter
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
            self.transport.advertise((s.name, s.pattern) for s in self._routes.subscriptions())

    def _route(self, topic: str) -> Route:
        if not self._running:
            raise BusClosedError(
                "bus is not running: use `async with Bus() as bus` or `await bus.start()`"
            )
        return self._routes.resolve(topic)

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
        worker = current_handler.get()
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
        id: int | None = None,
    ) -> Envelope:
        """Publish to every subscription matching ``topic``; returns the envelope.

        Waits only when a ``block`` subscriber's mailbox is full (up to its
        ``block_timeout``). Inside a handler the new message is caused by the one being
        handled; elsewhere pass ``cause=`` to link it.

        ``id`` replaces the fresh id (and, for outside input, the correlation id its whole
        tree carries): an Observer's inputs carry their ordinal in it
        (``agents.InputOrdinals``). It must be as unique as a fresh one: the ZeroMQ and NATS
        transports drop a repeated id as a duplicate.
        """
        if self._open:
            self._out.check(topic)
        env = self._envelope(topic, payload, priority, cause)
        # Every emit pays this test: +1.2 ns (timeit, min of 25 rounds) on ~700 ns per emit.
        if id is not None:
            env.id = id
            if env.causation_id is None:
                env.correlation_id = id
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
        (at most ``bus._publishing.MAX_BACKGROUND_SENDS`` at once; past that, QueueFullError)."""
        if self._open:
            self._out.check(topic)
        env = self._envelope(topic, payload, priority, cause)
        blocked = self._dispatch(env)
        if blocked:
            self._out.not_waiting(env, blocked)
        return env

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
            if self._open:
                self._out.check(topic)
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

    def _remote_dead_letter(
        self, env: Envelope, subscriber: str, reason: str, error: BaseException | None
    ) -> None:
        """A transport could not deliver ``env`` to the remote ``subscriber``: list it here,
        in the publishing bus's DLQ, so it shows in stats and the session like any other."""
        self.dlq.add(env, subscriber, reason, error)

    def _inbound(self, env: Envelope, names: Collection[str] | None) -> Awaitable[None] | None:
        """A message from another bus (the transport's ``BusPort.deliver``): delivered here
        only, never forwarded back (see :meth:`Dispatcher.inbound`)."""
        if not self._running:
            raise BusClosedError("bus is closed: it takes no more messages from other buses")
        if env.context is None:
            env.context = self.context
        return self._out.inbound(env, names)

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
        if self._open:
            self._out.check(topic)
        route = self._cache.get(topic) or self._route(topic)
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

    # -- drain, DLQ, breakers, stats -------------------------------------------------------

    async def drain(self, timeout: float | None = None) -> None:
        """Wait until every accepted message, including those emitted while draining, has
        been delivered, dead-lettered or shed, here and, for messages sent to other buses,
        there (``transport.flush()``). Raises TimeoutError after ``timeout``."""
        if not self._running:
            return
        assert self._loop is not None
        ledger = self._ledger
        out = self._out
        async with asyncio.timeout(timeout):
            while True:
                while ledger.outstanding or out.sending:
                    fut = self._loop.create_future()
                    ledger.drain_waiters.append(fut)
                    await fut
                # Let handlers' follow-up work scheduled with call_soon settle too.
                await asyncio.sleep(0)
                if ledger.outstanding or out.sending:
                    continue
                # Remote receivers may answer (replies, follow-up messages) while we wait.
                await self.transport.flush()
                if not (ledger.outstanding or out.sending):
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
        sub.taken_back(entry.reason)
        return True

    def breaker(self, name: str) -> CircuitBreaker:
        """The consumer breaker of subscription ``name`` or the publisher breaker
        ``publish:<topic>``, for manual ``force_open()`` / ``reset()``."""
        if name.startswith("publish:"):
            return self._out.breakers[name.removeprefix("publish:")]
        return self._subs[name].breaker

    def breakers(self) -> dict[str, str]:
        """Every breaker's state by name: ``closed``, ``open`` or ``half_open``."""
        states = {name: sub.breaker.state for name, sub in self._subs.items()}
        for topic, breaker in self._out.breakers.items():
            states[f"publish:{topic}"] = breaker.state
        return states

    def _breaker_changed(self, breaker: CircuitBreaker, old: str, new: str, why: str) -> None:
        own = self._subs.get(breaker.name)
        if own is not None and own.breaker is not breaker:
            own = None  # a publisher breaker named like a subscription
        self._out.breaker_changed(breaker, old, new, why, own, self._running)

    def stats(self) -> BusStats:
        """Counters, latency summaries and depths of the whole bus, read at one instant."""
        sched = None if self._sched is None else self._sched.read()
        return bus_stats(self._routes.counts(), self._subs, self.dlq, self.breakers(), sched)

    @property
    def outstanding(self) -> int:
        """Messages accepted and not yet delivered, dead-lettered or shed."""
        return self._ledger.outstanding
