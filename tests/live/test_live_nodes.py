"""The live feed of a real 3-node run on ZeroMQ and NATS (``pantheon run`` in a subprocess,
watched from here): its snapshots name the processes, show every node's work joined with
the driver's (pantheon.live._parts), each hop on its agent's node, and end on the figures
of the run's summary."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
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


PLACED = {
    "sensor": "perception",
    "monitor": "perception",
    "reasoner": "cognition",
    "memory": "cognition",
    "planner": "cognition",
    "guardian": "action",
    "actor": "action",
    "learner": "driver",
}


@pytest.mark.parametrize("scenario", ["support_email_3node.yaml", "support_email_nats.yaml"])
def test_a_3_node_runs_feed_shows_the_whole_team_each_hop_on_its_node(
    tmp_path: Path, scenario: str
) -> None:
    scenarios = copy_untimed(tmp_path)
    text = (scenarios / scenario).read_text(encoding="utf-8")
    # 100 emails at 50 a second: two seconds of snapshots while the nodes work.
    assert "  rate: 1000 " in text
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
    summary = json.loads(out)
    assert summary["session_id"], err
    live = [s for s in seen if s.live]
    assert live, "no snapshot while the run went on"
    assert live[-1].nodes == (
        "node perception: sensor, monitor",
        "node cognition: reasoner, memory, planner",
        "node action: guardian, actor",
    )
    # Every node's part joins the driver's feed: the request waterfalls hold the hops of
    # every process, each on its agent's node.
    hops = [h for s in live for t in s.traces for h in t.hops or ()]
    assert {h.agent.partition(":")[0] for h in hops} == set(PLACED) - {"monitor"}
    assert all(h.node == PLACED[h.agent.partition(":")[0]] for h in hops)
    assert any(len({h.node for h in t.hops or ()}) == 4 for s in live for t in s.traces)
    # The final snapshot counts what the run's summary counts, each message once however
    # many processes it reached, and the team's decisions as its record scores them.
    final = seen[-1]
    assert not final.live
    assert final.totals.published == summary["messages"]
    handled = {h.name: h.count for h in final.hops if h.kind == "agent"}
    assert handled == {name: hop["handled"] for name, hop in summary["hops"].items()}
    assert final.totals.dead_lettered == sum(summary["dlq"].values())
    assert final.outcomes.scored == summary["accuracy"]["scored"]
    assert final.outcomes.right == round(summary["accuracy"]["accuracy"] * final.outcomes.scored)
    assert {s.key: s.total for s in final.series if s.kind == "topic"} == summary["topics"]
