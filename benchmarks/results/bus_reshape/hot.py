"""emit N to one no-op subscriber, then drain: ns per message; median of 5."""
import asyncio, time, statistics, sys
from bus import Bus
N = 200_000
async def one():
    async with Bus() as bus:
        hits = 0
        async def h(env):
            nonlocal hits
            hits += 1
        bus.on("ev", h, name="h", max_queue=1_000_000)
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
print(f"{sys.argv[1] if len(sys.argv)>1 else ''} ns/msg median {statistics.median(res):.0f}  all {[round(r) for r in res]}")
