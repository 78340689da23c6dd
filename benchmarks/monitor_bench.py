"""How long the terminal monitor holds its event loop when a flood run's record reaches it.

    python benchmarks/monitor_bench.py [--repeats 3]

Records ``scenarios/flood.yaml`` once (20,000 requests, as many dead letters), then opens
the monitor on that session under Textual's test pilot, as ``pantheon monitor`` would, and
measures from before the record arrives until its tables are full: the longest stretch of
loop-thread CPU between two ticks of a 50 ms timer (what a key press waits behind: CPU
time, so a machine that runs someone else meanwhile does not count), and each full garbage
collection's duration (``gc.callbacks``). tests/tui/test_tui_live.py bounds the same hold
at 1.5 s on the live-to-store handover.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import subprocess
import sys
import tempfile
import time
from itertools import pairwise
from pathlib import Path

from textual.widgets import DataTable

from dashboard.tui import MonitorApp, StoreSource
from pantheon.sessions import SessionStore

ROOT = Path(__file__).resolve().parents[1]


async def one(store: Path, sid: str) -> tuple[float, list[float]]:
    full: list[float] = []
    started: list[float] = []

    def timed(phase: str, info: dict[str, int]) -> None:
        if info["generation"] != 2:
            return
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            full.append(time.perf_counter() - started.pop())

    ticks: list[float] = []
    source = StoreSource(store, sid)
    app = MonitorApp(source)
    gc.callbacks.append(timed)
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            app.set_interval(0.05, lambda: ticks.append(time.thread_time()))
            table = app.query_one("#trace-table", DataTable)
            deadline = time.monotonic() + 120
            while table.row_count < 500 and time.monotonic() < deadline:
                await pilot.pause(0.05)
            await pilot.pause(1.0)  # the tables measure their last rows when idle
    finally:
        gc.callbacks.remove(timed)
        await source.aclose()
    return max(b - a for a, b in pairwise(ticks)), full


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = Path(tmp) / "sessions.db"
        run = [sys.executable, "-m", "pantheon.cli", "run", "scenarios/flood.yaml"]
        subprocess.run([*run, "--store", str(store)], cwd=ROOT, capture_output=True, check=False)
        with SessionStore(store) as opened:
            sid = opened.sessions()[0].id
        for i in range(args.repeats):
            hold, full = asyncio.run(one(store, sid))
            pauses = ", ".join(f"{p * 1000:.0f}" for p in full) or "none"
            median = f"{statistics.median(full) * 1000:.0f}" if full else "-"
            print(
                f"repeat {i + 1}: longest loop hold {hold:.3f} s of CPU; "
                f"full collections (ms): {pauses}; median {median}",
                flush=True,
            )


if __name__ == "__main__":
    main()
