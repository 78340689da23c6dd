"""The helpers ``bus.testing`` ships to users: FakeClock, memory_bus, capture_events."""

from __future__ import annotations

import asyncio

from bus import Bus, Envelope
from bus.testing import FakeClock, capture_events, memory_bus


async def test_fake_clock_moves_only_when_advanced() -> None:
    clock = FakeClock(start=100.0)
    assert clock.now() == 100.0
    await asyncio.sleep(0.01)
    assert clock.now() == 100.0
    await clock.advance(2.5)
    assert clock.now() == 102.5


async def test_fake_clock_sleep_parks_until_its_deadline() -> None:
    clock = FakeClock()
    woke: list[tuple[str, float]] = []

    async def sleeper(name: str, seconds: float) -> None:
        await clock.sleep(seconds)
        woke.append((name, clock.now()))

    tasks = [
        asyncio.create_task(sleeper("b", 2.0)),
        asyncio.create_task(sleeper("a", 1.0)),
        asyncio.create_task(sleeper("c", 3.0)),
    ]
    await asyncio.sleep(0)
    assert clock.sleepers == 3
    await clock.advance(0.5)
    assert woke == [] and clock.sleepers == 3
    await clock.advance(2.0)  # to 2.5: a and b wake in deadline order, at their deadline
    assert woke == [("a", 1.0), ("b", 2.0)]
    assert clock.now() == 2.5 and clock.sleepers == 1
    await clock.advance(10)
    await asyncio.gather(*tasks)
    assert woke[-1] == ("c", 3.0) and clock.sleepers == 0


async def test_fake_clock_zero_sleep_does_not_park() -> None:
    clock = FakeClock()
    await asyncio.wait_for(clock.sleep(0), 0.5)
    assert clock.sleepers == 0


async def test_fake_clock_runs_what_a_wakeup_resumes_before_the_next_deadline() -> None:
    clock = FakeClock()
    seen: list[float] = []

    async def chain() -> None:
        await clock.sleep(1.0)
        seen.append(clock.now())
        await clock.sleep(1.0)  # scheduled from inside the first wake-up
        seen.append(clock.now())

    task = asyncio.create_task(chain())
    await asyncio.sleep(0)
    await clock.advance(5.0)
    await task
    assert seen == [1.0, 2.0]


async def test_memory_bus_is_started_then_drained_and_closed() -> None:
    got: list[int] = []
    async with memory_bus(session_id="test") as b:
        assert isinstance(b, Bus)

        @b.on("t", name="slow")
        async def slow(env: Envelope) -> None:
            await asyncio.sleep(0.001)
            got.append(env.payload)

        env = await b.emit("t", 1)
        await b.emit("t", 2)
        assert env.session_id == "test"
    assert got == [1, 2]  # drained on exit
    assert b.outstanding == 0
    assert len(b.dlq) == 0


async def test_memory_bus_passes_options_through() -> None:
    clock = FakeClock()
    async with memory_bus(clock=clock, dlq_size=1) as b:
        assert b.clock is clock
        assert b.dlq.max_entries == 1


async def test_capture_events_records_matching_publishes_in_order(bus: Bus) -> None:
    with capture_events(bus, "audit.*") as seen:
        a = await bus.emit("audit.login", 1)
        await bus.emit("other.thing", 2)
        b = await bus.emit("audit.logout", 3)
    c = await bus.emit("audit.after", 4)
    assert seen == [a, b]  # nobody subscribes: capture sees publishes, not deliveries
    assert c not in seen
    assert bus.stats().subscribers == {}  # capture adds no subscriber to the accounting


async def test_capture_events_sees_messages_emitted_by_handlers(bus: Bus) -> None:
    @bus.on("ping", name="ponger")
    async def ponger(env: Envelope) -> None:
        await bus.emit("pong", env.payload)

    with capture_events(bus) as seen:
        await bus.emit("ping", 1)
        await bus.drain()
    assert [(e.topic, e.payload) for e in seen] == [("ping", 1), ("pong", 1)]
    assert seen[1].causation_id == seen[0].id
