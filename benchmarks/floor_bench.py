#!/usr/bin/env python
"""How close to the in-process limit a bus with Pantheon's per-message duties can get.

    .venv/bin/python benchmarks/floor_bench.py [--harness ../shared/bench] [--reps 3]
        [--loops asyncio,uvloop] [--mypyc]

Issue #15 asks for 1-subscriber throughput >= 0.6x "the limit" of the shared harness
(``inproc_limit.py``: one deque drained by one worker awaiting the handler, fed by a plain
function call). This runs, in that same harness and in fresh processes alternating within
each repeat:

* ``pantheon``: the bus, as ``inproc_limit.py`` measures it (``await bus.emit``);
* ``floor``: benchmarks/_floor_bus.py, the least a bus can do and still give each message
  an envelope, a route, a bounded priority mailbox and a worker with counts (no observers,
  breaker, retries, timing, DLQ, replies, transport), driven the same way;
* ``floor-mypyc`` (with ``--mypyc``): the same file compiled to C by mypyc;
* ``limit``: the harness's ``phys_deque_future``.

Prints each system's median msg/s and the median of per-repeat ratios to the limit. If the
floor stays under 0.6x, so will any bus that keeps those duties in this language and way
of writing; the gap between ``pantheon`` and ``floor`` is what all of the bus's other
promises cost.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _child(harness: str, system: str, loop: str, floor_dir: str) -> None:
    """Run one (system, loop) in the harness's own process driver; prints RESULT:{json}."""
    sys.path.insert(0, harness)
    if system.startswith("floor"):
        sys.path.insert(0, floor_dir)
    import pantheon_inproc as P  # the harness's driver, with Pantheon registered
    from common import perf_ns

    if system.startswith("floor"):
        import _floor_bus as F

        async def make_floor(sink: Any) -> Any:
            bus = F.FloorBus()

            async def handler(env: Any) -> None:
                sink.hit(env.payload["ts"])

            box = bus.on("ev", handler)
            asyncio.get_running_loop().create_task(bus.work(box))
            await asyncio.sleep(0)
            emit = bus.emit

            async def e(i: int) -> None:
                await emit("ev", {"id": i, "ts": perf_ns()})

            return e, True, {"floor": F.__file__}

        P.B.SYSTEMS[system] = make_floor
    harness_name = "phys_deque_future" if system == "limit" else system
    sys.argv = [sys.argv[0], "--system", harness_name, "--loop", loop]
    P.main()


def _one(harness: str, system: str, loop: str, floor_dir: str) -> dict[str, Any] | None:
    cmd = [sys.executable, __file__, "--_child", system, loop, floor_dir, "--harness", harness]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT:"):
            result: dict[str, Any] = json.loads(line[7:])
            return result
    sys.stderr.write(f"{system}/{loop} gave no result:\n{p.stderr[-2000:]}\n")
    return None


def _compile(into: Path) -> bool:
    """Compile _floor_bus.py with mypyc into ``into``; False (and why) if it cannot."""
    mypyc = shutil.which("mypyc", path=str(Path(sys.executable).parent)) or shutil.which("mypyc")
    if mypyc is None:
        print("--mypyc: no mypyc on PATH or beside this python (pip install mypy)")
        return False
    shutil.copy(HERE / "_floor_bus.py", into / "_floor_bus.py")
    p = subprocess.run(
        [mypyc, "_floor_bus.py"],
        cwd=into,
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if p.returncode != 0 or not list(into.glob("_floor_bus*.so")):
        print(f"--mypyc: compiling failed:\n{p.stdout[-1500:]}{p.stderr[-1500:]}")
        return False
    (into / "_floor_bus.py").unlink()  # the .so must be what gets imported
    return True


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--harness", default=str(ROOT.parent / "shared" / "bench"))
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--loops", default="asyncio,uvloop")
    ap.add_argument("--mypyc", action="store_true", help="also run the floor compiled by mypyc")
    ap.add_argument("--_child", nargs=3, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a._child:
        _child(a.harness, *a._child)
        return 0
    if not (Path(a.harness) / "pantheon_inproc.py").exists():
        ap.error(f"--harness {a.harness}: no pantheon_inproc.py there (../shared/bench)")
    systems = ["pantheon", "floor", "limit"]
    with tempfile.TemporaryDirectory() as tmp:
        compiled = Path(tmp)
        if a.mypyc and _compile(compiled):
            systems.insert(2, "floor-mypyc")
        dirs = {"floor": str(HERE), "floor-mypyc": str(compiled)}
        rows: dict[tuple[str, str], list[float]] = {}
        ratios: dict[tuple[str, str], list[float]] = {}
        for rep in range(a.reps):
            for loop in a.loops.split(","):
                got = {s: _one(a.harness, s, loop, dirs.get(s, "")) for s in systems}
                limit = got["limit"]
                for s, r in got.items():
                    if r is None:
                        continue
                    rows.setdefault((s, loop), []).append(r["throughput"])
                    if limit is not None:
                        ratios.setdefault((s, loop), []).append(
                            r["throughput"] / limit["throughput"]
                        )
                print(
                    f"rep {rep} {loop}: "
                    + "  ".join(f"{s} {r['throughput']:,.0f}/s" for s, r in got.items() if r),
                    flush=True,
                )
    print(f"\n{'system':14s} {'loop':8s} {'msg/s median':>14s} {'/ limit':>8s}")
    for (s, loop), vals in sorted(rows.items(), key=lambda kv: (kv[0][1], systems.index(kv[0][0]))):
        ratio = statistics.median(ratios.get((s, loop), [float("nan")]))
        print(f"{s:14s} {loop:8s} {statistics.median(vals):>14,.0f} {ratio:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
