"""What a live feed costs the bus: a three-hop pipeline pushed flat out, without a feed, with
a feed without its trace ring, with the default feed, and with a client attached (the client
runs in the same event loop here, so its decoding is counted too; a monitor is another
process). Not a test (timing
on a shared machine is noise for an assertion); run it by hand:

    .venv/bin/python tests/live/live_bench.py [messages] [rounds]

Rounds interleave the setups so drift on a busy machine hits all of them alike; the
median of each is printed.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

from bus import Bus, Envelope
from pantheon.live import LiveFeed, connect


async def _once(messages: int, mode: str, sock: Path) -> float:
    async with Bus(session_id="bench") as bus:

        async def first(env: Envelope) -> None:
            await bus.emit("b", env.payload)

        async def second(env: Envelope) -> None:
            await bus.emit("c", env.payload)

        async def last(env: Envelope) -> None:
            return None

        bus.on("a", first, name="first", max_queue=100_000)
        bus.on("b", second, name="second", max_queue=100_000)
        bus.on("c", last, name="last", max_queue=100_000)
        feed = client = reading = None
        if mode != "none":
            feed = LiveFeed(bus, path=sock, trace_ring=0 if mode == "feed, no traces" else 4096)
            await feed.start()
            if mode == "feed + client":
                client = await connect(sock)

                async def read() -> None:
                    async for _ in client:  # type: ignore[union-attr]
                        pass

                reading = asyncio.get_running_loop().create_task(read())
        started = time.perf_counter()
        for i in range(messages):
            await bus.emit("a", i)
            if i % 1000 == 0:
                await asyncio.sleep(0)
        await bus.drain()
        took = time.perf_counter() - started
        if feed is not None:
            await feed.aclose()
        if client is not None:
            await client.aclose()
        if reading is not None:
            await reading
    return 3 * messages / took


async def main(messages: int, rounds: int) -> None:
    modes = ("none", "feed, no traces", "feed", "feed + client")
    results: dict[str, list[float]] = {m: [] for m in modes}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(rounds):
            for mode in modes:
                results[mode].append(await _once(messages, mode, Path(tmp) / "f.sock"))
    base = statistics.median(results["none"])
    for mode in modes:
        rate = statistics.median(results[mode])
        print(f"{mode:<16} {rate:>10,.0f} deliveries/s  {100 * (rate / base - 1):+.1f}%")


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    asyncio.run(main(*(args + [200_000, 7][len(args) :])))
