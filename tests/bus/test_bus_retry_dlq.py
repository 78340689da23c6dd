"""Retries on the bus clock, and the dead letter queue: contents, redrive, bound."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from bus import BreakerPolicy, Bus, DeadLetter, Envelope, QueueFullError, Retry
from bus.testing import FakeClock


class Flaky:
    """Fails its first ``failures`` calls with ValueError, then succeeds."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[object] = []

    async def __call__(self, env: Envelope) -> str:
        self.calls.append(env.payload)
        if len(self.calls) <= self.failures:
            explode_in_handler(len(self.calls))
        return "ok"


def explode_in_handler(n: int) -> None:
    raise ValueError(f"failure number {n}")


async def test_retry_then_succeed(bus: Bus) -> None:
    flaky = Flaky(failures=2)
    bus.on("t", flaky, name="flaky", retry=Retry(attempts=3))
    await bus.emit("t", "m")
    await bus.drain()
    assert flaky.calls == ["m", "m", "m"]
    stats = bus.stats().subscribers["flaky"]
    assert (stats.delivered, stats.dead_lettered, stats.failures, stats.retries) == (1, 0, 2, 2)
    assert len(bus.dlq) == 0


async def test_retries_exhausted_go_to_the_dlq_with_the_traceback(bus: Bus) -> None:
    flaky = Flaky(failures=10)
    bus.on("t", flaky, name="flaky", retry=Retry(attempts=3))
    sent = await bus.emit("t", "m")
    await bus.drain()
    assert len(flaky.calls) == 3
    [entry] = bus.dlq.entries()
    assert isinstance(entry, DeadLetter)
    assert entry.envelope is sent
    assert entry.subscriber == "flaky"
    assert entry.reason == "failed"
    assert entry.attempts == 3
    assert entry.error_type == "ValueError"
    assert entry.error == "failure number 3"  # the last attempt's error
    assert entry.traceback is not None
    assert "explode_in_handler" in entry.traceback
    assert "ValueError: failure number 3" in entry.traceback
    stats = bus.stats().subscribers["flaky"]
    assert (stats.delivered, stats.dead_lettered, stats.failures, stats.retries) == (0, 1, 3, 2)


async def test_no_retry_by_default(bus: Bus) -> None:
    flaky = Flaky(failures=1)
    bus.on("t", flaky, name="flaky")
    await bus.emit("t")
    await bus.drain()
    assert len(flaky.calls) == 1
    assert bus.dlq.entries()[0].attempts == 1


async def test_backoff_waits_on_the_bus_clock(bus: Bus, clock: FakeClock, until) -> None:
    flaky = Flaky(failures=2)
    bus.on("t", flaky, name="flaky", retry=Retry(attempts=3, backoff=1.0, multiplier=3.0))
    await bus.emit("t")
    await until(lambda: clock.sleepers == 1)
    assert len(flaky.calls) == 1
    await clock.advance(0.999)
    assert len(flaky.calls) == 1  # not before the first backoff (1.0) has passed
    await clock.advance(0.001)
    await until(lambda: len(flaky.calls) == 2)
    await until(lambda: clock.sleepers == 1)
    await clock.advance(2.9)
    assert len(flaky.calls) == 2  # the second backoff is 1.0 * 3
    await clock.advance(0.1)
    await bus.drain()
    assert len(flaky.calls) == 3
    assert bus.stats().subscribers["flaky"].delivered == 1


def test_retry_delay_and_validation() -> None:
    r = Retry(attempts=5, backoff=0.5, multiplier=2.0, max_backoff=3.0)
    assert [r.delay(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 2.0, 3.0]
    with pytest.raises(ValueError):
        Retry(attempts=0)
    with pytest.raises(ValueError):
        Retry(backoff=-1)
    with pytest.raises(ValueError):
        Retry(multiplier=0.5)


async def test_a_failing_handler_lands_in_the_dlq_and_others_are_unaffected(bus: Bus) -> None:
    good: list[int] = []

    @bus.on("t", name="bad")
    async def bad(env: Envelope) -> None:
        if env.payload == 2:
            raise KeyError("two")

    bus.on("t", lambda env: good.append(env.payload), name="good")
    for i in range(4):
        await bus.emit("t", i)
    await bus.drain()
    assert good == [0, 1, 2, 3]
    [entry] = bus.dlq.entries()
    assert (entry.reason, entry.subscriber, entry.error_type) == ("failed", "bad", "KeyError")
    assert entry.envelope.payload == 2
    assert "in bad" in entry.traceback
    assert entry.time > 0
    assert bus.dlq.get(entry.entry_id) is entry
    with pytest.raises(KeyError):
        bus.dlq.get(entry.entry_id + 1000)
    assert bus.dlq.entries(subscriber="good") == []
    assert bus.dlq.entries(reason="shed") == []


async def test_redrive_redelivers_to_that_subscription_only(bus: Bus) -> None:
    broken = True
    bad_got: list[int] = []
    good_got: list[int] = []

    @bus.on("t", name="bad")
    async def bad(env: Envelope) -> None:
        if broken:
            raise RuntimeError("down")
        bad_got.append(env.payload)

    bus.on("t", lambda env: good_got.append(env.payload), name="good")
    for i in range(3):
        await bus.emit("t", i)
    await bus.drain()
    assert len(bus.dlq) == 3 and good_got == [0, 1, 2]
    published_before = bus.stats().subscribers["bad"].published

    broken = False
    assert await bus.dlq.redrive() == 3
    await bus.drain()
    assert bad_got == [0, 1, 2]
    assert good_got == [0, 1, 2]  # not delivered twice
    assert len(bus.dlq) == 0
    stats = bus.stats().subscribers["bad"]
    assert stats.published == published_before == 3
    assert stats.delivered == 3 and stats.dead_lettered == 0
    assert stats.published == stats.delivered + stats.dead_lettered + stats.shed


async def test_redrive_selected_entries_and_failing_again(bus: Bus) -> None:
    @bus.on("t", name="bad")
    async def bad(env: Envelope) -> None:
        raise RuntimeError(f"down {env.payload}")

    for i in range(3):
        await bus.emit("t", i)
    await bus.drain()
    first = bus.dlq.entries()[0]
    assert await bus.dlq.redrive([first.entry_id]) == 1
    await bus.drain()
    entries = bus.dlq.entries()
    # The redriven one failed again: a new entry, the old one is gone, the others untouched.
    assert [e.envelope.payload for e in entries] == [1, 2, 0]
    assert first.entry_id not in {e.entry_id for e in entries}
    stats = bus.stats().subscribers["bad"]
    assert stats.published == 3 and stats.dead_lettered == 3


async def test_redrive_keeps_entries_whose_subscription_is_gone(bus: Bus) -> None:
    @bus.on("t", name="bad")
    async def bad(env: Envelope) -> None:
        raise RuntimeError("down")

    await bus.emit("t")
    await bus.drain()
    await bus.off("bad")
    assert await bus.dlq.redrive() == 0
    assert len(bus.dlq) == 1


async def test_bounded_dlq_evicts_oldest_and_counts() -> None:
    async with Bus(dlq_size=3) as b:

        @b.on("t", name="bad")
        async def bad(env: Envelope) -> None:
            raise RuntimeError("down")

        for i in range(5):
            await b.emit("t", i)
        await b.drain()
        assert [e.envelope.payload for e in b.dlq.entries()] == [2, 3, 4]
        assert b.dlq.evicted == 2
        stats = b.stats()
        assert stats.dlq_size == 3 and stats.dlq_evicted == 2
        # Eviction bounds memory, not the accounting: the subscription still counts all five.
        assert stats.subscribers["bad"].dead_lettered == 5
        # ... and so does the queue's own tally by reason, which run summaries report.
        assert b.dlq.totals == {"failed": 5}


async def test_dlq_listeners_see_every_entry(bus: Bus) -> None:
    seen: list[DeadLetter] = []
    bus.observe(SimpleNamespace(on_dead_letter=seen.append))

    @bus.on("t", name="bad")
    async def bad(env: Envelope) -> None:
        raise RuntimeError("down")

    await bus.emit("t")
    await bus.drain()
    assert seen == bus.dlq.entries()
    assert len(seen) == 1


async def test_a_redrive_refused_by_a_full_mailbox_keeps_the_entry_and_the_count(
    bus: Bus, gate, until
) -> None:
    g = gate()
    broken = True
    got: list[str] = []

    @bus.on("t", name="sub", max_queue=1, overflow="reject")
    async def sub(env: Envelope) -> None:
        if env.payload == "hold":
            await g.wait()
        elif broken:
            raise RuntimeError("down")
        got.append(env.payload)

    await bus.emit("t", "x")
    await bus.drain()
    await bus.emit("t", "hold")
    await until(lambda: g.waiting == 1)
    await bus.emit("t", "fill")
    with pytest.raises(QueueFullError):
        await bus.dlq.redrive()
    [entry] = bus.dlq.entries()
    assert entry.envelope.payload == "x"
    stats = bus.stats().subscribers["sub"]
    assert stats.dead_lettered == 1  # still listed, so still counted
    assert stats.published == stats.delivered + stats.dead_lettered + stats.queued + 1

    broken = False
    g.open()
    await bus.drain()
    assert await bus.dlq.redrive() == 1
    await bus.drain()
    assert got == ["hold", "fill", "x"]
    stats = bus.stats().subscribers["sub"]
    assert (stats.published, stats.delivered, stats.dead_lettered) == (3, 3, 0)


async def test_a_handler_whose_own_await_is_cancelled_fails_and_the_worker_goes_on(
    bus: Bus,
) -> None:
    # CancelledError from inside the handler (it awaited a task someone else cancelled) is
    # the handler's failure, not the bus closing: dead-letter it and keep serving.
    got: list[int] = []

    @bus.on("t", name="sub", retry=Retry(attempts=2))
    async def sub(env: Envelope) -> None:
        if env.payload == 1:
            doomed = asyncio.get_running_loop().create_future()
            doomed.cancel()
            await doomed
        got.append(env.payload)

    await bus.emit("t", 1)
    await bus.emit("t", 2)
    await asyncio.wait_for(bus.drain(), 2.0)
    assert got == [2]
    [entry] = bus.dlq.entries()
    assert (entry.reason, entry.error_type, entry.attempts) == ("failed", "CancelledError", 2)
    stats = bus.stats().subscribers["sub"]
    assert (stats.published, stats.delivered, stats.dead_lettered) == (2, 1, 1)


async def test_redrive_into_a_sampled_filtered_subscription_bypasses_sampling(
    bus: Bus,
) -> None:
    """Redriven messages were chosen once already: neither sampling nor the filter may drop
    them on the way back (they would leave the DLQ counted as ``filtered``)."""
    failing = True
    handled: list[object] = []

    async def handler(env: Envelope) -> None:
        if failing:
            raise RuntimeError("down")
        handled.append(env.payload)

    bus.on("t", handler, name="sub", sample_rate=0.5, filter=lambda p: p % 4 != 1, breaker=None)
    for i in range(40):
        await bus.emit("t", i)
    await bus.drain()
    dead = len(bus.dlq)
    assert dead == 15  # 30 pass the filter, half of them sampled
    failing = False
    assert await bus.dlq.redrive() == dead
    await bus.drain()
    stats = bus.stats().subscribers["sub"]
    assert len(handled) == dead and len(bus.dlq) == 0
    assert stats.dead_lettered == 0 and stats.delivered == dead
    assert stats.published == stats.delivered + stats.dead_lettered + stats.shed
    assert stats.filtered == 40 - dead


async def test_a_message_waiting_for_a_retry_holds_no_mailbox_slot_nor_worker(
    bus: Bus, clock: FakeClock, until
) -> None:
    """Backoff happens outside the mailbox: while poison waits out its delay, the worker
    goes on with the queue and a publisher finds the room the poison left."""
    handled: list[object] = []
    deliveries: list[tuple[object, str]] = []

    async def handler(env: Envelope) -> None:
        handled.append(env.payload)
        if env.payload == "poison":
            raise ValueError("poison")

    bus.on("t", handler, name="h", max_queue=2, retry=Retry(attempts=3, backoff=10.0))
    bus.observe(
        SimpleNamespace(on_delivery=lambda d: deliveries.append((d.envelope.payload, d.outcome)))
    )
    await bus.emit("t", "poison")
    await until(lambda: clock.sleepers == 1)
    s = bus.stats().subscribers["h"]
    assert (s.queued, s.in_flight) == (0, 1)  # waiting for its retry: in flight, not queued
    bus.emit_nowait("t", "a")
    bus.emit_nowait("t", "b")  # max_queue=2: both fit, the poison takes no slot
    await until(lambda: handled == ["poison", "a", "b"])  # and no worker
    assert bus.outstanding == 1
    await clock.advance(10.0)
    await until(lambda: clock.sleepers == 1)
    await clock.advance(20.0)
    await bus.drain()
    assert handled == ["poison", "a", "b", "poison", "poison"]
    s = bus.stats().subscribers["h"]
    assert (s.published, s.delivered, s.dead_lettered, s.in_flight) == (3, 2, 1, 0)
    assert (s.failures, s.retries) == (3, 2)
    [entry] = bus.dlq.entries()
    assert (entry.envelope.payload, entry.reason, entry.attempts) == ("poison", "failed", 3)
    # One delivery per message, whatever its number of attempts.
    assert sorted(deliveries) == [("a", "delivered"), ("b", "delivered"), ("poison", "failed")]


async def test_closing_during_a_retry_backoff_dead_letters_the_waiting_message(
    clock: FakeClock, until
) -> None:
    b = Bus(clock=clock)
    await b.start()

    async def poison(env: Envelope) -> None:
        raise ValueError("poison")

    b.on("t", poison, name="p", retry=Retry(attempts=5, backoff=60.0))
    await b.emit("t", 1)
    await until(lambda: clock.sleepers == 1)
    await b.aclose(drain=False)
    s = b.stats().subscribers["p"]
    assert (s.published, s.dead_lettered, s.in_flight) == (1, 1, 0)
    assert [e.reason for e in b.dlq.entries()] == ["bus_closed"]


async def test_retries_falling_due_together_do_not_open_the_default_breaker(
    bus: Bus, clock: FakeClock, until
) -> None:
    """Retries of several messages may run back to back once their backoffs end; the
    breaker hears of each message once, when it fails for good, so four poison messages
    among good ones (3 attempts each: 8 failed calls in a row once due) leave it closed."""

    async def handler(env: Envelope) -> None:
        if env.payload.startswith("poison"):
            raise ValueError(env.payload)

    bus.on("t", handler, name="h", retry=Retry(attempts=3, backoff=1.0))
    for i in range(4):
        await bus.emit("t", f"poison{i}")
        await bus.emit("t", f"ok{i}")
    await until(lambda: clock.sleepers == 4)
    await clock.advance(1.0)  # four second attempts fall due together
    await until(lambda: clock.sleepers == 4)
    await clock.advance(2.0)  # and four third attempts
    await bus.drain()
    assert bus.breakers() == {"h": "closed"}
    s = bus.stats().subscribers["h"]
    assert (s.delivered, s.dead_lettered, s.failures, s.retries) == (4, 4, 12, 8)
    assert sorted((e.envelope.payload, e.reason, e.attempts) for e in bus.dlq.entries()) == [
        (f"poison{i}", "failed", 3) for i in range(4)
    ]


async def test_a_dead_letter_traceback_keeps_chained_causes_and_source_lines(bus: Bus) -> None:
    """The DLQ's traceback is built without CPython's ``^^^`` markers (they cost most of a
    dead letter's time), but nothing a reader needs may go with them."""

    def lookup(key: str) -> int:
        return {"a": 1}[key]

    @bus.on("orders.new", name="orders", breaker=None)
    async def handle(env: Envelope) -> None:
        try:
            lookup(env.payload)
        except KeyError as exc:
            raise RuntimeError(f"no price for {env.payload!r}") from exc

    await bus.emit("orders.new", "b")
    await bus.drain()
    (entry,) = bus.dlq.entries()
    text = entry.traceback
    assert text is not None
    assert 'return {"a": 1}[key]' in text  # the cause's own source line
    assert "KeyError: 'b'" in text
    assert "The above exception was the direct cause of the following exception:" in text
    assert 'raise RuntimeError(f"no price for {env.payload!r}") from exc' in text
    assert text.rstrip().endswith("RuntimeError: no price for 'b'")
    assert "^^^" not in text


async def test_a_handler_or_filter_calling_sys_exit_is_a_dead_letter_not_an_exit(
    bus: Bus,
) -> None:
    """User code that calls sys.exit() fails its one message, with the traceback; before,
    the SystemExit left the worker and ended the process with its code, printing nothing."""
    import sys

    handled: list[object] = []

    def quits(env: Envelope) -> None:
        if env.payload == "quit":
            sys.exit(3)
        handled.append(env.payload)

    def picky(payload: object) -> bool:
        if payload == "quit":
            sys.exit(4)
        return True

    bus.on("t", quits, name="quits", retry=Retry(attempts=2))
    bus.on("t", lambda env: None, name="picky", filter=picky)
    for payload in ("a", "quit", "b"):
        await bus.emit("t", payload)
    await bus.drain()
    assert handled == ["a", "b"]
    entries = sorted(bus.dlq.entries(), key=lambda e: e.subscriber)
    assert [(e.subscriber, e.reason, e.error_type, e.error, e.attempts) for e in entries] == [
        ("picky", "filter_error", "SystemExit", "4", 0),
        ("quits", "failed", "SystemExit", "3", 2),
    ]
    assert "sys.exit(3)" in (entries[1].traceback or "")


class Refused(RuntimeError):
    """A refusal, as the agents' BudgetExceeded is: retrying cannot change the answer."""

    dead_letter_reason = "budget"


async def test_a_refusal_is_dead_lettered_at_once_under_its_reason_and_spares_the_breaker(
    bus: Bus,
) -> None:
    calls: list[object] = []

    async def refuse(env: Envelope) -> None:
        calls.append(env.payload)
        raise Refused("budget 'run' spent")

    bus.on(
        "t",
        refuse,
        name="asker",
        retry=Retry(attempts=3),
        breaker=BreakerPolicy(consecutive_failures=2),
    )
    for i in range(5):
        await bus.emit("t", i)
    await bus.drain()
    assert calls == [0, 1, 2, 3, 4]  # one attempt each, and the breaker never opened
    entries = bus.dlq.entries()
    assert [e.reason for e in entries] == ["budget"] * 5
    assert [e.attempts for e in entries] == [1] * 5
    assert entries[0].error == "budget 'run' spent" and entries[0].error_type is not None
    assert bus.dlq.totals == {"budget": 5}
    stats = bus.stats().subscribers["asker"]
    assert (stats.breaker, stats.breaker_trips, stats.dead_lettered) == ("closed", 0, 5)
