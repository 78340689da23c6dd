"""The OTel instruments report what the bus counted: the same numbers as ``bus.stats()``."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest
from telemetry_helpers import Traced

from bus import Bus, Envelope, QueueFullError, Retry
from pantheon.telemetry import Telemetry


async def until(condition: Callable[[], bool]) -> None:
    """Yield to the loop until ``condition`` holds (a deadline, never a fixed sleep)."""
    async with asyncio.timeout(5):
        while not condition():  # noqa: ASYNC110 - polls bus state no event reports
            await asyncio.sleep(0)


def series(points: list[tuple[dict[str, object], float]], key: str) -> dict[object, float]:
    return {attrs[key]: value for attrs, value in points}


async def test_instruments_equal_the_bus_counters(traced: Traced) -> None:
    hold = asyncio.Event()

    async def ok(env: Envelope) -> None:
        return None

    async def failing(env: Envelope) -> None:
        raise RuntimeError("no")

    async def held(env: Envelope) -> None:
        await hold.wait()

    async with Bus(session_id="m-1") as bus:
        traced.telemetry.instrument(bus)
        bus.on("work.*", ok, name="ok")
        bus.on("work.*", failing, name="failing", retry=Retry(attempts=2))
        bus.on("slow.*", held, name="slow", max_queue=2, overflow="shed")
        bus.on("strict.*", held, name="strict", max_queue=1, overflow="reject")
        for i in range(5):
            await bus.emit("work.item", i)
        for i in range(6):
            await bus.emit("slow.item", i)
        await until(lambda: bus.subscriptions()["slow"].in_flight == 1)
        await bus.emit("strict.item", 0)
        await until(lambda: bus.subscriptions()["strict"].in_flight == 1)
        await bus.emit("strict.item", 1)  # fills the one-message mailbox
        with pytest.raises(QueueFullError):
            await bus.emit("strict.item", 2)
        bus.breaker("ok").force_open()

        # Mid-run: queue depth and in-flight gauges read the live mailboxes.
        live = traced.metrics()
        stats = bus.stats()
        depth = series(live["pantheon.queue.depth"], "subscription")
        assert depth == {name: s.queued for name, s in stats.subscribers.items()}
        assert depth["slow"] == 1 and depth["strict"] == 1
        in_flight = series(live["pantheon.messages.in_flight"], "subscription")
        assert in_flight["slow"] == 1 and in_flight["strict"] == 1
        breakers = series(live["pantheon.breaker.state"], "breaker")
        assert breakers["ok"] == 2 and breakers["failing"] in (0, 2)

        hold.set()
        bus.breaker("ok").reset()
        await bus.drain()

        metrics = traced.metrics()
        stats = bus.stats()

    published = series(metrics["pantheon.messages.published"], "topic")
    assert published == {t: s.published for t, s in stats.topics.items()}
    assert published["work.item"] == 5
    for instrument, field in (
        ("accepted", "published"),
        ("delivered", "delivered"),
        ("failed", "failures"),
        ("retried", "retries"),
        ("dead_lettered", "dead_lettered"),
        ("shed", "shed"),
        ("rejected", "rejected"),
    ):
        got = series(metrics[f"pantheon.messages.{instrument}"], "subscription")
        want = {name: getattr(s, field) for name, s in stats.subscribers.items()}
        assert got == want, instrument
    assert series(metrics["pantheon.messages.failed"], "subscription")["failing"] >= 5
    assert series(metrics["pantheon.messages.shed"], "subscription")["slow"] > 0
    assert series(metrics["pantheon.messages.rejected"], "subscription")["strict"] > 0
    [(attrs, dlq)] = metrics["pantheon.dlq.size"]
    assert dlq == stats.dlq_size and attrs == {"session": "m-1"}
    assert all(attrs["session"] == "m-1" for attrs, _ in metrics["pantheon.messages.delivered"])
    trips = series(metrics["pantheon.breaker.trips"], "subscription")
    assert trips == {name: s.breaker_trips for name, s in stats.subscribers.items()}


async def test_hop_latency_quantiles_come_from_the_bus_histograms(traced: Traced) -> None:
    async with Bus() as bus:
        traced.telemetry.instrument(bus)

        async def relay(env: Envelope) -> None:
            await bus.emit("hop.b", None)

        bus.on("hop.a", relay, name="relay")
        bus.on("hop.b", lambda env: None, name="sink")
        for _ in range(50):
            await bus.emit("hop.a", None)
        await bus.drain()
        stats = bus.stats()
        metrics = traced.metrics()

    waits = {
        (a["subscription"], a["source"], a["quantile"]): v
        for a, v in metrics["pantheon.hop.queue_wait"]
    }
    [edge] = [e for e in stats.edges if e.target == "sink"]
    assert edge.source == "relay"
    assert waits[("sink", "relay", 0.99)] == edge.queue_wait.p99_us / 1e6
    assert waits[("sink", "relay", 1.0)] == edge.queue_wait.max_us / 1e6
    assert waits[("relay", "<outside>", 0.5)] > 0
    handling = {(a["subscription"], a["quantile"]): v for a, v in metrics["pantheon.hop.handling"]}
    assert handling[("relay", 0.95)] == stats.subscribers["relay"].handling.p95_us / 1e6


async def test_one_collection_reads_one_snapshot_and_the_next_sees_new_counts(
    traced: Traced,
) -> None:
    async with Bus() as bus:
        traced.telemetry.instrument(bus)
        bus.on("c.*", lambda env: None, name="c")
        await bus.emit("c.1", None)
        await bus.drain()
        first = series(traced.metrics()["pantheon.messages.delivered"], "subscription")
        await bus.emit("c.1", None)
        await bus.drain()
        second = series(traced.metrics()["pantheon.messages.delivered"], "subscription")
    assert (first["c"], second["c"]) == (1, 2)


async def test_metrics_off_registers_no_instruments() -> None:
    telemetry = Telemetry.from_env(
        metrics=False, environ={"OTEL_METRICS_EXPORTER": "console", "OTEL_TRACES_EXPORTER": "none"}
    )
    assert telemetry.metrics is None and telemetry.tracer is None and not telemetry.enabled
