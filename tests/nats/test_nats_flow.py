"""Flow on NATS: CRITICAL's lane is pulled first, and a full ``block`` mailbox stops the
pulling, so what waits locally is bounded by the credit, never the backlog."""

from __future__ import annotations

import asyncio

from nats_helpers import eventually

from bus import Bus, Envelope, Priority
from bus.backends.nats import NatsServer, NatsTransport


async def test_critical_is_pulled_before_a_normal_backlog(server: NatsServer) -> None:
    """Twenty NORMAL messages wait in the stream before three CRITICAL ones; a receiver
    with little credit pulls lane by lane, CRITICAL's first, so the CRITICAL ones overtake
    the whole backlog. One FIFO consumer would hand them over last.

    Each handling lasts until the next CRITICAL message is in the mailbox (while one is
    still in the stream): credit frees when a handling settles, and the pulls it then sends
    to the CRITICAL and the NORMAL lanes race back from the server. Without that hold, which
    answer comes first is scheduling, and a NORMAL one could slip in between CRITICAL ones."""
    async with (
        Bus(transport=NatsTransport(server.url, team="lanes")) as pub,
        Bus(transport=NatsTransport(server.url, team="lanes", credit=3)) as sub,
    ):
        hold = asyncio.Event()
        order: list[str] = []

        @sub.on("job", name="worker")
        async def worker(env: Envelope) -> None:
            await hold.wait()
            order.append(env.payload)
            if sum(p.startswith("c") for p in order) < 3:
                await eventually(lambda: sub.stats().subscribers["worker"].queued >= 1)

        await sub.transport.sync()
        await eventually(lambda: pub.transport.has_remote("job"))
        for i in range(20):
            await pub.emit("job", f"n{i}", Priority.NORMAL)
        await eventually(lambda: sub.stats().subscribers["worker"].in_flight == 1)
        for i in range(3):
            await pub.emit("job", f"c{i}", Priority.CRITICAL)
        # With credit 3 (one per lane) the first CRITICAL one comes in beside the held one.
        await eventually(lambda: sub.stats().subscribers["worker"].queued == 1)
        hold.set()
        await eventually(lambda: len(order) == 23)
        # Only the NORMAL one already in hand when the CRITICAL ones arrived goes first.
        assert order == ["n0", "c0", "c1", "c2", *(f"n{i}" for i in range(1, 20))], order


async def test_a_full_block_mailbox_stops_the_pulling(server: NatsServer) -> None:
    """A ``block`` mailbox of 5 behind a stuck handler: the receiver holds at most its
    credit (mailbox + parked + requested) while 300 messages wait in the stream; once the
    handler moves, all 300 arrive, in order."""
    async with (
        Bus(transport=NatsTransport(server.url, team="flow")) as pub,
        Bus(transport=NatsTransport(server.url, team="flow", credit=30)) as sub,
    ):
        hold = asyncio.Event()
        got: list[int] = []

        @sub.on("load", name="slow", max_queue=5, overflow="block")
        async def slow(env: Envelope) -> None:
            await hold.wait()
            got.append(env.payload)

        await sub.transport.sync()
        await eventually(lambda: pub.transport.has_remote("load"))
        for i in range(300):
            await pub.emit("load", i)
        transport = sub.transport
        assert isinstance(transport, NatsTransport)
        await eventually(lambda: sub.stats().subscribers["slow"].queued == 5)
        await asyncio.sleep(0.3)  # give an unbounded puller time to overrun (it must not)
        stats = transport.stats()
        assert stats["held"] <= 30, stats
        assert stats["received"] <= 30, stats
        hold.set()
        await eventually(lambda: len(got) == 300)
        assert got == list(range(300))
        await pub.drain(timeout=10)
