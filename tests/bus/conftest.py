"""Fixtures shared by the bus tests.

Handlers that must hold a message (to fill a mailbox, to measure concurrency) wait on a
:class:`Gate`. Every gate made through the ``gate`` fixture is opened at teardown, before the
bus fixture drains, so a failing test never leaves the drain waiting on a stuck handler.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator

import pytest

from bus import Bus
from bus.testing import FakeClock, memory_bus


class Gate:
    """An ``asyncio.Event`` that also counts who is waiting on it."""

    def __init__(self) -> None:
        self._event = asyncio.Event()
        self.waiting = 0

    async def wait(self) -> None:
        self.waiting += 1
        try:
            await self._event.wait()
        finally:
            self.waiting -= 1

    def open(self) -> None:
        self._event.set()

    def close(self) -> None:
        self._event.clear()

    @property
    def is_open(self) -> bool:
        return self._event.is_set()


async def wait_until(predicate: Callable[[], object], timeout: float = 2.0) -> None:
    """Spin the loop until ``predicate()`` is true; fail the test after ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            while not predicate():  # noqa: ASYNC110 - polling state, not an event
                await asyncio.sleep(0)
    except TimeoutError:
        pytest.fail(f"condition not reached within {timeout}s: {predicate}")


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
async def bus(clock: FakeClock) -> AsyncIterator[Bus]:
    async with memory_bus(clock=clock) as b:
        yield b


@pytest.fixture
def gate(bus: Bus) -> Iterator[Callable[[], Gate]]:
    # Depends on ``bus`` so it is torn down first: gates open before the bus drains.
    made: list[Gate] = []

    def make() -> Gate:
        g = Gate()
        made.append(g)
        return g

    yield make
    for g in made:
        g.open()


@pytest.fixture
def until() -> Callable[..., object]:
    return wait_until
