"""Per-subscription mailboxes: priority order, isolation, concurrency, backpressure."""

from __future__ import annotations

import asyncio
import itertools
import sys
import time

import pytest

from bus import Bus, Envelope, Priority, QueueFullError


async def test_critical_is_handled_before_waiting_high_and_normal(bus: Bus, gate, until) -> None:
    g = gate()
    order: list[str] = []

    @bus.on("work", name="worker")
    async def worker(env: Envelope) -> None:
        if env.payload == "blocker":
            await g.wait()
        order.append(env.payload)

    await bus.emit("work", "blocker")
    await until(lambda: g.waiting == 1)  # the worker holds "blocker"; the rest queue up
    await bus.emit("work", "n1", Priority.NORMAL)
    await bus.emit("work", "h1", Priority.HIGH)
    await bus.emit("work", "n2", Priority.NORMAL)
    await bus.emit("work", "c1", Priority.CRITICAL)
    await bus.emit("work", "h2", Priority.HIGH)
    await bus.emit("work", "c2", Priority.CRITICAL)
    g.open()
    await bus.drain()
    assert order == ["blocker", "c1", "c2", "h1", "h2", "n1", "n2"]


async def test_critical_arriving_mid_stream_overtakes_queued_normal(bus: Bus, gate, until) -> None:
    g = gate()
    order: list[object] = []

    @bus.on("work", name="worker")
    async def worker(env: Envelope) -> None:
        if env.payload == 0:
            await g.wait()
        order.append(env.payload)
        if env.payload == 1:  # while 2..9 still wait, a CRITICAL arrives
            await bus.emit("work", "urgent", Priority.CRITICAL)

    for i in range(10):
        await bus.emit("work", i)
    await until(lambda: g.waiting == 1)
    g.open()
    await bus.drain()
    assert order == [0, 1, "urgent", 2, 3, 4, 5, 6, 7, 8, 9]


async def test_same_priority_is_first_in_first_out(bus: Bus) -> None:
    got: list[int] = []
    bus.on("t", lambda env: got.append(env.payload), name="rec")
    for i in range(500):
        await bus.emit("t", i)
    await bus.drain()
    assert got == list(range(500))


async def test_a_slow_subscriber_does_not_delay_a_fast_one(bus: Bus, gate, until) -> None:
    g = gate()
    slow_got: list[int] = []
    fast_got: list[int] = []

    @bus.on("t", name="slow")
    async def slow(env: Envelope) -> None:
        await g.wait()
        slow_got.append(env.payload)

    bus.on("t", lambda env: fast_got.append(env.payload), name="fast")

    for i in range(50):
        await bus.emit("t", i)
    await until(lambda: len(fast_got) == 50)
    assert slow_got == []
    assert g.waiting == 1
    stats = bus.stats().subscribers
    assert stats["slow"].queued == 49 and stats["slow"].in_flight == 1
    assert stats["fast"].delivered == 50
    g.open()
    await bus.drain()
    assert slow_got == list(range(50))


async def test_a_handler_that_never_suspends_does_not_starve_others(bus: Bus) -> None:
    """Both handlers are synchronous; a worker that has held the loop for FAIRNESS_NS
    (1 ms) yields, so the other subscription runs within a millisecond or two of busy
    work, not after the whole backlog."""

    def busy(env: Envelope) -> None:
        end = time.perf_counter() + 50e-6  # 50 µs of CPU: a yield is due every ~20
        while time.perf_counter() < end:
            pass
        a_done.append(env.payload)

    a_done: list[int] = []
    b_seen_when: list[int] = []
    bus.on("a", busy, name="busy", max_queue=5000)
    bus.on("b", lambda env: b_seen_when.append(len(a_done)), name="other")
    for i in range(2000):
        await bus.emit("a", i)
    await bus.emit("b")
    await bus.drain()
    assert len(a_done) == 2000
    # The clock is read every FAIRNESS_CHECK (16) messages: at most 2 checks' worth.
    assert b_seen_when and b_seen_when[0] <= 2 * 16 + 16


async def test_concurrency_four_handles_four_at_once(bus: Bus, gate, until) -> None:
    g = gate()
    in_flight = 0
    peak = 0
    done = 0

    @bus.on("job", name="pool", concurrency=4)
    async def pool(env: Envelope) -> None:
        nonlocal in_flight, peak, done
        in_flight += 1
        peak = max(peak, in_flight)
        await g.wait()
        in_flight -= 1
        done += 1

    for i in range(10):
        await bus.emit("job", i)
    await until(lambda: in_flight == 4)
    for _ in range(50):  # give a fifth worker every chance to show up
        await asyncio.sleep(0)
    assert in_flight == 4 and peak == 4
    assert bus.stats().subscribers["pool"].in_flight == 4
    assert bus.stats().subscribers["pool"].queued == 6
    g.open()
    await bus.drain()
    assert done == 10 and peak == 4


async def test_default_concurrency_is_one_and_in_order(bus: Bus) -> None:
    in_flight = 0
    peak = 0
    order: list[int] = []

    @bus.on("job", name="serial")
    async def serial(env: Envelope) -> None:
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0)
        order.append(env.payload)
        in_flight -= 1

    for i in range(20):
        await bus.emit("job", i)
    await bus.drain()
    assert peak == 1 and order == list(range(20))


# -- overflow: block -----------------------------------------------------------------------


async def _fill(bus: Bus, g, until, topic: str = "t", n: int = 2) -> None:
    """One message held by the handler, ``n - 1`` more in the mailbox."""
    await bus.emit(topic, "fill0")
    await until(lambda: g.waiting == 1)
    for i in range(1, n):
        await bus.emit(topic, f"fill{i}")


async def test_block_waits_for_space_then_continues(bus: Bus, gate, until) -> None:
    g = gate()
    got: list[str] = []

    @bus.on("t", name="sub", max_queue=1, overflow="block", block_timeout=5.0)
    async def sub(env: Envelope) -> None:
        await g.wait()
        got.append(env.payload)

    await _fill(bus, g, until)
    publisher = asyncio.create_task(bus.emit("t", "waiting"))
    for _ in range(20):
        await asyncio.sleep(0)
    assert not publisher.done()  # the mailbox is full: the publisher waits
    g.open()
    env = await asyncio.wait_for(publisher, 1.0)
    await bus.drain()
    assert got == ["fill0", "fill1", "waiting"]
    assert env.payload == "waiting"
    stats = bus.stats().subscribers["sub"]
    assert stats.published == 3 and stats.delivered == 3 and stats.rejected == 0


async def test_block_times_out_with_queue_full_error(bus: Bus, gate, until) -> None:
    g = gate()

    @bus.on("t", name="sub", max_queue=1, overflow="block", block_timeout=0.05)
    async def sub(env: Envelope) -> None:
        await g.wait()

    await _fill(bus, g, until)
    started = time.monotonic()
    with pytest.raises(QueueFullError) as info:
        await bus.emit("t", "late")
    waited = time.monotonic() - started
    assert 0.04 <= waited < 1.0
    assert info.value.subscribers == ["sub"] and info.value.topic == "t"
    stats = bus.stats().subscribers["sub"]
    assert stats.rejected == 1 and stats.published == 2
    g.open()


async def test_emit_nowait_raises_instead_of_blocking(bus: Bus, gate, until) -> None:
    g = gate()

    @bus.on("t", name="sub", max_queue=1, overflow="block", block_timeout=30.0)
    async def sub(env: Envelope) -> None:
        await g.wait()

    bus.emit_nowait("t", "a")
    await until(lambda: g.waiting == 1)
    env = bus.emit_nowait("t", "b")
    assert env.payload == "b"
    started = time.monotonic()
    with pytest.raises(QueueFullError):
        bus.emit_nowait("t", "c")
    assert time.monotonic() - started < 0.5
    assert bus.stats().subscribers["sub"].rejected == 1
    g.open()


async def test_a_full_subscriber_does_not_stop_delivery_to_the_others(
    bus: Bus, gate, until
) -> None:
    # Fan-out is not transactional: the subscriber with room still gets the message.
    g = gate()
    other: list[str] = []

    @bus.on("t", name="full", max_queue=1, overflow="reject")
    async def full(env: Envelope) -> None:
        await g.wait()

    bus.on("t", lambda env: other.append(env.payload), name="other")
    await _fill(bus, g, until)
    with pytest.raises(QueueFullError) as info:
        await bus.emit("t", "x")
    assert info.value.subscribers == ["full"]
    await until(lambda: "x" in other)
    g.open()


# -- overflow: reject ----------------------------------------------------------------------


async def test_reject_raises_at_once_and_counts(bus: Bus, gate, until) -> None:
    g = gate()
    got: list[str] = []

    @bus.on("t", name="sub", max_queue=2, overflow="reject", block_timeout=30.0)
    async def sub(env: Envelope) -> None:
        await g.wait()
        got.append(env.payload)

    await _fill(bus, g, until, n=3)
    for i in range(2):
        started = time.monotonic()
        with pytest.raises(QueueFullError):
            await bus.emit("t", f"no{i}")
        assert time.monotonic() - started < 0.5
    stats = bus.stats().subscribers["sub"]
    assert stats.rejected == 2 and stats.published == 3 and stats.queued == 2
    g.open()
    await bus.drain()
    assert got == ["fill0", "fill1", "fill2"]
    assert len(bus.dlq) == 0  # refused to the publisher, never accepted: not a dead letter


# -- overflow: shed ------------------------------------------------------------------------


async def test_shed_drops_lowest_priority_oldest_and_records_it(bus: Bus, gate, until) -> None:
    g = gate()
    got: list[str] = []

    @bus.on("t", name="sub", max_queue=3, overflow="shed")
    async def sub(env: Envelope) -> None:
        await g.wait()
        got.append(env.payload)

    await bus.emit("t", "held")
    await until(lambda: g.waiting == 1)
    await bus.emit("t", "n1", Priority.NORMAL)
    await bus.emit("t", "h1", Priority.HIGH)
    await bus.emit("t", "n2", Priority.NORMAL)  # mailbox full now: n1, h1, n2
    await bus.emit("t", "h2", Priority.HIGH)  # sheds n1 (lowest priority, oldest)
    await bus.emit("t", "c1", Priority.CRITICAL)  # sheds n2
    await bus.emit("t", "n3", Priority.NORMAL)  # nothing lower waits: the new one is shed
    await bus.emit("t", "c2", Priority.CRITICAL)  # sheds h1 (oldest HIGH)
    g.open()
    await bus.drain()
    assert got == ["held", "c1", "c2", "h2"]
    shed = bus.dlq.entries(reason="shed")
    assert [e.envelope.payload for e in shed] == ["n1", "n2", "n3", "h1"]
    assert all(e.subscriber == "sub" for e in shed)
    stats = bus.stats().subscribers["sub"]
    assert stats.shed == 4 and stats.published == 8 and stats.delivered == 4
    assert stats.published == stats.delivered + stats.dead_lettered + stats.shed


async def test_shed_never_drops_critical(bus: Bus, gate, until) -> None:
    g = gate()
    got: list[str] = []

    @bus.on("t", name="sub", max_queue=2, overflow="shed", block_timeout=0.05)
    async def sub(env: Envelope) -> None:
        await g.wait()
        got.append(env.payload)

    await bus.emit("t", "held", Priority.CRITICAL)
    await until(lambda: g.waiting == 1)
    await bus.emit("t", "c1", Priority.CRITICAL)
    await bus.emit("t", "c2", Priority.CRITICAL)
    # Only CRITICAL waits: a lower one is shed itself, a CRITICAL one waits like ``block``.
    await bus.emit("t", "n", Priority.NORMAL)
    with pytest.raises(QueueFullError):
        bus.emit_nowait("t", "c3", Priority.CRITICAL)
    with pytest.raises(QueueFullError):
        await bus.emit("t", "c4", Priority.CRITICAL)
    late = asyncio.create_task(bus.emit("t", "c5", Priority.CRITICAL))
    await asyncio.sleep(0)
    g.open()
    await late
    await bus.drain()
    assert got == ["held", "c1", "c2", "c5"]
    assert [e.envelope.payload for e in bus.dlq.entries()] == ["n"]
    assert all(e.envelope.priority != Priority.CRITICAL for e in bus.dlq.entries(reason="shed"))


# -- mixed policies in one fan-out ---------------------------------------------------------


async def _mixed(bus: Bus, gate, until, block_timeout: float):
    hold_block, hold_reject = gate(), gate()
    got: dict[str, list[str]] = {"blk": [], "rej": []}

    @bus.on("t", name="blk", max_queue=1, overflow="block", block_timeout=block_timeout)
    async def blk(env: Envelope) -> None:
        await hold_block.wait()
        got["blk"].append(env.payload)

    @bus.on("t", name="rej", max_queue=1, overflow="reject")
    async def rej(env: Envelope) -> None:
        await hold_reject.wait()
        got["rej"].append(env.payload)

    await bus.emit("t", "held")
    await until(lambda: hold_block.waiting == 1 and hold_reject.waiting == 1)
    await bus.emit("t", "queued")
    return hold_block, hold_reject, got


async def test_a_reject_in_the_same_fan_out_does_not_skip_a_blocking_subscriber(
    bus: Bus, gate, until
) -> None:
    hold_block, hold_reject, _ = await _mixed(bus, gate, until, block_timeout=0.02)
    with pytest.raises(QueueFullError) as info:
        await bus.emit("t", "both full")
    # Both refused it, and both say so: neither copy disappears silently.
    assert sorted(info.value.subscribers) == ["blk", "rej"]
    stats = bus.stats().subscribers
    assert stats["blk"].rejected == 1 and stats["rej"].rejected == 1
    with pytest.raises(QueueFullError) as info:
        bus.emit_nowait("t", "both full, no wait")
    assert sorted(info.value.subscribers) == ["blk", "rej"]
    hold_block.open()
    hold_reject.open()


async def test_a_blocking_subscriber_still_gets_the_message_when_space_frees(
    bus: Bus, gate, until
) -> None:
    hold_block, hold_reject, got = await _mixed(bus, gate, until, block_timeout=5.0)
    publisher = asyncio.create_task(bus.emit("t", "late"))
    await asyncio.sleep(0)
    assert not publisher.done()  # waiting for blk's room even though rej refused at once
    hold_block.open()
    with pytest.raises(QueueFullError) as info:
        await asyncio.wait_for(publisher, 1.0)
    assert info.value.subscribers == ["rej"]
    hold_reject.open()
    await bus.drain()
    assert got == {"blk": ["held", "queued", "late"], "rej": ["held", "queued"]}


async def test_shedding_builds_no_record_until_one_is_read_and_keeps_a_bounded_sample(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A shed costs a count and a bare tuple: no DeadLetter and no QueueFullError per
    message (they made shedding 8x dearer than delivering under a runaway publisher).
    The record is the newest ``dlq_size``; the counters stay exact."""
    import bus._dlq
    import bus._errors

    built = {"letters": 0, "errors": 0}

    class CountedLetter(bus._dlq.DeadLetter):
        __slots__ = ()

        def __init__(self, *args: object, **kwargs: object) -> None:
            built["letters"] += 1
            super().__init__(*args, **kwargs)  # type: ignore[arg-type]

    class CountedError(bus._errors.QueueFullError):
        def __init__(self, *args: object) -> None:
            built["errors"] += 1
            super().__init__(*args)  # type: ignore[arg-type]

    for module in list(sys.modules.values()):
        if getattr(module, "__name__", "").startswith("bus.") or module is bus:
            for name, value in list(vars(module).items()):
                if value is bus._dlq.DeadLetter:
                    monkeypatch.setattr(module, name, CountedLetter)
                elif value is bus._errors.QueueFullError:
                    monkeypatch.setattr(module, name, CountedError)
    async with Bus(dlq_size=50) as b:
        gate = asyncio.Event()

        @b.on("t", name="slow", max_queue=10, overflow="shed")
        async def slow(env: Envelope) -> None:
            await gate.wait()

        for i in range(1000):
            b.emit_nowait("t", i)
        s = b.stats().subscribers["slow"]
        assert (s.published, s.shed, s.queued, s.in_flight) == (1000, 990, 10, 0)
        assert built == {"letters": 0, "errors": 0}
        assert b.dlq.totals == {"shed": 990} and len(b.dlq) == 50 and b.dlq.evicted == 940
        sample = b.dlq.entries(reason="shed")
        assert [e.envelope.payload for e in sample] == list(range(940, 990))
        assert built["letters"] == 50  # built once, when read
        assert b.dlq.get(sample[0].entry_id) is sample[0]
        gate.set()


async def test_a_flood_of_sheds_is_listed_as_a_sample_and_counted_exactly() -> None:
    """Past the first SHED_LIST_ALL sheds a subscription lists one in SHED_SAMPLE (listing
    every one cost more than the enqueue it replaces); ``shed``, the DLQ's ``totals`` and
    ``evicted`` still count every one. An observer attached mid-flood (a session recorder)
    gets every shed from then on."""
    from bus._subscription import SHED_LIST_ALL, SHED_SAMPLE

    async with Bus(dlq_size=100_000) as b:
        gate = asyncio.Event()

        @b.on("t", name="slow", max_queue=10, overflow="shed")
        async def slow(env: Envelope) -> None:
            await gate.wait()

        flood = SHED_LIST_ALL + 100 * SHED_SAMPLE
        for i in range(10 + flood):
            b.emit_nowait("t", i)
        listed = b.dlq.entries(reason="shed")
        assert b.stats().subscribers["slow"].shed == flood
        assert len(listed) == SHED_LIST_ALL + 100
        assert b.dlq.totals == {"shed": flood}
        assert len(b.dlq) + b.dlq.evicted == flood
        # The sample is spread over the flood: one in SHED_SAMPLE of the sheds after the first.
        tail = [e.envelope.payload for e in listed[SHED_LIST_ALL:]]
        assert tail == list(range(SHED_LIST_ALL + SHED_SAMPLE - 1, flood, SHED_SAMPLE))

        seen: list[int] = []

        class Watch:
            def on_dead_letter(self, dl: object) -> None:
                seen.append(dl.envelope.payload)  # type: ignore[attr-defined]

        b.observe(Watch())
        for i in range(10 + flood, 10 + flood + 50):
            b.emit_nowait("t", i)
        assert seen == list(range(flood, flood + 50))
        assert b.dlq.totals == {"shed": flood + 50}
        gate.set()


async def test_a_worker_with_slow_handlers_looks_at_the_clock_sooner(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The clock is read every 16 messages while handlers are cheap; a handler that takes
    5 ms without suspending would then hold the loop 80 ms before the worker yields. The
    worker halves the stretch each time it overshoots the 1 ms budget twice over, down to
    one handling. The clock here is the worker's own, moved 5 ms by each handling."""
    import bus._worker

    clock = [0]
    monkeypatch.setattr(bus._worker, "_monotonic_ns", lambda: clock[0])
    done: list[int] = []

    def slow(env: Envelope) -> None:
        clock[0] += 5_000_000
        done.append(env.payload)

    async with Bus() as b:
        b.on("slow", slow, name="slow", max_queue=1000)
        for i in range(60):
            await b.emit("slow", i)
        seen: list[int] = []

        async def probe() -> None:  # runs once per loop pass: between the worker's turns
            while len(done) < 60:
                seen.append(len(done))
                await asyncio.sleep(0)

        await asyncio.gather(probe(), b.drain())
    seen = [0, *seen, len(done)]  # the worker may have had its first turn before the probe
    per_turn = [after - before for before, after in itertools.pairwise(seen) if after > before]
    assert per_turn[:5] == [16, 8, 4, 2, 1]
    assert set(per_turn[5:]) == {1}
