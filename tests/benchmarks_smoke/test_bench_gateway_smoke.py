"""Smoke run of benchmarks/gateway_bench.py: every operation runs against a real server and
reports a figure. Not a timing test: the numbers live in benchmarks/RESULTS.md."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("websockets")
pytest.importorskip("uvicorn")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "gateway_bench.py"


def test_every_row_of_the_seed_table_is_measured(tmp_path: Path) -> None:
    out = tmp_path / "gateway_bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--repeats", "1", "--markdown", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    for row in ("single", "bulk50", "bulk50x4", "bulk1000x4", "bulk1000x4_unsubscribed"):
        assert res[row]["msg_s"] > 0, row
    assert 0 < res["e2e"]["p50_ms"] <= res["e2e"]["p99_ms"]
    assert res["broadcast"]["deliveries_s"] > 0  # and no message dropped (the bench asserts it)
    assert "| broadcast to 30 WebSocket subs | deliv/s |" in proc.stdout
