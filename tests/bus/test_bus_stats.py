"""What ``bus.stats()`` reports: counters, latency histograms, hop edges."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

from bus import Bus, BusStats, Envelope, LatencySummary
from bus._metrics import Histogram, bucket


async def test_counters_per_subscriber_and_topic(bus: Bus) -> None:
    @bus.on("orders.*", name="orders")
    async def orders(env: Envelope) -> None:
        if env.payload == "bad":
            raise ValueError("bad order")

    bus.on("orders.created", lambda env: None, name="created", filter=lambda p: p != "skip")
    for payload in ["a", "b", "bad", "skip"]:
        await bus.emit("orders.created", payload)
    await bus.emit("orders.paid", "c")
    await bus.emit("nobody.listens")
    await bus.drain()
    stats = bus.stats()
    assert isinstance(stats, BusStats)
    assert stats.published == 6
    assert {t: s.published for t, s in stats.topics.items()} == {
        "orders.created": 4,
        "orders.paid": 1,
        "nobody.listens": 1,
    }
    o = stats.subscribers["orders"]
    assert (o.pattern, o.published, o.delivered, o.dead_lettered, o.failures) == (
        "orders.*",
        5,
        4,
        1,
        1,
    )
    c = stats.subscribers["created"]
    assert (c.published, c.delivered, c.filtered) == (3, 3, 1)
    assert stats.dlq_size == 1 and stats.dlq_evicted == 0
    assert stats.breakers == {"orders": "closed", "created": "closed"}
    assert o.max_queue == 10_000 and o.queued == 0 and o.in_flight == 0


async def test_handling_and_queue_wait_histograms_are_filled(bus: Bus) -> None:
    @bus.on("t", name="sleepy")
    async def sleepy(env: Envelope) -> None:
        await asyncio.sleep(0.002)

    for _ in range(5):
        await bus.emit("t")
    await bus.drain()
    s = bus.stats().subscribers["sleepy"]
    assert s.handling.count == 5
    assert s.handling.p50_us >= 1500  # each handling slept 2 ms
    assert s.handling.max_us >= s.handling.p99_us >= s.handling.p50_us > 0
    assert s.handling.mean_us >= 1500
    assert s.queue_wait.count == 5
    # The last of five queued behind four 2 ms handlings waited at least 6 ms.
    assert s.queue_wait.max_us >= 6000


async def test_edges_are_keyed_by_source_subscription(bus: Bus) -> None:
    @bus.on("in", name="front")
    async def front(env: Envelope) -> None:
        await bus.emit("mid")

    @bus.on("mid", name="middle")
    async def middle(env: Envelope) -> None:
        await bus.emit("out")

    bus.on("out", lambda env: None, name="back")
    bus.on(">", lambda env: None, name="audit")
    for _ in range(3):
        await bus.emit("in")
    await bus.drain()
    edges = {(e.source, e.target): e.queue_wait.count for e in bus.stats().edges}
    assert edges == {
        ("<outside>", "front"): 3,
        ("front", "middle"): 3,
        ("middle", "back"): 3,
        ("<outside>", "audit"): 3,
        ("front", "audit"): 3,
        ("middle", "audit"): 3,
    }


async def test_stats_is_a_frozen_snapshot(bus: Bus) -> None:
    bus.on("t", lambda env: None, name="s")
    await bus.emit("t")
    await bus.drain()
    before = bus.stats()
    await bus.emit("t")
    await bus.drain()
    assert before.subscribers["s"].delivered == 1
    assert bus.stats().subscribers["s"].delivered == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        before.published = 0  # type: ignore[misc]
    as_dict = before.to_dict()
    assert as_dict["subscribers"]["s"]["delivered"] == 1
    assert as_dict["published"] == 1


async def test_queue_depth_and_in_flight_while_running(bus: Bus, gate, until) -> None:
    g = gate()

    @bus.on("t", name="s", concurrency=2)
    async def s(env: Envelope) -> None:
        await g.wait()

    for _ in range(7):
        await bus.emit("t")
    await until(lambda: g.waiting == 2)
    snap = bus.stats().subscribers["s"]
    assert (snap.queued, snap.in_flight, snap.published) == (5, 2, 7)
    assert bus.outstanding == 7
    g.open()
    await bus.drain()
    assert bus.outstanding == 0


def test_histogram_quantiles_are_within_bucket_error() -> None:
    h = Histogram()
    values = [1_000 * i for i in range(1, 1001)]  # 1 µs .. 1 ms
    for v in values:
        h.record(v)
    s = h.summary()
    assert isinstance(s, LatencySummary)
    assert s.count == 1000
    assert s.max_us == 1000.0
    assert s.mean_us == pytest.approx(500.5)
    for q, got in [(0.5, s.p50_us), (0.95, s.p95_us), (0.99, s.p99_us)]:
        exact = values[int(q * 1000) - 1] / 1000
        assert abs(got - exact) / exact <= 0.125


def test_histogram_buckets_are_monotonic_and_merge_adds() -> None:
    slots = [bucket(n) for n in range(0, 1 << 20, 7)]
    assert slots == sorted(slots)
    assert bucket(-5) == 0 and bucket(1 << 80) == 511
    a, b = Histogram(), Histogram()
    a.record(100)
    b.record(5_000)
    b.record(7)
    a.merge(b)
    assert a.count == 3 and a.total == 5_107 and a.max == 5_000
    assert Histogram().summary().count == 0 and Histogram().quantile(0.5) == 0.0


async def test_stats_after_close_keep_every_count() -> None:
    # A run's final summary is read after the bus closed: closing must not drop counts.
    async with Bus() as b:
        b.on("t", lambda env: None, name="s")
        for _ in range(3):
            await b.emit("t")
        await b.emit("nobody")
    stats = b.stats()
    assert {t: s.published for t, s in stats.topics.items()} == {"t": 3, "nobody": 1}
    assert stats.published == 4
    assert stats.subscribers["s"].delivered == 3
