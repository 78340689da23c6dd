"""Smoke run of benchmarks/routing_bench.py: both sides run, import the tree they were given,
route correctly (the children check miss and match-one delivery counts) and report numbers.

Not a timing test: small sizes, and the same tree on both sides.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "routing_bench.py"


def test_routing_bench_compares_two_trees(tmp_path: Path) -> None:
    out = tmp_path / "routing.json"
    args = ["--patterns", "200", "--topics", "400", "--json", str(out), "--markdown"]
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--before", str(ROOT), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "| 200 patterns | unit | before | after | after/before |" in proc.stdout
    res = json.loads(out.read_text())
    assert set(res["sides"]) == {"before", "after"}
    for side in res["sides"].values():
        assert Path(side["bus_module"]) == ROOT / "bus" / "__init__.py"
        assert side["subscribe_s"] > 0
        for phase in ("miss_shared", "miss_unknown", "match_one"):
            assert 0 < side[phase]["median_us"] <= side[phase]["p99_us"]


def test_routing_bench_refuses_a_tree_without_the_bus(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--before", str(tmp_path), "--patterns", "10"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 1
    assert f"child imported {ROOT / 'bus' / '__init__.py'}, not {tmp_path}/bus/__init__.py" in (
        proc.stderr
    )
