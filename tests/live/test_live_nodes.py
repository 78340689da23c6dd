"""The live feed of a real 3-node run on ZeroMQ and NATS (``pantheon run`` in a subprocess,
watched from here): its snapshots name the processes, show every node's work joined with
the driver's (pantheon.live._parts), each hop on its agent's node, and end on the figures
of the run's summary."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from live_watch import watch_feed
from untimed import copy_untimed

from pantheon.live import Snapshot
from pantheon.sessions import SessionStore

DEADLINE = 120.0


async def _watch(store: Path, child: subprocess.Popen[bytes]) -> list[Snapshot]:
    _, client = await watch_feed(store, child, DEADLINE)
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
    except Exception as exc:
        # What the run said is the first thing to read when watching it failed (CI once
        # found its feed's socket refusing, and the run's own words were lost).
        if child.poll() is None:
            child.kill()
        _, err = child.communicate()
        raise AssertionError(
            f"watching the run failed ({exc!r}); the run exited {child.returncode}, "
            f"its stderr ends:\n{err.decode(errors='replace')[-4000:]}"
        ) from exc
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


PICKY = '''\
from agents import Agent
from bus import Envelope


class Picky(Agent):
    """Refuses a ticket marked bad: its message is dead-lettered on this agent's node."""

    subscriptions = ("ticket.received",)

    async def handle(self, env: Envelope) -> None:
        if env.payload.get("bad"):
            raise ValueError(f"ticket {env.payload['id']} is marked bad")
        await self.emit("ticket.done", {"id": env.payload["id"]})
'''


async def _redrive_first(store: Path, child: subprocess.Popen[bytes]) -> tuple[Any, int]:
    """Attach to the run's feed, wait for a dead letter from node ``work`` and redrive it:
    (the answer, the id the snapshot showed)."""
    _, client = await watch_feed(store, child, DEADLINE)
    try:
        async with asyncio.timeout(DEADLINE):
            async for snap in client:
                assert snap.live, "the run ended before a node's dead letter was shown"
                letters = [d for d in snap.dead_letters if d.node == "work"]
                if letters:
                    shown = letters[0].entry_id
                    return await client.redrive(shown), shown
    finally:
        await client.aclose()
    raise AssertionError("the feed ended")


TRANSPORTS = {
    "zmq": "  kind: zmq\n  broker: tcp://127.0.0.1:0\n",
    "nats": "  kind: nats\n  server: auto\n",
}


@pytest.mark.parametrize("transport", sorted(TRANSPORTS))
def test_a_watcher_redrives_a_nodes_dead_letter_on_that_node(
    tmp_path: Path, transport: str
) -> None:
    """The redrive goes from the client to the driver's feed, over the control pipe to node
    ``work``, whose bus takes the letter back; the store marks it under the id shown."""
    (tmp_path / "picky_mod.py").write_text(PICKY, encoding="utf-8")
    (tmp_path / "tickets.jsonl").write_text(
        "".join(json.dumps({"id": f"t{i}", "bad": i in (2, 5)}) + "\n" for i in range(150)),
        encoding="utf-8",
    )
    (tmp_path / "picky.yaml").write_text(
        "version: 1\nname: picky\n"
        f"transport:\n{TRANSPORTS[transport]}  nodes:\n    work: [picky]\n"
        "input: {kind: jsonl, path: tickets.jsonl, topic: ticket.received, rate: 50}\n"
        'agents:\n  picky: {class: "picky_mod:Picky"}\n',
        encoding="utf-8",
    )
    store = tmp_path / "s.db"
    child = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pantheon.cli",
            "run",
            "picky.yaml",
            "--json",
            "--store",
            str(store),
        ],
        cwd=tmp_path,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        result, shown = asyncio.run(_redrive_first(store, child))
        out, err = child.communicate(timeout=DEADLINE)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    assert result.ok, result.detail
    assert result.detail == "node work: re-published to its subscription"
    summary = json.loads(out)
    # Two bad tickets, and the one redriven failed again on the node: three dead letters.
    assert summary["dlq"] == {"failed": 3}, err
    with SessionStore(store) as st:
        letters = {d.entry_id: d for d in st.dead_letters(summary["session_id"])}
    # Node work is process 1 of 2: its own ids are shown and stored as own * 2 + 1.
    assert shown % 2 == 1 and letters[shown].node == "work"
    assert letters[shown].redriven and letters[shown].redriven_by == summary["session_id"]
    assert sum(d.redriven for d in letters.values()) == 1
