"""Request/reply over the bus."""

from __future__ import annotations

import asyncio
import time

import pytest

from bus import (
    Bus,
    BusError,
    Envelope,
    NoRouteError,
    Priority,
    RequestTimeout,
    Retry,
)


async def test_request_returns_the_answer(bus: Bus) -> None:
    seen: list[Envelope] = []

    @bus.on("math.double", name="doubler")
    async def doubler(env: Envelope) -> int:
        seen.append(env)
        return env.payload * 2

    assert await bus.request("math.double", 21) == 42
    assert seen[0].priority == Priority.HIGH  # requests default to HIGH


async def test_a_sync_handler_can_answer(bus: Bus) -> None:
    bus.on("q", lambda env: f"hello {env.payload}", name="greeter")
    assert await bus.request("q", "you", timeout=1.0) == "hello you"


async def test_request_times_out(bus: Bus) -> None:
    bus.on("q", lambda env: None, name="silent")
    started = time.monotonic()
    with pytest.raises(RequestTimeout) as info:
        await bus.request("q", timeout=0.05)
    assert 0.04 <= time.monotonic() - started < 1.0
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, BusError)


async def test_request_with_no_subscriber_raises_no_route(bus: Bus) -> None:
    bus.on("other", lambda env: 1, name="other")
    with pytest.raises(NoRouteError):
        await bus.request("nobody.home", timeout=1.0)


async def test_handler_exception_propagates_to_the_requester(bus: Bus) -> None:
    @bus.on("q", name="broken")
    async def broken(env: Envelope) -> int:
        raise LookupError("no such customer")

    with pytest.raises(LookupError, match="no such customer"):
        await bus.request("q", timeout=1.0)
    assert bus.dlq.entries()[0].reason == "failed"


async def test_a_retried_request_still_gets_its_answer(bus: Bus) -> None:
    calls = 0

    @bus.on("q", name="flaky", retry=Retry(attempts=2))
    async def flaky(env: Envelope) -> str:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise ConnectionError("blip")
        return "second time lucky"

    assert await bus.request("q", timeout=1.0) == "second time lucky"


async def test_a_wildcard_subscriber_returning_none_does_not_answer(bus: Bus) -> None:
    audited: list[str] = []
    bus.on(">", lambda env: audited.append(env.topic), name="audit")  # answers first, None

    @bus.on("q.price", name="pricer")
    async def pricer(env: Envelope) -> int:
        await asyncio.sleep(0.01)
        return 99

    assert await bus.request("q.price", timeout=1.0) == 99
    assert audited == ["q.price"]


async def test_the_first_answer_wins(bus: Bus) -> None:
    @bus.on("q", name="slow")
    async def slow(env: Envelope) -> str:
        await asyncio.sleep(0.02)
        return "slow"

    bus.on("q", lambda env: "fast", name="fast")
    assert await bus.request("q", timeout=1.0) == "fast"
    await bus.drain()  # the late answer is dropped quietly


async def test_requests_inside_handlers_chain_lineage(bus: Bus) -> None:
    seen: list[Envelope] = []

    @bus.on("inner", name="inner")
    async def inner(env: Envelope) -> str:
        seen.append(env)
        return "inner-answer"

    @bus.on("outer", name="outer")
    async def outer(env: Envelope) -> str:
        return await bus.request("inner", timeout=1.0)

    root_answer = await bus.request("outer", timeout=1.0)
    assert root_answer == "inner-answer"
    assert seen[0].hops == 1 and seen[0].source == "outer"


async def test_a_late_reply_after_timeout_is_ignored(bus: Bus) -> None:
    release = asyncio.Event()

    @bus.on("q", name="late")
    async def late(env: Envelope) -> str:
        await release.wait()
        return "too late"

    with pytest.raises(RequestTimeout):
        await bus.request("q", timeout=0.01)
    release.set()
    await bus.drain()
    assert bus.stats().subscribers["late"].delivered == 1
