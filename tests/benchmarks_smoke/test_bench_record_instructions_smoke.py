"""benchmarks/record_instructions.py's counted run, without valgrind: the run it counts
reaches ``bus.drain()`` with the recorder's clocks stretched, and exits there (a renamed
recorder or bus internal it stretches fails here, not in someone's two-minute benchmark)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "record_instructions.py"


@pytest.mark.parametrize("mode", ["off", "recording"])
def test_the_counted_run_ends_at_drain(mode: str) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--child", mode, "20"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    # Exit 0 only from the exit at drain: a run that ends otherwise exits 1 with a message.
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "without bus.drain()" not in proc.stderr
