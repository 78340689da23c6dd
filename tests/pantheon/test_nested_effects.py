"""An effect whose function makes effects of its own: a tool that asks a person before it
acts (the first way anyone writes "a tool a person must approve"). The record holds the
tool's call and, inside it, the approval; a replay serves the tool's answer without running
it, so the approval inside is never asked again, and the handling's next effect must still
find its own record (QA: the next call met the approval's record, "expected
'human.approval', got 'model.openai.chat'", and the replay diverged).

A maintenance team, not the support desk, on one process and on ZeroMQ (the Fixer on a
node of its own): the Fixer restarts a host through ``tool.restart``, which asks for
approval inside, then notes the result with ``tool.note``; and it runs two calls at once
(``asyncio.gather``), neither inside the other, however their times overlap."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from cli_run import pantheon

from pantheon.sessions import SessionStore

AGENTS = """
import asyncio
from pathlib import Path

from agents import Agent, AgentSettings

LOG = Path(__file__).with_name("restarts.log")


def note(result):
    return f"noted: {result}"


async def ping(host, delay):
    await asyncio.sleep(delay)
    return f"{host} up after {delay}"


class Fixer(Agent):
    class Settings(AgentSettings):
        careful: bool = True

    async def restart(self, host):
        if self.settings.careful:
            answer = await self.approve({"summary": f"restart {host}", "host": host})
            if not answer.approved:
                return "refused"
        with LOG.open("a") as log:
            log.write(host + "\\n")
        return "restarted"

    async def handle(self, env):
        host = env.payload["host"]
        # Two calls at once: the second's whole call lies inside the first's time.
        slow, fast = await asyncio.gather(
            self.effect("tool.ping", ping, host, 0.05),
            self.effect("tool.ping", ping, host, 0.0),
        )
        done = await self.effect("tool.restart", self.restart, host)
        noted = await self.effect("tool.note", note, done)
        await self.emit("fix.done", {"id": env.payload["id"], "result": done, "note": noted,
                                     "pings": [slow, fast]})
"""

SCENARIO = """\
version: 1
name: maintenance
input: {{kind: jsonl, path: hosts.jsonl, topic: host.alerted}}
approvals:
  {{timeout: 60, default: reject, poll: 0.05, auto: {{approve_after: 0.1, note: scripted}}}}
{transport}agents:
  fixer:
    class: "maintenance:Fixer"
    subscribe: [host.alerted]
    concurrency: 4
"""

ZMQ = "transport:\n  kind: zmq\n  broker: tcp://127.0.0.1:0\n  nodes:\n    hands: [fixer]\n"
COUNT = 6


def _team(folder: Path, transport: str) -> None:
    (folder / "maintenance.py").write_text(textwrap.dedent(AGENTS).lstrip())
    hosts = [json.dumps({"id": f"H-{i}", "host": f"web{i}"}) for i in range(COUNT)]
    (folder / "hosts.jsonl").write_text("\n".join(hosts) + "\n")
    (folder / "maintenance.yaml").write_text(SCENARIO.format(transport=transport))


def _json(proc: Any) -> dict[str, Any]:
    assert proc.stdout.strip(), f"exit {proc.returncode}: {proc.stderr}"
    out: dict[str, Any] = json.loads(proc.stdout)
    return out


@pytest.mark.parametrize("transport", ["", ZMQ], ids=["inprocess", "zmq"])
def test_a_replay_serves_a_tool_that_asked_for_approval_inside(
    tmp_path: Path, transport: str
) -> None:
    _team(tmp_path, transport)
    run = _json(pantheon("run", "maintenance.yaml", "--store", "s.db", "--json", cwd=tmp_path))
    assert run["topics"]["fix.done"] == COUNT, run
    restarted = (tmp_path / "restarts.log").read_text().split()
    assert sorted(restarted) == [f"web{i}" for i in range(COUNT)]
    with SessionStore(tmp_path / "s.db", create=False) as st:
        names = [e.name for e in st.effects(run["session_id"])]
    assert names.count("human.approval") == COUNT and names.count("tool.restart") == COUNT

    replay = _json(pantheon("replay", run["session_id"], "--store", "s.db", "--json", cwd=tmp_path))
    assert replay["matched"] is True, replay
    assert replay["effects_called"] == 0
    # Every recorded call served, the approvals inside the tools among them.
    assert replay["effects_served"] == 5 * COUNT
    assert (tmp_path / "restarts.log").read_text().split() == restarted  # nothing done again

    # The replay's own record replays too: it holds the nested approvals where they were.
    again = _json(
        pantheon("replay", replay["new_session_id"], "--store", "s.db", "--json", cwd=tmp_path)
    )
    assert (again["matched"], again["effects_called"]) == (True, 0), again


def test_a_whatif_whose_tool_no_longer_asks_records_no_approval(tmp_path: Path) -> None:
    """The Fixer changed to restart without asking: its restarts run live (the agent
    changed), and ask nobody. The approvals recorded inside the original's restarts are
    not written into the what-if as if served (review: they were, "approved by auto", and
    a replay of the what-if then diverged on them)."""
    _team(tmp_path, "")
    run = _json(pantheon("run", "maintenance.yaml", "--store", "s.db", "--json", cwd=tmp_path))
    (tmp_path / "bold.yaml").write_text("agents:\n  fixer:\n    settings:\n      careful: false\n")
    whatif = _json(
        pantheon("replay", run["session_id"], "--with", "bold.yaml", "--store", "s.db", "--json",
                 cwd=tmp_path)
    )  # fmt: skip
    assert whatif["called_by_name"].get("tool.restart") == COUNT, whatif
    assert "human.approval" not in whatif["served_by_name"], whatif
    with SessionStore(tmp_path / "s.db", create=False) as st:
        names = [e.name for e in st.effects(whatif["new_session_id"])]
    assert "human.approval" not in names and names.count("tool.note") == COUNT
    again = _json(
        pantheon("replay", whatif["new_session_id"], "--store", "s.db", "--json", cwd=tmp_path)
    )
    assert (again["matched"], again["effects_called"]) == (True, 0), again
