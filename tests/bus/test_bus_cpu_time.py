"""The loop thread's CPU time per handling and its run-queue waits, as the bus keeps them."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from bus import Bus
from bus._worker import CPU_ALL_UNTIL, CPU_SAMPLE


async def _burn(env: Any) -> None:
    start = time.thread_time()
    while time.thread_time() - start < 0.005:
        pass


async def _nap(env: Any) -> None:
    await asyncio.sleep(0.005)


async def _handle(pairs: dict[str, Any], n: int = 20) -> dict[str, Any]:
    async with Bus() as bus:
        for name, handler in pairs.items():
            bus.on(name, handler, name=name)
        for _ in range(n):
            for name in pairs:
                await bus.emit(name, {})
        await bus.drain()
        return bus.stats().subscribers


async def test_cpu_time_tells_a_busy_handler_from_a_waiting_one() -> None:
    burned = (await _handle({"burn": _burn}))["burn"]
    napped = (await _handle({"nap": _nap}))["nap"]
    assert burned.handling_cpu.count == napped.handling_cpu.count == 20
    # Quantiles are histogram buckets: within 12.5% of the 5 ms each handling burns.
    assert 4.3 <= burned.handling_cpu.p99_us / 1000 <= burned.handling.max_us / 1000
    assert napped.handling.p99_us / 1000 >= 4.3
    assert napped.handling_cpu.p99_us / 1000 < 2.0  # awaited, not burned


async def test_what_runs_on_the_loop_while_a_handler_awaits_counts_as_its_cpu() -> None:
    """An upper bound on a handler's own work, as the timing checks want it: the loop's
    CPU time during the handling, whoever spent it. Errs towards failing a check."""
    subs = await _handle({"burn": _burn, "nap": _nap})
    assert subs["nap"].handling_cpu.max_us / 1000 >= 4.3


async def test_cpu_time_is_sampled_after_a_subscriptions_first_deliveries() -> None:
    """The clock is a system call: every handling until CPU_ALL_UNTIL are delivered, then
    one in CPU_SAMPLE, so a long run pays for it on a sliver of its messages."""

    async def noop(env: Any) -> None:
        return None

    n = CPU_ALL_UNTIL + 2 * CPU_SAMPLE + 10
    async with Bus() as bus:
        bus.on("x", noop, name="h")
        for i in range(n):
            await bus.emit("x", i)
        await bus.drain()
        stats = bus.stats()
    # Handlings 1..CPU_ALL_UNTIL, then each CPU_SAMPLE-th of the one worker's.
    assert stats.subscribers["h"].handling_cpu.count == CPU_ALL_UNTIL + 2
    assert stats.subscribers["h"].handling.count == n  # wall time: every one, still


async def test_stats_carry_the_loop_threads_cpu_waits_from_the_start() -> None:
    bus = Bus()
    assert bus.stats().scheduling is None  # not started: nothing measured
    async with bus:
        start = time.thread_time()
        while time.thread_time() - start < 0.05:
            pass
        got = bus.stats().scheduling
    assert got is not None and got.source in ("schedstat", "loadavg", "none")
    if got.source != "none":
        assert got.cpu_s >= 0.03 and got.share is not None and 0.0 <= got.share <= 1.0
