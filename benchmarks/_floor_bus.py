"""The least a bus with Pantheon's per-message duties can do, for benchmarks/floor_bench.py.

Not used by Pantheon. Each message still gets what the bus promises every message: an
:class:`~bus.Envelope` with a fresh id, a creation time and its cause read from a context
variable; a route lookup and a per-topic count; a bounded mailbox of three priority lanes
with its counts; a worker that pops the highest priority, awaits the handler, counts the
delivery and yields to the loop now and then. Nothing else: no observers, no tracer test,
no breaker, no retries, no timing histograms, no dead letters, no request replies, no
transport, no filter or sampling, one subscription. Its throughput is therefore an upper
bound for any bus that keeps those duties, written the way this file is. Typed so that
mypyc can compile it unchanged (``floor_bench.py --mypyc``).
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from bus import Envelope

_next_id = itertools.count(1 << 40).__next__
_now = time.monotonic_ns
_current: contextvars.ContextVar[Any] = contextvars.ContextVar("floor_worker", default=None)


class Running:
    """What a worker's task knows of the message it handles (set once per worker)."""

    def __init__(self) -> None:
        self.env: Envelope | None = None


class Ledger:
    def __init__(self) -> None:
        self.outstanding = 0


class Mailbox:
    def __init__(self, handler: Callable[[Envelope], Awaitable[Any]], ledger: Ledger) -> None:
        self.q0: deque[Envelope] = deque()
        self.q1: deque[Envelope] = deque()
        self.q2: deque[Envelope] = deque()
        self.size = 0
        self.max_queue = 10_000
        self.published = 0
        self.delivered = 0
        self.in_flight = 0
        self.idle: list[asyncio.Future[None]] = []
        self.handler = handler
        self.ledger = ledger

    def offer(self, env: Envelope, priority: int) -> bool:
        if self.size >= self.max_queue:
            return False
        if priority == 2:
            self.q2.append(env)
        elif priority == 1:
            self.q1.append(env)
        else:
            self.q0.append(env)
        self.size += 1
        self.published += 1
        self.ledger.outstanding += 1
        if self.idle:
            self.idle.pop().set_result(None)
        return True


class Route:
    def __init__(self, mailbox: Mailbox) -> None:
        self.mailbox = mailbox
        self.published = 0


class FloorBus:
    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.ledger = Ledger()
        self.session_id: str | None = None
        self.context: Any = None

    def on(self, topic: str, handler: Callable[[Envelope], Awaitable[Any]]) -> Mailbox:
        mailbox = Mailbox(handler, self.ledger)
        self.routes[topic] = Route(mailbox)
        return mailbox

    async def emit(self, topic: str, payload: Any = None, priority: int = 2) -> Envelope:
        running = _current.get()
        cause = running.env if running is not None else None
        if cause is None:
            id_ = _next_id()
            env = Envelope(
                topic, payload, priority, id_, self.session_id, id_, None, None,
                _now(), 0, None, self.context,
            )  # fmt: skip
        else:
            env = Envelope(
                topic, payload, priority, _next_id(), cause.session_id, cause.correlation_id,
                cause.id, cause.trace, _now(), cause.hops + 1, cause.source, self.context,
            )  # fmt: skip
        route = self.routes[topic]
        route.published += 1
        if not route.mailbox.offer(env, priority):
            raise RuntimeError(f"mailbox for {topic!r} is full")
        return env

    async def work(self, box: Mailbox) -> None:
        q0, q1, q2 = box.q0, box.q1, box.q2
        handler = box.handler
        ledger = self.ledger
        loop = asyncio.get_running_loop()
        seen = 0
        running = Running()
        _current.set(running)
        while True:
            if q0:
                env = q0.popleft()
            elif q1:
                env = q1.popleft()
            elif q2:
                env = q2.popleft()
            else:
                fut: asyncio.Future[None] = loop.create_future()
                box.idle.append(fut)
                await fut
                continue
            box.size -= 1
            box.in_flight += 1
            running.env = env
            try:
                await handler(env)
            except Exception:
                pass
            else:
                box.delivered += 1
            box.in_flight -= 1
            ledger.outstanding -= 1
            seen += 1
            if not seen % 1024:
                await asyncio.sleep(0)
