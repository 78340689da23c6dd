"""Smoke run of benchmarks/zmq_bench.py: the rows that need no outside broker really measure.

Not a timing test: it checks that every side of the benchmark starts, counts every message it
was sent and reports numbers, and that a broker that is not there gives a skipped row.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("zmq")

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "zmq_bench.py"


def run_bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "zmq_bench.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--quick", "--repeats", "1", "--json", str(out), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return json.loads(out.read_text())


def test_raw_and_pantheon_rows_measure_over_ipc(tmp_path: Path) -> None:
    res = run_bench(tmp_path, "--only", "zmq_drain,pantheon", "--transports", "ipc")
    for row in ("zmq_drain", "pantheon"):
        assert res["status"][row] == {"ipc": "ok"}, res["status"]
        cell = res["summary"][row]["ipc"]
        assert cell["msgs_per_s"] > 0
        assert 0 < cell["p50_us"] <= cell["p99_us"]
        tput = res["raw"][row]["ipc"]["throughput"]
        assert len(tput["repeats"]) == 1 and tput["repeats"][0]["n"] == tput["n"]
    verdicts = {t["target"]: t["pass"] for t in res["targets"]}
    assert verdicts["Pantheon ipc one way"] in (True, False)


def test_missing_broker_is_a_skipped_row(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port that was free a moment ago: nothing listens there
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_bench(tmp_path, "--only", "nats", "--nats", f"127.0.0.1:{port}")
    status = res["status"]["nats"]["tcp"]
    assert status.startswith("skipped: "), status
    assert f"127.0.0.1:{port}" in status or "not installed" in status


def test_rtt_floor_measures_every_style() -> None:
    floor = BENCH.with_name("zmq_rtt_floor.py")
    out = subprocess.run(
        [sys.executable, str(floor), "--trips", "200", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    rows = [
        line.split("|") for line in out.splitlines() if line.startswith("| ") and "us" not in line
    ]
    assert [r[1].strip() for r in rows] == ["blocking", "asyncio", "uvloop"]
    for r in rows:
        p50, p99 = float(r[2]), float(r[3])
        assert 0 < p50 <= p99
