"""What honest timing costs: the nine-agent pipeline and a one-subscriber bus with the
measurement on (as shipped) and off, alternated in one process.

    python benchmarks/timing_bench.py [--repeats 15] [--emails 3000] [--messages 300000]

"off" removes, in this process only, the two things a run measures so that a timing check
can tell slow code from a busy machine: the loop thread's CPU clock and run-queue wait read
around sampled handlings (``bus._worker.CPU_ALL_UNTIL`` / ``CPU_SAMPLE``) and the bus's
run-queue readings of ``/proc/self/task/<tid>/schedstat`` (``bus._bus.LoopScheduling``,
read at start and on every ``stats()``). On and off alternate within each repeat, so a busy
machine slows both alike; each figure is the median of per-repeat on/off ratios. CPU time
(``process_time``) is printed beside wall time: on a shared machine it moves less.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import bus._bus
import bus._worker
from bus import Bus, SchedulingStats

sys.path.insert(0, str(Path(__file__).resolve().parent))
from pipeline_bench import make_inbox, one_run


class _Unmeasured:
    """Stands in for ``LoopScheduling`` when the measurement is off."""

    def read(self) -> SchedulingStats:
        return SchedulingStats("none", 0.0, 0.0, 0.0, None)


@contextlib.contextmanager
def measurement(on: bool) -> Iterator[None]:
    if on:
        yield
        return
    saved = (bus._worker.CPU_ALL_UNTIL, bus._worker.CPU_SAMPLE, bus._bus.LoopScheduling)
    bus._worker.CPU_ALL_UNTIL, bus._worker.CPU_SAMPLE = 0, 1 << 62
    bus._bus.LoopScheduling = _Unmeasured  # type: ignore[assignment, misc]
    try:
        yield
    finally:
        bus._worker.CPU_ALL_UNTIL, bus._worker.CPU_SAMPLE, bus._bus.LoopScheduling = saved


async def _noop(env: Any) -> None:
    return None


async def bus_run(n: int) -> dict[str, float]:
    """``n`` messages through one no-op subscriber; CPU-ns per message and the number of
    handlings whose CPU time was read."""
    async with Bus() as b:
        b.on("ev", _noop, name="h")
        cpu0, wall0 = time.process_time_ns(), time.perf_counter()
        for i in range(n):
            await b.emit("ev", i)
        await b.drain()
        cpu, wall = time.process_time_ns() - cpu0, time.perf_counter() - wall0
        samples = b.stats().subscribers["h"].handling_cpu.count
    return {"rate": n / wall, "cpu_ns": cpu / n, "samples": samples}


def pipeline_run(inbox: Path) -> dict[str, float]:
    cpu0 = time.process_time_ns()
    r = asyncio.run(one_run(inbox, 1.0, 64))
    return {"rate": r["rps"], "cpu_ns": (time.process_time_ns() - cpu0) / r["requests"]}


def clock_cost(n: int = 200_000) -> float:
    """ns per ``time.thread_time_ns()`` call: two per measured handling."""
    read = time.thread_time_ns
    t0 = time.perf_counter_ns()
    for _ in range(n):
        read()
    return (time.perf_counter_ns() - t0) / n


def _spread(ratios: list[float]) -> str:
    """The median of per-repeat ratios and their middle half, which shows the noise."""
    q1, median, q3 = statistics.quantiles(ratios, n=4)
    return f"{median:.3f} (middle half {q1:.3f}-{q3:.3f})"


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--emails", type=int, default=3000)
    parser.add_argument("--messages", type=int, default=300_000)
    args = parser.parse_args()
    runs: dict[tuple[str, bool], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        inbox = make_inbox(args.emails, Path(tmp))
        for rep in range(args.repeats):
            for on in (True, False) if rep % 2 else (False, True):
                with measurement(on):
                    runs.setdefault(("pipeline", on), []).append(pipeline_run(inbox))
                    runs.setdefault(("bus", on), []).append(asyncio.run(bus_run(args.messages)))
    cost = statistics.median(clock_cost() for _ in range(5))
    print(f"time.thread_time_ns(): {cost:,.0f} ns a call (median of 5 x 200,000)")
    for what, unit in (("pipeline", "req"), ("bus", "msg")):
        on, off = runs[what, True], runs[what, False]
        rates = [a["rate"] / b["rate"] for a, b in zip(on, off, strict=True)]
        cpus = [a["cpu_ns"] / b["cpu_ns"] for a, b in zip(on, off, strict=True)]
        print(
            f"{what}: on {statistics.median(r['rate'] for r in on):,.0f} {unit}/s, "
            f"{statistics.median(r['cpu_ns'] for r in on) / 1000:,.2f} CPU-µs/{unit}; "
            f"off {statistics.median(r['rate'] for r in off):,.0f} {unit}/s, "
            f"{statistics.median(r['cpu_ns'] for r in off) / 1000:,.2f} CPU-µs/{unit}; "
            f"on/off rate {_spread(rates)}, CPU per {unit} {_spread(cpus)}"
        )
        if what == "bus":
            samples = statistics.median(r["samples"] for r in on)
            share = (
                samples * 2 * cost / (statistics.median(r["cpu_ns"] for r in on) * args.messages)
            )
            print(
                f"  {samples:,.0f} of {args.messages:,} handlings had their CPU time read: "
                f"{share:.2%} of the run's CPU by the clock's cost alone"
            )


if __name__ == "__main__":
    main()
