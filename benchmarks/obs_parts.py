#!/usr/bin/env python
"""Where observability's cost goes, with an A/A control to show the harness's own noise.

    .venv/bin/python benchmarks/obs_parts.py [--messages 200000] [--repeats 9]

Part 1, the bus: ``await bus.emit`` x N -> one no-op subscriber, then ``drain``, in CPU ns
per message (``time.process_time``, all threads; and the event loop's thread alone, which
tells the loop's own cost from the span batcher's), for

* ``off``: no tracer;
* ``tracer-0%``: :class:`~pantheon.telemetry.BusTracer` at ratio 0 (every root declined:
  what an unsampled message pays, the identity tests and the skip countdown);
* ``tracer-1%``: the same at 1%, spans built by a :class:`SpanBatcher` into no exporter;
* ``off-again``: ``off`` once more, last in each repeat. It runs the very same code as
  ``off``: how far its median lands from ``off``'s is how much of any other difference the
  harness cannot tell from noise (position in the repeat, heap growth, the machine).

Configurations alternate within each repeat; medians over repeats.

Part 2, one sampled message through the tracer alone, in the same process: the publish
span (``on_publish`` of a root), the process span (``start_process`` + ``end_process``) and
building the two SDK spans (what the batcher's thread does), in ns per sampled message.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bus import Bus, Envelope  # noqa: E402
from pantheon.telemetry._tracing import BusTracer, SpanBatcher, _built  # noqa: E402


async def _noop(env: Envelope) -> None:
    return None


async def _run(
    n: int, make: Callable[[], tuple[BusTracer, SpanBatcher] | None]
) -> tuple[float, float]:
    """CPU ns per message for one run, process and loop thread; ``make()`` gives the tracer
    and its batcher, or None."""
    made = make()
    tracer = made[0] if made is not None else None
    async with Bus() as bus:
        if tracer is not None:
            bus.observe(tracer)
        bus.on("bench.a", _noop, name="sub0")
        await asyncio.sleep(0)
        emit = bus.emit
        gc.collect()
        c0, t0 = time.process_time(), time.thread_time()
        for i in range(n):
            await emit("bench.a", i)
        await bus.drain()
        cpu, loop = time.process_time() - c0, time.thread_time() - t0
    if made is not None:
        made[1].shutdown()
    return cpu / n * 1e9, loop / n * 1e9


def _tracer(ratio: float) -> Callable[[], tuple[BusTracer, SpanBatcher]]:
    def make() -> tuple[BusTracer, SpanBatcher]:
        batcher = SpanBatcher([])
        return BusTracer(batcher, ratio=ratio), batcher

    return make


def tracer_parts(n: int = 2000, repeats: int = 20) -> dict[str, float]:
    """ns per sampled message in each part of the tracer (see the module docstring)."""
    records: list[Any] = []
    tracer = BusTracer(SpanBatcher([]), ratio=1.0)
    tracer._ended = records.append  # type: ignore[method-assign]
    envs = [
        Envelope("bench.a", {"id": i}, 2, i + 1, None, i + 1, None, None, time.monotonic_ns())
        for i in range(n)
    ]
    publish = process = build = 0.0
    for _ in range(repeats):
        for env in envs:
            env.trace = None
        records.clear()
        t0 = time.process_time()
        for env in envs:
            tracer.on_publish(env)
        t1 = time.process_time()
        for env in envs:
            tracer.end_process(tracer.start_process("sub0", env), "delivered", None)
        t2 = time.process_time()
        for record in records:
            _built(record)
        t3 = time.process_time()
        publish, process, build = publish + t1 - t0, process + t2 - t1, build + t3 - t2
    k = 1e9 / (n * repeats)
    return {"publish": publish * k, "process": process * k, "build": build * k}


async def suite(n: int, repeats: int) -> dict[str, list[tuple[float, float]]]:
    configs: list[tuple[str, Callable[[], tuple[BusTracer, SpanBatcher] | None]]] = [
        ("off", lambda: None),
        ("tracer-0%", _tracer(0.0)),
        ("tracer-1%", _tracer(0.01)),
        ("off-again", lambda: None),
    ]
    for _, make in configs:  # warm-up
        await _run(n // 10, make)
    raw: dict[str, list[tuple[float, float]]] = {name: [] for name, _ in configs}
    for _ in range(repeats):
        for name, make in configs:
            raw[name].append(await _run(n, make))
    return raw


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--repeats", type=int, default=9)
    args = ap.parse_args()
    raw = asyncio.run(suite(args.messages, args.repeats))
    print(f"bus, CPU ns per message ({args.messages:,} messages, median of {args.repeats}):")
    for i, what in enumerate(("process", "loop thread")):
        base = statistics.median(r[i] for r in raw["off"])
        for name, values in raw.items():
            med = statistics.median(r[i] for r in values)
            print(
                f"  {what:<11} {name:<10} {med:7.0f} ns   {med - base:+5.0f} ns"
                f"   {med / base - 1:+6.1%}"
            )
    parts = tracer_parts()
    print(
        "tracer alone, ns per sampled message: "
        + ", ".join(f"{k} {v:.0f}" for k, v in parts.items())
        + f"; total {sum(parts.values()):.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
