"""A runaway publisher against a ``shed`` mailbox: what shedding costs, and CRITICAL latency.

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/runaway_bench.py [--seconds 3] [--repeats 3] [--json PATH]

Two measurements, in one process:

* **cost per emit_nowait**, enqueue vs shed: N ``emit_nowait`` calls into a mailbox that
  always has room (the worker never runs meanwhile), then N into a full ``shed`` mailbox of
  10 (every call sheds the oldest). Same topic, payload and bus otherwise; the ratio is
  what counts on a shared machine.
* **runaway**: one subscription (``overflow="shed"``, ``max_queue=1000``) whose handler
  burns 100 µs of CPU, so it handles at most ~10,000 msg/s; a publisher paced by
  ``time.monotonic()`` offers 10x that (100,000 msg/s, bursts of at most 2,000 per loop
  pass). One message in 1,000 is CRITICAL (every 10 ms); its latency is handler start
  minus ``env.created``. Also: the achieved offered rate and the handled rate.

Runs against whatever ``bus`` is importable (set PYTHONPATH to compare trees).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from bus import Bus, Envelope, Priority

HANDLER_S = 100e-6
RATE = 100_000  # 10x what the handler can take
BURST = 2_000
CRITICAL_EVERY = 1_000


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def emit_cost(n: int) -> dict[str, float]:
    """ns per emit_nowait: enqueue (room) vs shed (full mailbox of 10)."""
    out = {}
    for name, max_queue in (("enqueue", n + 10), ("shed", 10)):
        async with Bus(dlq_size=10_000) as bus:
            gate = asyncio.Event()

            async def hold(env: Envelope, gate: asyncio.Event = gate) -> None:
                await gate.wait()

            bus.on("t", hold, name="s", max_queue=max_queue, overflow="shed")
            emit = bus.emit_nowait
            payload = {"k": 1}
            for _ in range(20):  # fill to the cap first: every timed call then sheds
                emit("t", payload)
            t0 = time.perf_counter_ns()
            for _ in range(n):
                emit("t", payload)
            out[name] = (time.perf_counter_ns() - t0) / n
            gate.set()
            await bus.drain()
    return out


async def runaway(seconds: float) -> dict[str, Any]:
    lat: list[int] = []
    handled = 0
    async with Bus() as bus:

        async def work(env: Envelope) -> None:
            nonlocal handled
            if env.priority == Priority.CRITICAL:
                lat.append(time.monotonic_ns() - env.created)
            handled += 1
            spin(HANDLER_S)

        bus.on("load", work, name="work", max_queue=1000, overflow="shed")
        await asyncio.sleep(0)
        emit = bus.emit_nowait
        clock = time.monotonic
        t0 = clock()
        end = t0 + seconds
        sent = 0
        while True:
            now = clock()
            if now >= end:
                break
            k = min(int((now - t0) * RATE) - sent, BURST)
            for i in range(sent, sent + k):
                if i % CRITICAL_EVERY:
                    emit("load", i)
                else:
                    emit("load", i, Priority.CRITICAL)
            sent += k
            await asyncio.sleep(0)
        elapsed = clock() - t0
        stats = bus.stats().subscribers["work"]
        await bus.aclose(drain=False)
    lat.sort()
    return {
        "offered_per_s": sent / elapsed,
        "handled_per_s": handled / elapsed,
        "shed": stats.shed,
        "critical": len(lat),
        "critical_p50_ms": lat[len(lat) // 2] / 1e6,
        "critical_p99_ms": lat[min(len(lat) - 1, int(len(lat) * 0.99))] / 1e6,
        "critical_max_ms": lat[-1] / 1e6,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--n", type=int, default=200_000, help="emit_nowait calls per cost run")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    costs, runs = [], []
    for _ in range(a.repeats):
        costs.append(asyncio.run(emit_cost(a.n)))
        runs.append(asyncio.run(runaway(a.seconds)))
    med = statistics.median
    result = {
        "enqueue_ns": med(c["enqueue"] for c in costs),
        "shed_ns": med(c["shed"] for c in costs),
        "shed_over_enqueue": med(c["shed"] / c["enqueue"] for c in costs),
        **{k: med(r[k] for r in runs) for k in runs[0]},
        "repeats": {"costs": costs, "runs": runs},
    }
    print(f"emit_nowait, enqueue      {result['enqueue_ns'] / 1000:8.2f} us")
    print(f"emit_nowait, shed         {result['shed_ns'] / 1000:8.2f} us")
    print(f"shed / enqueue            {result['shed_over_enqueue']:8.2f} x")
    print(f"offered                   {result['offered_per_s']:8,.0f} msg/s")
    print(f"handled                   {result['handled_per_s']:8,.0f} msg/s")
    print(f"CRITICAL p50              {result['critical_p50_ms']:8.2f} ms")
    print(f"CRITICAL p99              {result['critical_p99_ms']:8.2f} ms  (target < 10)")
    print(f"CRITICAL max              {result['critical_max_ms']:8.2f} ms")
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
