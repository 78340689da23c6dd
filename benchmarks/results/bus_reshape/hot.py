"""CPU per message: ``await bus.emit`` x 200,000 to one no-op subscriber, then drain.

Process time, not wall clock, so other work on the machine counts less; median of 5 runs.
Run against any tree: ``PYTHONPATH=<tree> .venv/bin/python hot.py <label>``.
"""

import asyncio
import statistics
import sys
import time

from bus import Bus, Envelope

N = 200_000


async def one() -> float:
    async with Bus() as bus:

        async def handler(env: Envelope) -> None:
            pass

        bus.on("ev", handler, name="h", max_queue=1_000_000)
        emit = bus.emit
        for i in range(5000):
            await emit("ev", i)
        await bus.drain()
        t = time.process_time_ns()
        for i in range(N):
            await emit("ev", i)
            if i % 256 == 255:
                await asyncio.sleep(0)
        await bus.drain()
        return (time.process_time_ns() - t) / N


res = [asyncio.run(one()) for _ in range(5)]
label = sys.argv[1] if len(sys.argv) > 1 else ""
print(f"{label} ns/msg median {statistics.median(res):.0f}  all {[round(r) for r in res]}")
