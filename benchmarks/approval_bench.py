"""How soon a waiting run sees a decision made by another process, per poll interval.

A :class:`pantheon.approvals._desk.StoreDesk` asks; a separate ``pantheon approve`` process
decides it. Measured: from the decision's commit (its ``decided`` time in the store) to
``ask()`` returning in the run (the desk's pickup, which the poll interval bounds), and the
whole ``pantheon approve`` command (interpreter start included). Both poll intervals run
in one process, alternating, so the ratio holds on a busy machine even when the absolute
numbers do not.

    .venv/bin/python benchmarks/approval_bench.py [--repeats 15]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pantheon.approvals._desk import StoreDesk
from pantheon.scenario import ApprovalsConfig
from pantheon.sessions import SessionStore


async def once(store: Path, sid: str, poll: float, n: int) -> tuple[float, float]:
    desk = StoreDesk(store, sid, ApprovalsConfig(timeout=60, poll=poll))
    asking = asyncio.ensure_future(desk.ask("bench", {"summary": f"request {n}"}))
    # The desk announces nothing when its row is in; the bench looks every millisecond.
    while not desk._waiting:  # noqa: ASYNC110
        await asyncio.sleep(0.001)
    (approval_id,) = desk._waiting
    started = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "pantheon.cli", "approve", sid, str(approval_id),
        "--store", str(store), stdout=subprocess.DEVNULL,
    )  # fmt: skip
    answer = await asking
    picked_wall, picked = time.time(), time.perf_counter()
    await proc.wait()
    await desk.aclose()
    return picked_wall - answer["decided_at"], picked - started


async def main(repeats: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        store = Path(folder) / "s.db"
        with SessionStore(store) as st:
            sid = st.begin_session(scenario="bench")
        results: dict[float, list[tuple[float, float]]] = {0.05: [], 0.2: []}
        n = 0
        for _ in range(repeats):
            for poll in results:
                n += 1
                results[poll].append(await once(store, sid, poll, n))
    print(
        "| poll (s) | pickup after the decision's commit, median (ms) | max (ms) "
        "| approve command to pickup, median (ms) |"
    )
    print("|---:|---:|---:|---:|")
    for poll, rows in results.items():
        pickup = [r[0] * 1000 for r in rows]
        total = [r[1] * 1000 for r in rows]
        print(f"| {poll} | {statistics.median(pickup):.0f} | {max(pickup):.0f} | "
              f"{statistics.median(total):.0f} |")  # fmt: skip
    a, b = (statistics.median(r[0] for r in results[p]) for p in (0.05, 0.2))
    print(f"\npickup ratio poll 0.2 / poll 0.05: {b / a:.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    asyncio.run(main(parser.parse_args().repeats))
