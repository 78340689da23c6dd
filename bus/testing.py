"""Helpers for testing code that uses the bus: a fake clock, a bus fixture, event capture."""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from types import SimpleNamespace
from typing import Any

from bus._bus import Bus
from bus._envelope import Envelope

__all__ = ["FakeClock", "capture_events", "memory_bus"]


class FakeClock:
    """A clock that moves only when told to.

    Breakers read ``now()``; retry backoff awaits ``sleep()``, which parks until
    :meth:`advance` moves time past its deadline. ``advance`` wakes sleepers in deadline
    order and yields to the loop between them, so code resumed by one wake-up runs before
    the next deadline is considered, as it would in real time.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start
        self._sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def now(self) -> float:
        return self._now

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        fut = asyncio.get_running_loop().create_future()
        heapq.heappush(self._sleepers, (self._now + seconds, next(self._seq), fut))
        await fut

    @property
    def sleepers(self) -> int:
        """How many tasks are parked in :meth:`sleep`."""
        return sum(1 for *_, f in self._sleepers if not f.done())

    async def advance(self, seconds: float) -> None:
        target = self._now + seconds
        while self._sleepers and self._sleepers[0][0] <= target:
            deadline, _, fut = heapq.heappop(self._sleepers)
            self._now = max(self._now, deadline)
            if not fut.done():
                fut.set_result(None)
            for _ in range(3):
                await asyncio.sleep(0)
        self._now = target


@asynccontextmanager
async def memory_bus(**options: Any) -> AsyncIterator[Bus]:
    """A started in-process bus, drained and closed on exit (``options`` go to :class:`Bus`).

    Use it in a pytest-asyncio fixture::

        @pytest.fixture
        async def bus():
            async with memory_bus(clock=FakeClock()) as b:
                yield b
    """
    async with Bus(**options) as bus:
        yield bus


@contextmanager
def capture_events(bus: Bus, pattern: str = ">") -> Iterator[list[Envelope]]:
    """Record every envelope published on ``bus`` whose topic matches ``pattern``, in order.

    Capture watches publishes, not deliveries, so it sees messages nobody subscribes to and
    does not add a subscriber to the bus's accounting.
    """
    from bus._topics import matches, validate_pattern

    validate_pattern(pattern)
    seen: list[Envelope] = []

    def listen(env: Envelope) -> None:
        if matches(pattern, env.topic):
            seen.append(env)

    with bus.observe(SimpleNamespace(on_publish=listen)):
        yield seen
