"""Smoke run of benchmarks/nats_bench.py: both rows really measure, on a server the
benchmark starts itself. Not a timing test: it checks that every message is counted and
every number is reported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "nats_bench.py"


def test_raw_and_pantheon_rows_measure(tmp_path: Path) -> None:
    out = tmp_path / "nats_bench.json"
    proc = subprocess.run(
        [
            sys.executable, str(BENCH), "--count", "300", "--trips", "20", "--repeats", "1",
            "--storage", "memory", "--json", str(out),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    res = json.loads(out.read_text())
    assert res["count"] == 300 and res["storage"] == "memory"
    assert res["one_way_msgs_per_s"]["raw"] > 0 and res["one_way_msgs_per_s"]["pantheon"] > 0
    for row in ("raw", "pantheon", "pantheon_request"):
        assert 0 < res["rtt_ms"][row]["p50"] <= res["rtt_ms"][row]["p99"]
    assert res["one_way_ratio"] > 0
