"""Smoke run of benchmarks/timing_bench.py: the measurement really is off in "off" runs
(no handling has its CPU time read) and on in "on" runs, and the report is printed.

Not a timing test: small sizes, one repeat.
"""

from __future__ import annotations

import asyncio
import re
import subprocess
import sys
from pathlib import Path

import bus._bus
from bus._sched import LoopScheduling

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "timing_bench.py"


def test_timing_bench_runs_on_and_off() -> None:
    args = ["--repeats", "2", "--emails", "60", "--messages", "3000"]
    proc = subprocess.run(
        [sys.executable, str(BENCH), *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    assert re.fullmatch(r"time\.thread_time_ns\(\): [\d,]+ ns a call \(median of 5 x 200,000\)",
                        lines[0])  # fmt: skip
    assert lines[1].startswith("pipeline: on ") and " req/s, " in lines[1]
    assert lines[2].startswith("bus: on ") and " msg/s, " in lines[2]
    # 3,000 messages: the first 256 timed, then the 512th, 768th, ... 2,816th (10 more).
    assert lines[3].startswith("  266 of 3,000 handlings had their CPU time read: ")


def test_off_means_no_cpu_clock_and_no_schedstat() -> None:
    sys.path.insert(0, str(BENCH.parent))
    try:
        import timing_bench
    finally:
        sys.path.remove(str(BENCH.parent))
    with timing_bench.measurement(on=False):
        assert bus._bus.LoopScheduling is timing_bench._Unmeasured
        off = asyncio.run(timing_bench.bus_run(1000))
    assert bus._bus.LoopScheduling is LoopScheduling  # put back
    on = asyncio.run(timing_bench.bus_run(1000))
    assert (off["samples"], on["samples"]) == (0, 256 + 2)
