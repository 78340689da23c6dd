"""Circuit breakers: consumer side per subscription, publisher side per topic, on a fake clock."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from bus import (
    DEFAULT_BREAKER,
    BreakerPolicy,
    Bus,
    CircuitBreaker,
    CircuitOpenError,
    Envelope,
    QueueFullError,
)
from bus.testing import FakeClock, capture_events

POLICY = BreakerPolicy(consecutive_failures=3, min_calls=100, window=100, cooldown=10.0)


class Switch:
    """A handler that fails while ``failing`` is set; records every call."""

    def __init__(self) -> None:
        self.failing = True
        self.calls: list[object] = []

    async def __call__(self, env: Envelope) -> str:
        self.calls.append(env.payload)
        if self.failing:
            raise ConnectionError(f"downstream down for {env.payload}")
        return "ok"


def transitions(events: list[Envelope], name: str = "sub") -> list[tuple[str, str]]:
    return [
        (e.payload["from"], e.payload["to"]) for e in events if e.topic == f"system.breaker.{name}"
    ]


async def _emit_all(bus: Bus, *payloads: object) -> None:
    for p in payloads:
        await bus.emit("t", p)
    await bus.drain()


async def test_opens_after_consecutive_failures_and_dead_letters_without_calling(
    bus: Bus, clock: FakeClock
) -> None:
    h = Switch()
    bus.on("t", h, name="sub", breaker=POLICY)
    with capture_events(bus, "system.>") as events:
        await _emit_all(bus, 1, 2)
        assert bus.breakers()["sub"] == "closed"
        await _emit_all(bus, 3)
        assert bus.breakers()["sub"] == "open"
        await _emit_all(bus, 4, 5)
    assert h.calls == [1, 2, 3]  # 4 and 5 never reached the handler
    by_reason = {
        r: [e.envelope.payload for e in bus.dlq.entries(reason=r)]
        for r in ("failed", "circuit_open")
    }
    assert by_reason == {"failed": [1, 2, 3], "circuit_open": [4, 5]}
    entry = bus.dlq.entries(reason="circuit_open")[0]
    assert entry.error_type == "CircuitOpenError" and entry.attempts == 0
    assert transitions(events) == [("closed", "open")]
    event = events[0].payload
    assert event["breaker"] == "sub" and event["trips"] == 1
    assert event["retry_after"] == pytest.approx(10.0)
    assert "3 consecutive failures" in event["reason"]
    stats = bus.stats().subscribers["sub"]
    assert stats.breaker == "open" and stats.breaker_trips == 1
    assert stats.dead_lettered == 5 and stats.delivered == 0


async def test_a_success_resets_the_consecutive_count(bus: Bus) -> None:
    h = Switch()
    bus.on("t", h, name="sub", breaker=POLICY)
    await _emit_all(bus, 1, 2)
    h.failing = False
    await _emit_all(bus, 3)
    h.failing = True
    await _emit_all(bus, 4, 5)
    assert bus.breakers()["sub"] == "closed"
    await _emit_all(bus, 6)
    assert bus.breakers()["sub"] == "open"


async def test_half_opens_after_cooldown_and_a_good_probe_closes(
    bus: Bus, clock: FakeClock
) -> None:
    h = Switch()
    bus.on("t", h, name="sub", breaker=POLICY)
    with capture_events(bus, "system.breaker.*") as events:
        await _emit_all(bus, 1, 2, 3)
        await clock.advance(9.99)
        await _emit_all(bus, "early")
        assert bus.breakers()["sub"] == "open"
        assert "early" not in h.calls
        await clock.advance(0.01)
        h.failing = False
        await _emit_all(bus, "probe", "after")
    assert h.calls == [1, 2, 3, "probe", "after"]
    assert bus.breakers()["sub"] == "closed"
    assert transitions(events) == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]


async def test_a_failed_probe_reopens_for_a_full_cooldown(bus: Bus, clock: FakeClock) -> None:
    h = Switch()
    bus.on("t", h, name="sub", breaker=POLICY)
    with capture_events(bus, "system.breaker.*") as events:
        await _emit_all(bus, 1, 2, 3)
        await clock.advance(10.0)
        await _emit_all(bus, "probe")
        assert bus.breakers()["sub"] == "open"
        await clock.advance(5.0)
        await _emit_all(bus, "still open")
    assert h.calls == [1, 2, 3, "probe"]
    assert transitions(events) == [("closed", "open"), ("open", "half_open"), ("half_open", "open")]
    assert events[-1].payload["trips"] == 2
    assert bus.breaker("sub").retry_after() == pytest.approx(5.0)
    assert [e.envelope.payload for e in bus.dlq.entries(reason="failed")] == [1, 2, 3, "probe"]


async def test_half_open_admits_only_the_probes(bus: Bus, clock: FakeClock, gate, until) -> None:
    g = gate()
    failing = True
    calls: list[object] = []

    @bus.on(
        "t",
        name="sub",
        concurrency=4,
        breaker=BreakerPolicy(consecutive_failures=1, cooldown=1.0, probes=2),
    )
    async def sub(env: Envelope) -> None:
        calls.append(env.payload)
        if failing:
            raise ConnectionError("down")
        await g.wait()

    await _emit_all(bus, "trip")
    assert bus.breakers()["sub"] == "open"
    failing = False
    await clock.advance(1.0)
    for i in range(4):
        await bus.emit("t", i)
    await until(lambda: g.waiting == 2)
    await until(lambda: len(bus.dlq.entries(reason="circuit_open")) == 2)
    assert calls == ["trip", 0, 1]  # two probes in flight, the other two refused
    assert bus.breakers()["sub"] == "half_open"
    g.open()
    await bus.drain()
    assert bus.breakers()["sub"] == "closed"
    assert [e.envelope.payload for e in bus.dlq.entries(reason="circuit_open")] == [2, 3]


async def test_opens_on_failure_rate_over_the_window(bus: Bus) -> None:
    policy = BreakerPolicy(consecutive_failures=100, failure_rate=0.5, window=10, min_calls=10)

    @bus.on("t", name="sub", breaker=policy)
    async def sub(env: Envelope) -> None:
        if env.payload % 2:
            raise ConnectionError("odd")

    await _emit_all(bus, *range(9))  # 4 failures in 9 calls: under min_calls
    assert bus.breakers()["sub"] == "closed"
    await _emit_all(bus, 9)  # 5 of 10 failed: 50%
    assert bus.breakers()["sub"] == "open"


async def test_failure_rate_below_threshold_keeps_it_closed(bus: Bus) -> None:
    policy = BreakerPolicy(consecutive_failures=100, failure_rate=0.5, window=10, min_calls=10)

    @bus.on("t", name="sub", breaker=policy)
    async def sub(env: Envelope) -> None:
        if env.payload % 3 == 0:
            raise ConnectionError("every third")

    await _emit_all(bus, *range(1, 61))
    assert bus.breakers()["sub"] == "closed"


async def test_breaker_none_never_opens(bus: Bus) -> None:
    h = Switch()
    bus.on("t", h, name="sub", breaker=None)
    await _emit_all(bus, *range(50))
    assert len(h.calls) == 50
    assert bus.breakers()["sub"] == "closed"


async def test_manual_force_open_and_reset(bus: Bus, clock: FakeClock) -> None:
    got: list[object] = []
    bus.on("t", lambda env: got.append(env.payload), name="sub")
    with capture_events(bus, "system.breaker.sub") as events:
        bus.breaker("sub").force_open()
        assert bus.breakers() == {"sub": "open"}
        await _emit_all(bus, "refused")
        bus.breaker("sub").reset()
        await _emit_all(bus, "accepted")
    assert got == ["accepted"]
    assert [e.envelope.payload for e in bus.dlq.entries(reason="circuit_open")] == ["refused"]
    assert transitions(events) == [("closed", "open"), ("open", "closed")]
    assert [e.payload["reason"] for e in events] == ["forced open", "reset"]


async def test_breaker_listeners_see_every_transition(bus: Bus, clock: FakeClock) -> None:
    seen: list[tuple[str, str, str]] = []
    bus.observe(SimpleNamespace(on_breaker=lambda ev: seen.append((ev.breaker, ev.old, ev.new))))
    h = Switch()
    bus.on("t", h, name="sub", breaker=POLICY)
    await _emit_all(bus, 1, 2, 3)
    await clock.advance(10)
    h.failing = False
    await _emit_all(bus, 4)
    assert seen == [
        ("sub", "closed", "open"),
        ("sub", "open", "half_open"),
        ("sub", "half_open", "closed"),
    ]


async def test_request_to_an_open_breaker_raises_circuit_open_with_retry_after(
    bus: Bus, clock: FakeClock
) -> None:
    bus.on("q", lambda env: "answer", name="sub", breaker=POLICY)
    bus.breaker("sub").force_open()
    await clock.advance(4.0)
    with pytest.raises(CircuitOpenError) as info:
        await bus.request("q", timeout=1.0)
    assert info.value.retry_after == pytest.approx(6.0)
    assert info.value.name == "sub"


async def test_unknown_breaker_name_raises_key_error(bus: Bus) -> None:
    with pytest.raises(KeyError):
        bus.breaker("nobody")
    with pytest.raises(KeyError):
        bus.breaker("publish:nothing.failed.here")


# -- publisher breaker ---------------------------------------------------------------------


async def test_repeated_rejects_open_the_publisher_breaker(
    bus: Bus, clock: FakeClock, gate, until
) -> None:
    g = gate()
    got: list[object] = []

    @bus.on("t", name="sub", max_queue=1, overflow="reject")
    async def sub(env: Envelope) -> None:
        await g.wait()
        got.append(env.payload)

    other: list[object] = []
    bus.on("u", lambda env: other.append(env.payload), name="other")
    with capture_events(bus, "system.breaker.*") as events:
        await bus.emit("t", "held")
        await until(lambda: g.waiting == 1)
        await bus.emit("t", "queued")
        for i in range(3):
            with pytest.raises(QueueFullError):
                await bus.emit("t", f"refused{i}")
        assert bus.breakers()["publish:t"] == "open"
        await clock.advance(0.25)
        with pytest.raises(CircuitOpenError) as info:
            await bus.emit("t", "fast fail")
        assert info.value.retry_after == pytest.approx(0.75)
        assert info.value.name == "publish:t"
        with pytest.raises(CircuitOpenError):
            bus.emit_nowait("t", "fast fail too")
        await bus.emit("u", "other topics still flow")
        # Once space frees and the cooldown passes, one probe emit closes it again.
        g.open()
        await bus.drain()
        await clock.advance(1.0)
        await bus.emit("t", "probe")
        await bus.drain()
    assert bus.breakers()["publish:t"] == "closed"
    assert got == ["held", "queued", "probe"]
    assert other == ["other topics still flow"]
    assert transitions(events, "publish:t") == [
        ("closed", "open"),
        ("open", "half_open"),
        ("half_open", "closed"),
    ]
    # Refused at the publisher: counted as rejected, never accepted, never a dead letter.
    stats = bus.stats().subscribers["sub"]
    assert stats.rejected == 3 and stats.published == 3
    assert bus.dlq.entries() == []


async def test_repeated_block_timeouts_open_the_publisher_breaker(bus: Bus, gate, until) -> None:
    g = gate()

    @bus.on("t", name="sub", max_queue=1, overflow="block", block_timeout=0.01)
    async def sub(env: Envelope) -> None:
        await g.wait()

    await bus.emit("t", "held")
    await until(lambda: g.waiting == 1)
    await bus.emit("t", "queued")
    for _ in range(3):
        with pytest.raises(QueueFullError):
            await bus.emit("t")
    with pytest.raises(CircuitOpenError) as info:
        await bus.emit("t")
    assert info.value.retry_after == pytest.approx(1.0)
    assert bus.breaker("publish:t").state == "open"
    g.open()


async def test_publisher_breaker_can_be_turned_off(until) -> None:
    async with Bus(publisher_breaker=None, clock=FakeClock()) as b:
        hold = asyncio.Event()

        @b.on("t", name="sub", max_queue=1, overflow="reject")
        async def sub(env: Envelope) -> None:
            await hold.wait()

        await b.emit("t")
        await until(lambda: b.stats().subscribers["sub"].in_flight == 1)
        await b.emit("t")
        for _ in range(10):
            with pytest.raises(QueueFullError):
                await b.emit("t")
        assert "publish:t" not in b.breakers()
        hold.set()


async def _fill_catch_all(bus: Bus, g, until) -> None:
    """A ``>`` subscription (so it also gets ``system.breaker.<name>``) with a full reject
    mailbox."""

    @bus.on(">", name="all", max_queue=1, overflow="reject")
    async def catch_all(env: Envelope) -> None:
        await g.wait()

    await bus.emit("t", "held")
    await until(lambda: g.waiting == 1)
    await bus.emit("t", "queued")


async def test_a_refused_breaker_report_does_not_feed_a_breaker_of_its_own(gate, until) -> None:
    # One failure opens a publisher breaker, so before the fix each refused report opened a
    # breaker on its own topic, whose report was refused in turn: RecursionError.
    async with Bus(clock=FakeClock(), publisher_breaker=BreakerPolicy(consecutive_failures=1)) as b:
        g = gate()
        await _fill_catch_all(b, g, until)
        seen: list[tuple[str, str, str]] = []
        b.observe(SimpleNamespace(on_breaker=lambda ev: seen.append((ev.breaker, ev.old, ev.new))))
        with pytest.raises(QueueFullError):
            await b.emit("t", "refused")
        assert seen == [("publish:t", "closed", "open")]
        assert b.breakers() == {"all": "closed", "publish:t": "open"}
        # Neither lost: the user's message and the breaker's report were each refused and
        # counted, and the report stays out of the DLQ as any refusal at the publisher does.
        assert b.stats().subscribers["all"].rejected == 2
        assert b.dlq.entries() == []
        g.open()


async def test_every_refused_breaker_report_is_counted_over_many_transitions(
    bus: Bus, clock: FakeClock, gate, until
) -> None:
    g = gate()
    await _fill_catch_all(bus, g, until)
    seen: list[tuple[str, str, str]] = []
    bus.observe(SimpleNamespace(on_breaker=lambda ev: seen.append((ev.breaker, ev.old, ev.new))))
    refused = 0
    for _ in range(3):  # three refusals open it ...
        with pytest.raises(QueueFullError):
            await bus.emit("t")
        refused += 1
    for _ in range(2):  # ... then twice: cooldown, half-open, the probe refused, open again
        await clock.advance(1.0)
        with pytest.raises(QueueFullError):
            await bus.emit("t", "probe")
        refused += 1
    cycle = [("publish:t", "open", "half_open"), ("publish:t", "half_open", "open")]
    assert seen == [("publish:t", "closed", "open"), *cycle, *cycle]
    # Only the user's topic has a publisher breaker: a report never fails fast, so each of
    # the five was offered to the full mailbox and refused there.
    assert bus.breakers() == {"all": "closed", "publish:t": "open"}
    assert bus.stats().subscribers["all"].rejected == refused + len(seen)
    g.open()


# -- the breaker on its own ----------------------------------------------------------------


def test_breaker_unit_probe_budget_and_retry_after() -> None:
    clock = FakeClock()
    changes: list[tuple[str, str]] = []
    policy = BreakerPolicy(consecutive_failures=2, cooldown=3.0, probes=2)
    b = CircuitBreaker("b", policy, clock, lambda br, old, new, why: changes.append((old, new)))
    assert b.try_acquire()
    b.record_failure()
    b.record_failure()
    assert b.state == "open" and b.retry_after() == 3.0
    with pytest.raises(CircuitOpenError) as info:
        b.acquire()
    assert info.value.retry_after == 3.0
    clock._now = 2.0  # a synchronous test moves time directly
    assert not b.try_acquire() and b.retry_after() == 1.0
    clock._now = 3.0
    assert b.try_acquire() and b.try_acquire()
    assert not b.try_acquire()  # only ``probes`` calls, never every waiter
    assert b.state == "half_open" and b.retry_after() == 0.0
    b.record_success()
    assert b.state == "half_open"
    b.record_success()
    assert b.state == "closed"
    assert changes == [("closed", "open"), ("open", "half_open"), ("half_open", "closed")]


def test_breaker_policy_validation() -> None:
    assert DEFAULT_BREAKER.probes == 1
    for bad in (
        {"consecutive_failures": 0},
        {"window": 0},
        {"min_calls": 0},
        {"failure_rate": 0.0},
        {"failure_rate": 1.5},
        {"cooldown": -1.0},
        {"probes": 0},
    ):
        with pytest.raises(ValueError):
            BreakerPolicy(**bad)


def test_a_zero_cooldown_is_refused() -> None:
    with pytest.raises(ValueError, match="cooldown"):
        BreakerPolicy(cooldown=0)


@pytest.mark.parametrize("pattern", [">", "*.>"])
async def test_a_breaker_report_never_feeds_its_own_breaker(pattern: str) -> None:
    """A failing catch-all handler receives its own breaker's reports. Fed back, each report
    is a failing half-open probe (with a tiny cooldown on the real clock): thousands of trips a
    second and a drain that never ends."""
    calls: list[str] = []

    async def fail(env: Envelope) -> None:
        calls.append(env.topic)
        raise RuntimeError("down")

    async with Bus() as bus:
        bus.on(
            pattern,
            fail,
            name="sub",
            breaker=BreakerPolicy(consecutive_failures=1, cooldown=1e-9),
        )
        with capture_events(bus, "system.breaker.sub") as reports:
            await bus.emit("t.x", 1)
            async with asyncio.timeout(2):
                await bus.drain()
        assert calls == ["t.x"]
        assert bus.breaker("sub").trips == 1
        assert len(reports) == 1
        # Reports are still delivered to every other subscription.
        assert [e.subscriber for e in bus.dlq.entries()] == ["sub"]


async def test_a_hung_half_open_probe_times_out_and_counts_as_failed(
    bus: Bus, clock: FakeClock, gate
) -> None:
    policy = BreakerPolicy(consecutive_failures=1, cooldown=10.0, probe_timeout=5.0)
    hang = gate()
    mode = {"value": "fail"}

    async def handler(env: Envelope) -> str:
        if mode["value"] == "fail":
            raise ConnectionError("down")
        if mode["value"] == "hang":
            await hang.wait()
        return "ok"

    bus.on("t", handler, name="sub", breaker=policy, concurrency=2)
    await _emit_all(bus, 1)
    assert bus.breakers()["sub"] == "open"
    await clock.advance(10.0)
    mode["value"] = "hang"
    await bus.emit("t", 2)  # the probe: it hangs
    for _ in range(5):
        await asyncio.sleep(0)
    assert hang.waiting == 1 and bus.breakers()["sub"] == "half_open"
    mode["value"] = "ok"
    await clock.advance(5.0)
    await bus.emit("t", 3)  # past the probe deadline: the probe failed, the breaker reopened
    for _ in range(5):
        await asyncio.sleep(0)
    assert bus.breakers()["sub"] == "open"
    await clock.advance(10.0)
    await bus.emit("t", 4)  # a new probe, which succeeds
    for _ in range(5):
        await asyncio.sleep(0)
    assert bus.breakers()["sub"] == "closed"
    hang.open()
    await bus.drain()


def test_probe_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="probe_timeout"):
        BreakerPolicy(probe_timeout=0)


def test_a_probe_released_without_an_outcome_frees_its_slot(clock: FakeClock) -> None:
    breaker = CircuitBreaker("b", BreakerPolicy(consecutive_failures=1, cooldown=1.0), clock)
    breaker.record_failure()
    clock._now += 1.0
    assert breaker.try_acquire() and breaker.state == "half_open"
    assert not breaker.try_acquire()
    breaker.release()  # the probe was cancelled: neither success nor failure
    assert breaker.try_acquire()
