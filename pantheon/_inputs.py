"""Outside input that is not an agent's: counting a scenario's inputs for progress, and the
runaway publisher of ``faults.flood``."""

from __future__ import annotations

import asyncio
from pathlib import Path

from bus import Bus, BusError
from pantheon.scenario import Scenario

__all__ = ["count_inputs", "run_flood"]


async def run_flood(bus: Bus, topic: str, rate: float, count: int, priority: int) -> int:
    """A runaway publisher: ``count`` copies of one message at ``rate``/s, ignoring refusals
    (a flooding agent does not care; the bus must)."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    payload = {"id": "flood", "from": "flood@runaway.example", "subject": "flood", "body": "x"}
    sent = 0
    for n in range(count):
        delay = started + n / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        try:
            bus.emit_nowait(topic, dict(payload, id=f"flood-{n}"), priority)
            sent += 1
        except BusError:
            pass  # refusals are the point of a flood; the bus counted them
        if n % 256 == 0:
            await asyncio.sleep(0)
    return sent


def count_inputs(scenario: Scenario) -> int | None:
    inp = scenario.input
    if inp.kind != "file" or inp.path is None:
        return inp.count
    with Path(inp.path).open(encoding="utf-8", errors="replace") as f:
        n = sum(1 for line in f if line.strip())
    return min(n, inp.count) if inp.count else n
