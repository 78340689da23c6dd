"""Per-subscription filters and deterministic sampling."""

from __future__ import annotations

import itertools

import pytest

from bus import Bus, Envelope


async def test_filter_keeps_only_matching_payloads(bus: Bus) -> None:
    got: list[int] = []
    everything: list[int] = []
    bus.on("n", lambda env: got.append(env.payload), name="even", filter=lambda p: p % 2 == 0)
    bus.on("n", lambda env: everything.append(env.payload), name="all")
    for i in range(10):
        await bus.emit("n", i)
    await bus.drain()
    assert got == [0, 2, 4, 6, 8]
    assert everything == list(range(10))
    stats = bus.stats().subscribers["even"]
    # Declined messages were never published to the subscription.
    assert (stats.published, stats.filtered, stats.delivered) == (5, 5, 5)


@pytest.mark.parametrize(
    ("rate", "n", "expected"),
    [(0.1, 1000, 100), (0.25, 1000, 250), (0.3, 1000, 300), (0.5, 999, 499), (1 / 3, 3000, 1000)],
)
async def test_sample_rate_delivers_exactly_that_share(rate: float, n: int, expected: int) -> None:
    async with Bus() as b:
        got: list[int] = []
        b.on("s", lambda env: got.append(env.payload), name="sampled", sample_rate=rate)
        for i in range(n):
            await b.emit("s", i)
        await b.drain()
        stats = b.stats().subscribers["sampled"]
    assert len(got) == expected
    assert stats.published == expected and stats.filtered == n - expected
    # Evenly spread, not a burst at the start or the end.
    period = round(1 / rate)
    first, last = got[: len(got) // 2], got[len(got) // 2 :]
    assert abs(len(first) - len(last)) <= 1
    assert all(b - a in (period - 1, period, period + 1) for a, b in itertools.pairwise(got))


async def test_sampling_is_the_same_on_every_run() -> None:
    runs = []
    for _ in range(2):
        async with Bus() as b:
            got: list[int] = []
            b.on("s", lambda env, got=got: got.append(env.payload), name="s", sample_rate=0.07)
            for i in range(500):
                await b.emit("s", i)
        runs.append(got)
    assert runs[0] == runs[1] and len(runs[0]) == 35


async def test_filter_applies_before_sampling(bus: Bus) -> None:
    got: list[int] = []
    bus.on(
        "n",
        lambda env: got.append(env.payload),
        name="s",
        filter=lambda p: p % 2 == 0,
        sample_rate=0.5,
    )
    for i in range(40):
        await bus.emit("n", i)
    await bus.drain()
    assert len(got) == 10 and all(p % 2 == 0 for p in got)


async def test_a_filter_that_raises_dead_letters_with_filter_error(bus: Bus) -> None:
    got: list[object] = []

    def picky(payload: object) -> bool:
        return payload["wanted"]  # type: ignore[index]

    bus.on("t", lambda env: got.append(env.payload), name="picky", filter=picky)
    good = {"wanted": True}
    await bus.emit("t", good)
    bad = await bus.emit("t", "not a dict")
    await bus.drain()
    assert got == [good]
    [entry] = bus.dlq.entries()
    assert entry.reason == "filter_error" and entry.subscriber == "picky"
    assert entry.envelope is bad
    assert entry.error_type == "TypeError"
    assert "in picky" in entry.traceback
    stats = bus.stats().subscribers["picky"]
    assert (stats.published, stats.delivered, stats.dead_lettered) == (2, 1, 1)


async def test_filter_sees_the_payload_not_the_envelope(bus: Bus) -> None:
    seen: list[object] = []

    def spy(payload: object) -> bool:
        seen.append(payload)
        return True

    got: list[Envelope] = []
    bus.on("t", got.append, name="spy", filter=spy)
    payload = object()
    await bus.emit("t", payload)
    await bus.drain()
    assert seen == [payload] and got[0].payload is payload
