"""A subscription and its mailbox: the one place a message is taken, shed, refused or counted.

Local emits, messages from other buses, redrives, breaker reports and retries all enter a
mailbox through :meth:`Subscription.offer` (a retry, which is no new publish, through
:meth:`Subscription.requeue`), so the accounting below holds whatever the path.

Accounting invariant, per subscription: every message accepted into a mailbox
(``published``) ends as exactly one of ``delivered``, ``dead_lettered``, ``shed`` or
``released``; dead-lettered and shed ones are listed in the DLQ with their reason (the newest
``dlq_size`` of them). ``released`` is a message from another bus that this one, closing,
gave back to its transport unhandled, so another member of its group takes it instead of it
being dead-lettered on a bus that is going away. Until
then it is ``queued`` (``size``) or ``in_flight`` (being handled, or waiting outside the
mailbox for a retry). Messages a filter or sample declines are counted in ``filtered`` and
were never published to that subscription; a ``reject`` or a ``block`` that timed out raises
:class:`QueueFullError` to the publisher and counts in ``rejected``.
"""

from __future__ import annotations

import asyncio
import inspect
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from bus._breaker import CircuitBreaker
from bus._config import Overflow, Retry
from bus._dlq import DeadLetterQueue, traceback_text
from bus._envelope import Envelope
from bus._errors import BusClosedError, QueueFullError
from bus._metrics import Histogram, SubscriberStats
from bus._transport import Receipt

__all__ = ["BLOCK", "DECLINED", "REJECT", "TAKEN", "Handler", "Ledger", "Subscription"]

Handler = Callable[[Envelope], Awaitable[Any]]

#: What :meth:`Subscription.offer` did. TAKEN: ``published`` moved (the message is queued,
#: or was settled here as shed or filter_error: either way the subscription answers for it).
#: DECLINED: a filter or the sample said no. BLOCK / REJECT: the mailbox is full and its
#: overflow policy is ``block`` (the publisher may wait, then :meth:`~Subscription.put`) or
#: ``reject`` (the publisher gets QueueFullError).
TAKEN = 0
DECLINED = 1
BLOCK = 2
REJECT = 3
#: A subscription's first sheds are all listed in the DLQ; past these, one in SHED_SAMPLE
#: (the rest are counted: ``shed`` and the DLQ's ``totals`` stay exact). Every one is
#: listed while the DLQ has an observer (a session recorder records each).
SHED_LIST_ALL = 1024
SHED_SAMPLE = 16


class Ledger:
    """What the whole bus counts across subscriptions: messages accepted and not yet
    settled (``drain`` waits for zero) and the futures of those waiting."""

    __slots__ = ("drain_waiters", "outstanding")

    def __init__(self) -> None:
        self.outstanding = 0
        self.drain_waiters: list[asyncio.Future[None]] = []

    def settled(self) -> None:
        """One message left the books; wake ``drain`` when none is left."""
        self.outstanding -= 1
        if not self.outstanding and self.drain_waiters:
            self.wake()

    def wake(self) -> None:
        waiters, self.drain_waiters = self.drain_waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)


def give_back(env: Envelope) -> bool:
    """On a closing bus: hand a message from another bus back to its transport for another
    member of its group (``Receipt.release``) rather than dead-letter it here. ``False`` for
    a local message, which has nowhere else to go."""
    reply = env.reply
    if reply is not None and isinstance(reply, Receipt):
        reply.release()
        return True
    return False


def release(env: Envelope, exc: BaseException) -> None:
    """Dead-lettered without a handler run (shed, filter error, closing): a remote
    message's receipt must still be settled, or its sender waits for it forever."""
    reply = env.reply
    if reply is not None and isinstance(reply, Receipt):
        reply.settle(None, exc)


class Subscription:
    """One handler on one pattern, with its own bounded mailbox, workers, breaker and stats."""

    __slots__ = (
        "accepted",
        "attempts",
        "block_timeout",
        "breaker",
        "concurrency",
        "dead_lettered",
        "delivered",
        "dlq",
        "due",
        "edges",
        "failures",
        "filter",
        "filtered",
        "handler",
        "handling",
        "handling_cpu",
        "handling_own",
        "idle",
        "in_flight",
        "ledger",
        "list_at",
        "listed_sheds",
        "max_queue",
        "name",
        "overflow",
        "pattern",
        "plain",
        "putters",
        "queues",
        "rejected",
        "released",
        "retries",
        "retry",
        "sample_acc",
        "sample_rate",
        "shed",
        "size",
        "waiting",
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
        ledger: Ledger,
        dlq: DeadLetterQueue,
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
        self.ledger = ledger
        self.dlq = dlq
        # No filter and no sampling: offer may append without looking further.
        self.plain = filter is None and sample_rate == 1.0
        self.queues: tuple[deque[Envelope], deque[Envelope], deque[Envelope]] = (
            deque(),
            deque(),
            deque(),
        )
        #: Retries whose backoff is over (counted in ``size``).
        self.due: deque[Envelope] = deque()
        self.size = 0
        self.idle: list[asyncio.Future[None]] = []
        self.putters: deque[asyncio.Future[None]] = deque()
        self.in_flight = 0
        #: Messages that failed and wait outside the mailbox for a retry, by ``id(env)``:
        #: (next attempt's number, first attempt's start ns, tracer span or None, first error,
        #: effects made so far: see ``Running.effects``).
        self.attempts: dict[int, tuple[int, int, Any, BaseException | None, int]] = {}
        #: The tasks that hold those messages outside the mailbox until their retry is due.
        self.waiting: set[asyncio.Task[None]] = set()
        self.accepted = self.delivered = self.dead_lettered = self.shed = self.released = 0
        self.rejected = self.filtered = self.failures = self.retries = 0
        #: Sheds listed in the DLQ, and the ``shed`` count at which the next one is listed
        #: (0: every one, while the first SHED_LIST_ALL or while a DLQ observer listens).
        self.listed_sheds = self.list_at = 0
        self.handling = Histogram()
        self.handling_cpu = Histogram()
        self.handling_own = Histogram()
        self.edges: dict[str | None, Histogram] = {}
        self.workers: list[asyncio.Task[None]] = []

    @property
    def published(self) -> int:
        """Messages this subscription answers for: those its mailbox took (``accepted``,
        counted by the enqueue) and those it shed (counted once, in ``shed``, so a shed
        costs one increment)."""
        return self.accepted + self.shed

    # -- the way in ------------------------------------------------------------------------

    def offer(self, env: Envelope, chosen: bool = False) -> int:
        """Offer ``env`` to this mailbox: take it, shed for it, or say why not (see TAKEN).

        ``chosen``: the message was chosen already (a redrive, or a publisher that waited
        for room): skip the filter and the sample (declining it now would lose it), not the
        overflow policy. The one place a message enters a mailbox as a new publish."""
        if not (self.plain or chosen):
            if self.filter is not None:
                try:
                    keep = self.filter(env.payload)
                except (Exception, SystemExit) as exc:  # user code, as a handler is
                    self.accepted += 1
                    self.dead_lettered += 1
                    self.dlq.add(env, self.name, "filter_error", exc, traceback_text(exc))
                    release(env, exc)
                    return TAKEN
                if not keep:
                    self.filtered += 1
                    return DECLINED
            if self.sample_rate < 1.0:
                # Deterministic sampling: exactly ``rate`` of messages, evenly spread, and the
                # same ones again on replay (a random draw would make replays diverge). The
                # tolerance absorbs binary rounding: ten additions of 0.1 sum to 0.99999...
                self.sample_acc += self.sample_rate
                if self.sample_acc < 1.0 - 1e-9:
                    self.filtered += 1
                    return DECLINED
                self.sample_acc -= 1.0
        if self.size < self.max_queue:
            self.queues[env.priority].append(env)
            self.size += 1
            self.accepted += 1
            self.ledger.outstanding += 1
            if self.idle:
                self.wake_worker()
            return TAKEN
        if self.overflow != "shed":
            return REJECT if self.overflow == "reject" else BLOCK
        # Shed: make room by dropping the oldest message of the lowest waiting priority, or
        # the new one if it is lower still; CRITICAL is never shed (only CRITICAL waiting:
        # block instead). Written out here, not called, because a flood of sheds must cost
        # no more than the enqueues it replaces: a count, and past the first SHED_LIST_ALL
        # one shed in SHED_SAMPLE listed in the DLQ (every one while an observer, such as a
        # session recorder, wants each). The victim's place goes to ``env``, so ``size``
        # and the ledger's ``outstanding`` stay as they are.
        queues = self.queues
        priority = env.priority
        if priority == 2:  # NORMAL, nothing is lower: the oldest NORMAL goes, or this one
            normal = queues[2]
            if normal:
                victim = normal.popleft()
                normal.append(env)
            else:
                victim = env
        else:
            lowest = 2 if queues[2] else 1 if queues[1] else 0
            if priority > lowest:
                victim = env
            elif lowest:
                victim = queues[lowest].popleft()
                queues[priority].append(env)
            else:
                return BLOCK
        shed = self.shed = self.shed + 1  # ``published`` too: it counts ``shed`` in
        if shed >= self.list_at:
            self._list_shed(victim, shed)
        if victim.reply is not None:
            # A remote message's sender must hear of it: settle its receipt.
            release(victim, QueueFullError(victim.topic, [self.name]))
        return TAKEN

    def _list_shed(self, victim: Envelope, shed: int) -> None:
        """List shed number ``shed`` in the DLQ and say when to list the next one."""
        self.listed_sheds += 1
        dlq = self.dlq
        dlq.shed(victim, self.name)
        self.list_at = shed + (1 if shed < SHED_LIST_ALL or dlq.observers else SHED_SAMPLE)

    def taken_back(self, reason: str) -> None:
        """A dead letter of this subscription (``reason``) was redriven and its mailbox took
        it: that was counted as a new publish, so uncount the dead letter. A listed shed's
        sampling position moves back with its count, so the next shed is listed as it would
        have been."""
        if reason == "shed":
            self.shed -= 1  # and so ``published``
            self.listed_sheds -= 1
            self.list_at -= 1
        else:
            self.dead_lettered -= 1
            self.accepted -= 1

    def wake_worker(self) -> None:
        fut = self.idle.pop()
        if not fut.done():
            fut.set_result(None)

    def requeue(self, env: Envelope) -> None:
        """A message whose retry is due goes back to the mailbox, in ``due``: it was accepted
        long ago, so it neither waits for room nor counts as published again. Workers take
        a due retry only after a fresh message (see bus._worker): retries falling due
        together would otherwise run back to back, and a few poison messages would make the
        consecutive failures that open the breaker for everyone."""
        self.due.append(env)
        self.size += 1
        self.in_flight -= 1
        if self.idle:
            self.wake_worker()

    def flush(self, reason: str) -> None:
        """Dead-letter everything queued (the bus is closing) and fail waiting publishers."""
        closed = BusClosedError(f"subscription {self.name!r} closed")
        for q in (*self.queues, self.due):
            while q:
                env = q.popleft()
                self.size -= 1
                self.ledger.outstanding -= 1
                if give_back(env):
                    self.released += 1
                else:
                    self.dead_lettered += 1
                    self.dlq.add(env, self.name, reason)
        for fut in self.putters:
            if not fut.done():
                fut.set_exception(closed)
        self.putters.clear()
        self.ledger.wake()

    def wake_putter(self) -> None:
        """Room was made: let the longest-waiting blocked publisher in."""
        while self.putters:
            fut = self.putters.popleft()
            if not fut.done():
                fut.set_result(None)
                return

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
            released=self.released,
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
            handling_cpu=self.handling_cpu.summary(),
            handling_own=self.handling_own.summary(),
        )


def as_async(handler: Callable[[Envelope], Any]) -> Handler:
    """``handler`` as a coroutine function: a plain function is wrapped once, here."""
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
