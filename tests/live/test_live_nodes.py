"""The live feed of a real 3-node ZeroMQ run (``pantheon run`` in a subprocess, watched from
here): its snapshots name the processes and place each hop on its agent's node."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

from untimed import copy_untimed

from pantheon.live import Snapshot, connect, live_sessions
from pantheon.sessions import SessionStore

DEADLINE = 120.0


async def _watch(store: Path, child: subprocess.Popen[bytes]) -> list[Snapshot]:
    end = time.monotonic() + DEADLINE
    while True:
        if store.exists():  # noqa: ASYNC240 - a stat per poll
            with SessionStore(store, create=False) as st:
                found = live_sessions(st)
            if found:
                break
        assert child.poll() is None, "the run ended before its feed was found"
        assert time.monotonic() < end, "no live session appeared"
        await asyncio.sleep(0.02)
    client = await connect(found[0][1])
    async with asyncio.timeout(DEADLINE):
        seen = [snap async for snap in client]
    await client.aclose()
    return seen


def test_a_3_node_runs_feed_names_its_processes_and_each_hops_node(tmp_path: Path) -> None:
    scenarios = copy_untimed(tmp_path)
    text = (scenarios / "support_email_3node.yaml").read_text(encoding="utf-8")
    # 100 emails at 50 a second: two seconds of snapshots while the nodes work.
    text = text.replace("  rate: 1000 ", "  count: 100\n  rate: 50 ")
    (scenarios / "paced.yaml").write_text(text)
    store = tmp_path / "s.db"
    child = subprocess.Popen(
        [
            *(sys.executable, "-m", "pantheon.cli", "run", "scenarios/paced.yaml"),
            *("--json", "--store", str(store)),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        seen = asyncio.run(_watch(store, child))
        out, err = child.communicate(timeout=DEADLINE)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert json.loads(out)["session_id"], err
    live = [s for s in seen if s.live]
    assert live, "no snapshot while the run went on"
    assert live[-1].nodes == (
        "node perception: sensor, monitor",
        "node cognition: reasoner, memory, planner",
        "node action: guardian, actor",
    )
    # The feed is the driver's bus: the hops it sees are the Learner's, on the driver.
    hops = [h for s in live for t in s.traces for h in t.hops or ()]
    assert hops, "no hop in any live snapshot"
    assert {h.agent.partition(":")[0] for h in hops} == {"learner"}
    assert {h.node for h in hops} == {"driver"}
