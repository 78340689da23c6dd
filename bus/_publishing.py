"""Fan-out: what happens to one message between its envelope and the mailboxes it reaches.

:class:`Dispatcher` offers a message to every subscription its route names (each one's
``offer`` decides), sends it on to other buses, and, when a mailbox is full, makes the
publisher wait or refuses it. It owns the state of that: the publisher breakers (one per
topic whose publishes were refused) and the remote sends still waiting for transport
credit. Messages from other buses come in through :meth:`Dispatcher.inbound`, the same
offers minus the sending on.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import traceback
from collections.abc import Awaitable, Callable, Collection
from typing import Any, NoReturn, cast

from bus._breaker import CircuitBreaker
from bus._clock import Clock
from bus._config import BreakerPolicy, Priority
from bus._dlq import DeadLetterQueue
from bus._envelope import Envelope
from bus._errors import EncodeError, QueueFullError
from bus._hooks import SAMPLED_DIGITS, UNSAMPLED, BreakerEvent, Hooks
from bus._routing import MAX_TOPIC_STATS, Route
from bus._subscription import DECLINED, TAKEN, Ledger, Subscription
from bus._transport import Receipt, Transport

__all__ = ["MAX_BACKGROUND_SENDS", "SYSTEM_BREAKER_TOPIC", "Dispatcher"]

SYSTEM_BREAKER_TOPIC = "system.breaker."
#: Remote sends ``emit_nowait`` may leave waiting for transport credit in background tasks;
#: past this it raises QueueFullError (``emit`` waits for credit instead).
MAX_BACKGROUND_SENDS = 1024

#: Stands in ``dispatch``'s list of full mailboxes for "the transport had no credit for
#: this envelope": ``wait`` awaits ``transport.send`` for it, so a slow remote consumer
#: slows ``emit`` exactly as a full local ``block`` mailbox does.
_REMOTE = cast(Subscription, object())


class Dispatcher:
    """Offers messages to their routes' subscriptions; owns publisher breakers and the
    remote sends in flight (``sending``: ``drain`` waits for them)."""

    def __init__(
        self,
        *,
        cache: dict[str, Route],
        route: Callable[[str], Route],
        hooks: Hooks,
        transport: Transport,
        dlq: DeadLetterQueue,
        ledger: Ledger,
        clock: Clock,
        policy: BreakerPolicy | None,
        on_change: Callable[[CircuitBreaker, str, str, str], None],
        envelope: Callable[[str, Any, int, Envelope | None], Envelope],
    ) -> None:
        self.cache = cache
        self.route = route
        self.hooks = hooks
        self.transport = transport
        self.dlq = dlq
        self.ledger = ledger
        self.clock = clock
        self.policy = policy
        self.on_change = on_change
        self.envelope = envelope
        #: Publisher breakers by topic, and those of them not closed (emit checks these).
        self.breakers: dict[str, CircuitBreaker] = {}
        self.open: dict[str, CircuitBreaker] = {}
        self.sending = 0
        self.send_tasks: set[asyncio.Task[None]] = set()

    def breaker_changed(
        self,
        breaker: CircuitBreaker,
        old: str,
        new: str,
        why: str,
        own: Subscription | None,
        running: bool,
    ) -> None:
        """A breaker changed state: emits check only the publisher breakers not closed,
        observers get a :class:`BreakerEvent`, and while the bus runs the change is
        published as ``system.breaker.<name>`` to every subscriber but ``own``, the
        subscription whose breaker it is (see :meth:`report`)."""
        if breaker.name.startswith("publish:"):
            topic = breaker.name.removeprefix("publish:")
            if new == "closed":
                self.open.pop(topic, None)
            else:
                self.open[topic] = breaker
        if self.hooks.breaker:
            event = BreakerEvent(
                time.time(), breaker.name, old, new, why, breaker.trips, breaker.retry_after()
            )
            for observer in self.hooks.breaker:
                observer(event)
        if running:
            payload = {
                "breaker": breaker.name,
                "from": old,
                "to": new,
                "reason": why,
                "trips": breaker.trips,
                "retry_after": breaker.retry_after(),
            }
            env = self.envelope(SYSTEM_BREAKER_TOPIC + breaker.name, payload, Priority.HIGH, None)
            # A full system subscriber refuses per its own policy, and that is counted there
            # (``rejected``). No publisher breaker guards these topics (see :meth:`failed`),
            # so a report is never failed fast nor feeds another report.
            with contextlib.suppress(QueueFullError):
                self.report(env, own)

    def not_waiting(self, env: Envelope, blocked: list[Subscription]) -> None:
        """What ``emit_nowait`` does with mailboxes that would make it wait: a remote send
        goes to a background task, a full local mailbox refuses (QueueFullError)."""
        if _REMOTE in blocked:
            blocked = [sub for sub in blocked if sub is not _REMOTE]
            self.send_later(env)
        if blocked:
            self.refuse(env, blocked)

    def dispatch(
        self,
        env: Envelope,
        only: tuple[Subscription, ...] | None = None,
        *,
        redrive: bool = False,
    ) -> list[Subscription] | None:
        """Offer ``env`` to its subscribers; return those whose mailbox was full and that
        the publisher must wait for (``block``) or be refused by (``reject``).

        ``only`` limits delivery to those of the topic's subscriptions. A ``redrive`` is not
        sent to other buses and skips filters and sampling: the message was chosen once
        already, and declining it now would lose it (it left the DLQ as ``filtered``).
        ``_REMOTE`` in the result: the transport had no credit. A refusal with nothing to
        wait for raises QueueFullError here. Messages from other buses take :meth:`inbound`
        instead."""
        topic = env.topic
        route = self.cache.get(topic)
        if route is None:
            route = self.route(topic)
        route.published += 1
        hooks = self.hooks
        tracer = hooks.tracer
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
            elif trace is not UNSAMPLED and trace[-1] in SAMPLED_DIGITS:
                tracer.on_publish(env)
        if hooks.publish:
            for observer in hooks.publish:
                observer(env)
        full = None
        single = route.single
        if single is not None and only is None:
            # A topic with one local subscription (each agent's own): no loop.
            if single.offer(env, redrive) > DECLINED:
                full = [single]
        else:
            for sub in route.subs if only is None else only:
                if sub.offer(env, redrive) > DECLINED:
                    if full is None:
                        full = []
                    full.append(sub)
        if route.remote and not redrive and not self.transport.try_send(env):
            if full is None:
                full = []
            full.append(_REMOTE)
        if full is None:
            if self.breakers:
                self.succeeded(topic)
            return None
        if all(sub is not _REMOTE and sub.overflow == "reject" for sub in full):
            self.refuse(env, full)
        # Raising now would skip the wait for the ``block`` subscribers and lose their copy
        # silently: _wait_blocked refuses the ``reject`` ones after it, with any that time out.
        return full

    def report(self, env: Envelope, own: Subscription | None) -> None:
        """Publish a breaker's report, as ``emit_nowait`` would, to every subscriber but
        ``own``, the one whose breaker it is. A failing catch-all handler (``*``) fed its
        own reports would make each one a failing call, or a failing half-open probe: trip,
        report, trip, thousands of times a second, and a drain that never ends. A full
        system subscriber refuses per its own policy (QueueFullError, counted there); no
        publisher breaker guards these topics (see :meth:`failed`)."""
        route = self.cache.get(env.topic) or self.route(env.topic)
        only = None
        if own is not None and own in route.subs:
            only = tuple(sub for sub in route.subs if sub is not own)
        blocked = self.dispatch(env, only)
        if blocked:
            self.not_waiting(env, blocked)

    def refuse(self, env: Envelope, subs: list[Subscription]) -> NoReturn:
        for sub in subs:
            sub.rejected += 1
        self.failed(env.topic)
        raise QueueFullError(env.topic, [s.name for s in subs])

    async def wait(self, env: Envelope, subs: list[Subscription]) -> None:
        loop = asyncio.get_running_loop()
        late = []
        for sub in subs:
            if sub is _REMOTE:
                await self.send(env)
                continue
            if sub.overflow == "reject":
                late.append(sub)
                continue
            deadline = loop.time() + sub.block_timeout
            while sub.size >= sub.max_queue:
                fut = loop.create_future()
                sub.putters.append(fut)
                remaining = deadline - loop.time()
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
                sub.offer(env, True)  # room now, and no await since the check
        if late:
            self.refuse(env, late)
        elif self.breakers:
            self.succeeded(env.topic)

    def check(self, topic: str) -> None:
        breaker = self.open.get(topic)
        if breaker is not None:
            breaker.acquire()

    def succeeded(self, topic: str) -> None:
        breaker = self.breakers.get(topic)
        if breaker is not None and breaker.dirty:
            breaker.record_success()

    def failed(self, topic: str) -> None:
        # The bus's own breaker reports get no publisher breaker. A refused report feeding
        # one would trip it, whose report is refused in turn (on an ever longer topic, until
        # RecursionError under ``consecutive_failures=1``); and an open one would fail the
        # reports fast, losing them uncounted. Refused, a report counts in ``rejected``.
        if self.policy is None or topic.startswith(SYSTEM_BREAKER_TOPIC):
            return
        breaker = self.breakers.get(topic)
        if breaker is None:
            if len(self.breakers) >= MAX_TOPIC_STATS:
                return
            breaker = CircuitBreaker(f"publish:{topic}", self.policy, self.clock, self.on_change)
            self.breakers[topic] = breaker
        breaker.record_failure()

    async def _inbound_blocked(
        self, env: Envelope, blocked: list[Subscription], receipt: Receipt, took: int
    ) -> None:
        try:
            await self.wait(env, blocked)
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

    async def send(self, env: Envelope) -> None:
        """Send to remote subscribers, waiting for credit; drain waits for this."""
        self.sending += 1
        try:
            await self.transport.send(env)
        finally:
            self.sending -= 1
            if not self.sending and self.ledger.drain_waiters:
                self.ledger.wake()

    def send_later(self, env: Envelope) -> None:
        if len(self.send_tasks) >= MAX_BACKGROUND_SENDS:
            raise QueueFullError(env.topic, ["<remote>"])
        task = asyncio.get_running_loop().create_task(self._send_background(env))
        self.send_tasks.add(task)
        task.add_done_callback(self.send_tasks.discard)

    async def _send_background(self, env: Envelope) -> None:
        try:
            await self.send(env)
        except Exception as exc:
            # Nobody awaits this task: the message goes to the DLQ rather than vanishing.
            reason = "encode_error" if isinstance(exc, EncodeError) else "transport_error"
            self.dlq.add(env, "<remote>", reason, exc, traceback.format_exc())

    def inbound(self, env: Envelope, names: Collection[str] | None) -> Awaitable[None] | None:
        """A message from another bus: deliver locally only, never forward it back.

        Returns an awaitable only when a ``block`` mailbox is full, so a transport can
        deliver a batch without a coroutine per message. When ``env.reply`` is a
        :class:`Receipt`, tells it how many subscriptions took the message (each settles it
        once): those whose ``offer`` said TAKEN, the same call local emits make."""
        topic = env.topic
        route = self.cache.get(topic)
        if route is None:
            route = self.route(topic)
        receipt = env.reply
        if receipt is not None and not isinstance(receipt, Receipt):
            receipt = None
        hooks = self.hooks
        # A message this bus published itself, back from its transport for a subscription
        # the transport feeds (``Transport.fed_remotely``), or one that reached it before
        # for another subscription: counted, traced and shown to the observers once.
        if receipt is None or not receipt.looped:
            route.published += 1
            tracer = hooks.tracer
            if tracer is not None and env.trace is None:
                # A root from a bus without a tracer gets its sampling decision here. A
                # traced message gets no publish span: its process spans parent to the
                # remote producer.
                if tracer.skip:
                    tracer.skip -= 1
                    env.trace = UNSAMPLED
                else:
                    tracer.on_publish(env)
            if hooks.publish:
                for observer in hooks.publish:
                    observer(env)
        took = 0
        full = None
        sub = route.single
        if sub is not None and names is None:
            # A receiving node's usual message: one subscription, no loop, no name check.
            verdict = sub.offer(env)
            if verdict > DECLINED:
                full = [sub]
            elif verdict == TAKEN:
                took = 1
        else:
            matched = 0
            for sub in route.inbound:
                if names is not None and sub.name not in names:
                    continue
                matched += 1
                verdict = sub.offer(env)
                if verdict == TAKEN:
                    took += 1
                elif verdict > DECLINED:
                    if full is None:
                        full = []
                    full.append(sub)
            if matched < (1 if names is None else len(names)):
                self._unsubscribed(env, names, route.inbound)
        if full is None:
            if self.breakers:
                self.succeeded(topic)
            if receipt is not None:
                receipt.expect(took)
            return None
        if all(sub.overflow == "reject" for sub in full):
            try:
                self.refuse(env, full)
            finally:
                if receipt is not None:
                    receipt.expect(took)
        if receipt is None:
            return self.wait(env, full)
        return self._inbound_blocked(env, full, receipt, took)
