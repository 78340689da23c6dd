"""The end of a run waits for its team as long as the team keeps finishing messages, and
names what is stuck once nothing moves: a team of its own (a slow Summarizer behind an
Intake), in one process, with a drain timeout short enough to tell the two apart."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from pantheon.runner import RunStuck, run_scenario
from pantheon.scenario import load_scenario

AGENTS = '''
import asyncio

from agents import Agent, AgentSettings


class Summarizer(Agent):
    """Takes ``seconds`` per document; a document marked ``stuck`` never finishes."""

    class Settings(AgentSettings):
        seconds: float = 0.1

    async def handle(self, env):
        if env.payload.get("stuck"):
            await asyncio.Event().wait()
        await asyncio.sleep(self.settings.seconds)
        await self.emit("doc.summarized", {"id": env.payload["id"]})
'''

SCENARIO = """\
version: 1
name: docs
input: {{kind: jsonl, path: docs.jsonl, topic: doc.received, key: id}}
agents:
  summarizer:
    class: "drain_docs:Summarizer"
    subscribe: [doc.received]
    settings: {{seconds: {seconds}}}
"""


def team(tmp_path: Path, docs: list[dict[str, object]], seconds: float) -> Path:
    (tmp_path / "drain_docs.py").write_text(textwrap.dedent(AGENTS).lstrip())
    (tmp_path / "docs.jsonl").write_text("".join(json.dumps(d) + "\n" for d in docs))
    path = tmp_path / "docs.yaml"
    path.write_text(SCENARIO.format(seconds=seconds))
    return path


async def test_a_slow_team_that_keeps_finishing_is_waited_for(tmp_path: Path) -> None:
    # 12 documents one at a time, 0.15 s each: ~1.8 s of work after the input ends, six
    # times the drain timeout, every stretch of which finishes a document or two.
    path = team(tmp_path, [{"id": f"d{i}"} for i in range(12)], seconds=0.15)
    summary = await run_scenario(load_scenario(path), drain_timeout=0.3)
    assert summary.topics.get("doc.summarized") == 12
    assert summary.hops["summarizer"]["handled"] == 12


async def test_a_team_that_finishes_nothing_is_named_stuck(tmp_path: Path) -> None:
    path = team(tmp_path, [{"id": "d0"}, {"id": "d1", "stuck": True}], seconds=0.01)
    with pytest.raises(RunStuck) as stuck:
        await run_scenario(load_scenario(path), drain_timeout=0.5)
    assert "the team finished nothing for 0.5 s and still holds work: summarizer (1 in flight" in (
        str(stuck.value)
    )
