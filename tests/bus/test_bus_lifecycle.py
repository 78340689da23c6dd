"""Starting, draining and closing: nothing accepted is ever lost silently."""

from __future__ import annotations

import asyncio

import pytest

from bus import Bus, BusClosedError, Envelope


def assert_accounted(b: Bus) -> None:
    for name, s in b.stats().subscribers.items():
        assert s.published == s.delivered + s.dead_lettered + s.shed, name
        listed = b.dlq.entries(subscriber=name)
        assert len([e for e in listed if e.reason == "shed"]) == s.shed, name
        assert len([e for e in listed if e.reason != "shed"]) == s.dead_lettered, name


async def test_drain_waits_for_chains_emitted_while_draining(bus: Bus) -> None:
    got: list[int] = []

    @bus.on("chain", name="link")
    async def link(env: Envelope) -> None:
        await asyncio.sleep(0.001)  # really suspend between links
        got.append(env.payload)
        if env.payload < 20:
            await bus.emit("chain", env.payload + 1)

    await bus.emit("chain", 0)
    await bus.drain()
    assert got == list(range(21))
    assert bus.outstanding == 0


async def test_drain_waits_for_fan_out_across_subscriptions(bus: Bus) -> None:
    got: list[str] = []

    @bus.on("a", name="a")
    async def a(env: Envelope) -> None:
        await asyncio.sleep(0.001)
        await bus.emit("b")
        await bus.emit("c")

    @bus.on("b", name="b")
    async def b(env: Envelope) -> None:
        await asyncio.sleep(0.002)
        got.append("b")
        await bus.emit("c")

    bus.on("c", lambda env: got.append("c"), name="c")
    await bus.emit("a")
    await bus.drain()
    assert sorted(got) == ["b", "c", "c"]


async def test_drain_times_out(bus: Bus, gate) -> None:
    g = gate()

    @bus.on("t", name="stuck")
    async def stuck(env: Envelope) -> None:
        await g.wait()

    await bus.emit("t")
    with pytest.raises(TimeoutError):
        await bus.drain(timeout=0.02)
    g.open()
    await bus.drain()


async def test_aclose_without_drain_dead_letters_queued_and_in_flight(until) -> None:
    b = Bus()
    await b.start()
    hold = asyncio.Event()
    started: list[int] = []

    @b.on("t", name="slow")
    async def slow(env: Envelope) -> None:
        started.append(env.payload)
        await hold.wait()

    for i in range(4):
        await b.emit("t", i)
    await until(lambda: started == [0])
    await b.aclose(drain=False)
    closed = b.dlq.entries(reason="bus_closed")
    # The queued ones and the one cancelled mid-handler: none disappears.
    assert sorted(e.envelope.payload for e in closed) == [0, 1, 2, 3]
    assert all(e.subscriber == "slow" for e in closed)
    assert_accounted(b)
    assert b.outstanding == 0


async def test_aclose_with_drain_handles_everything_first() -> None:
    got: list[int] = []
    async with Bus() as b:

        @b.on("t", name="sub")
        async def sub(env: Envelope) -> None:
            await asyncio.sleep(0)
            got.append(env.payload)

        for i in range(100):
            await b.emit("t", i)
    assert got == list(range(100))
    assert len(b.dlq) == 0


async def test_aclose_after_drain_timeout_accounts_for_the_stuck(until) -> None:
    b = Bus()
    await b.start()
    hold = asyncio.Event()

    @b.on("t", name="stuck")
    async def stuck(env: Envelope) -> None:
        await hold.wait()

    for i in range(3):
        await b.emit("t", i)
    await b.aclose(drain=True, timeout=0.02)
    assert sorted(e.envelope.payload for e in b.dlq.entries(reason="bus_closed")) == [0, 1, 2]
    assert_accounted(b)


async def test_an_exception_in_the_async_with_body_closes_without_draining() -> None:
    got: list[int] = []
    with pytest.raises(RuntimeError, match="body failed"):
        async with Bus() as b:
            b.on("t", lambda env: got.append(env.payload), name="sub")
            for i in range(3):
                await b.emit("t", i)
            raise RuntimeError("body failed")
    assert got == []
    assert [e.envelope.payload for e in b.dlq.entries(reason="bus_closed")] == [0, 1, 2]
    assert_accounted(b)


async def test_blocked_publishers_are_released_when_the_bus_closes(until) -> None:
    b = Bus()
    await b.start()
    hold = asyncio.Event()

    @b.on("t", name="sub", max_queue=1, block_timeout=30.0)
    async def sub(env: Envelope) -> None:
        await hold.wait()

    await b.emit("t", 0)
    await until(lambda: b.stats().subscribers["sub"].in_flight == 1)
    await b.emit("t", 1)
    publisher = asyncio.create_task(b.emit("t", 2))
    await asyncio.sleep(0)
    await b.aclose(drain=False)
    with pytest.raises(BusClosedError):
        await asyncio.wait_for(publisher, 1.0)
    assert_accounted(b)


async def test_aclose_is_idempotent_and_redrive_after_close_keeps_entries() -> None:
    b = Bus()
    await b.start()
    b.on("t", lambda env: None, name="sub")
    await b.emit("t")
    await b.aclose(drain=False)
    await b.aclose()
    assert len(b.dlq) == 1
    assert await b.dlq.redrive() == 0
    assert len(b.dlq) == 1


async def test_start_twice_is_harmless() -> None:
    b = Bus()
    await b.start()
    await b.start()
    got: list[int] = []
    b.on("t", lambda env: got.append(1), name="sub")
    await b.emit("t")
    await b.aclose()
    assert got == [1]  # one set of workers, one delivery


async def test_subscriptions_made_before_start_get_workers_on_start() -> None:
    b = Bus()
    got: list[int] = []
    b.on("t", lambda env: got.append(env.payload), name="early", concurrency=2)
    async with b:
        await b.emit("t", 1)
    assert got == [1]


async def test_a_message_waiting_for_its_retry_backoff_is_dead_lettered_on_close(
    until,
) -> None:
    from bus import Retry
    from bus.testing import FakeClock

    clock = FakeClock()
    b = Bus(clock=clock)
    await b.start()

    @b.on("t", name="flaky", retry=Retry(attempts=3, backoff=1.0))
    async def flaky(env: Envelope) -> None:
        raise ConnectionError("down")

    await b.emit("t")
    await until(lambda: clock.sleepers == 1)
    await b.aclose(drain=False)
    [entry] = b.dlq.entries()
    assert entry.reason == "bus_closed"
    assert_accounted(b)


async def test_a_pending_request_fails_with_bus_closed_when_the_bus_closes(until) -> None:
    b = Bus()
    await b.start()
    hold = asyncio.Event()

    @b.on("q", name="slow")
    async def slow(env: Envelope) -> str:
        await hold.wait()
        return "never"

    asking = asyncio.create_task(b.request("q", timeout=5.0))
    await until(lambda: b.stats().subscribers["slow"].in_flight == 1)
    await b.aclose(drain=False)
    with pytest.raises(BusClosedError):
        await asking
