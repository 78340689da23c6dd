"""1% poison with default mailboxes: what the other subscribers of the same publisher lose.

Run from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/poison_bench.py [--warmup 3] [--seconds 3] [--repeats 3]

One publisher ``await bus.emit``s as fast as it can on one topic; three subscriptions with
default options (10,000 ``block`` mailbox) take every message and burn 5 µs of CPU each.
One of them, ``poisoned``, also has ``Retry(attempts=3, backoff=0.01)`` and fails on every
100th message (always: the poison is dead-lettered after its three attempts). Measured per
run, after ``--warmup`` seconds (long enough for a mailbox that backs up to fill, which is
when its publisher starts to wait): messages the two clean subscribers handled per second
over the next ``--seconds``. Runs alternate clean (0%) and poisoned (1%) within each
repeat; the figure is the median of per-repeat ratios poisoned/clean. Runs against
whatever ``bus`` is importable (set PYTHONPATH to compare trees).
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

from bus import Bus, Envelope, Retry

WORK_S = 5e-6
POISON_EVERY = 100


def spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def run(warmup: float, seconds: float, poison: bool) -> dict[str, Any]:
    clean = 0
    async with Bus() as bus:

        async def other(env: Envelope) -> None:
            nonlocal clean
            spin(WORK_S)
            clean += 1

        async def picky(env: Envelope) -> None:
            spin(WORK_S)
            if poison and env.payload % POISON_EVERY == 0:
                raise ValueError("poison")

        bus.on("job", other, name="a")
        bus.on("job", other, name="b")
        bus.on("job", picky, name="poisoned", retry=Retry(attempts=3, backoff=0.01))
        await asyncio.sleep(0)
        i = 0
        t0 = time.monotonic()
        measure_from = t0 + warmup
        end = measure_from + seconds
        start_clean = start_i = -1
        cpu0 = 0.0
        while (now := time.monotonic()) < end:
            if start_clean < 0 and now >= measure_from:
                start_clean, start_i, t0, cpu0 = clean, i, now, time.process_time()
            for _ in range(100):
                await bus.emit("job", i)
                i += 1
        elapsed = time.monotonic() - t0
        cpu_share = (time.process_time() - cpu0) / elapsed
        handled = clean - start_clean
        i -= start_i
        stats = bus.stats().subscribers
        await bus.aclose(drain=False)
    return {
        "clean_per_s": handled / 2 / elapsed,
        "published_per_s": i / elapsed,
        "dead_lettered": stats["poisoned"].dead_lettered,
        "retries": stats["poisoned"].retries,
        # Of one core, over the measured window: the rest went to other processes (or
        # the loop idled), so compare runs of a repeat only when their shares are close.
        "cpu_share": cpu_share,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--warmup", type=float, default=3.0)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    rows = []
    for _ in range(a.repeats):
        clean = asyncio.run(run(a.warmup, a.seconds, poison=False))
        poisoned = asyncio.run(run(a.warmup, a.seconds, poison=True))
        rows.append({"clean": clean, "poisoned": poisoned})
    med = statistics.median
    ratio = med(r["poisoned"]["clean_per_s"] / r["clean"]["clean_per_s"] for r in rows)
    result = {
        "clean_per_s_no_poison": med(r["clean"]["clean_per_s"] for r in rows),
        "clean_per_s_1pct_poison": med(r["poisoned"]["clean_per_s"] for r in rows),
        "ratio": ratio,
        "loss_pct": (1 - ratio) * 100,
        "repeats": rows,
    }
    print(f"others' msg/s, no poison   {result['clean_per_s_no_poison']:10,.0f}")
    print(f"others' msg/s, 1% poison   {result['clean_per_s_1pct_poison']:10,.0f}")
    print(f"others lose                {result['loss_pct']:10.1f} %  (target < 10)")
    for r in rows:
        print(
            f"  repeat: clean {r['clean']['clean_per_s']:9,.0f}/s at {r['clean']['cpu_share']:.2f}"
            f" CPU, poisoned {r['poisoned']['clean_per_s']:9,.0f}/s"
            f" at {r['poisoned']['cpu_share']:.2f} CPU"
        )
    if a.json:
        a.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
