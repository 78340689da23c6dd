"""Honest timing across processes: a node's handlers' own time and its CPU-wait figure
reach the driver's summary, which judges them as an in-process run's, strictly or not."""

from __future__ import annotations

import dataclasses
import threading
from pathlib import Path

import pytest

import pantheon.runner._report
from pantheon.runner._report import judge
from pantheon.scenario import load_scenario
from pantheon.testing import run_scenario

AGENTS = '''
import asyncio


async def nap(env):
    """30 ms of waiting and no CPU: late only if something else makes it late."""
    await asyncio.sleep(0.03)
'''

SCENARIO = """version: 1
name: timing_zmq
transport:
  kind: zmq
  broker: tcp://127.0.0.1:0
  nodes:
    work: [worker]
input: {kind: generator, topic: item.new, payload: {n: 1}, count: 6}
agents:
  worker:
    handler: "timing_zmq_agents:nap"
    subscribe: ["item.new"]
expect:
  zero_lost: true
  p99_handling_ms: 10
"""


LINUX_SCHEDSTAT = Path(f"/proc/self/task/{threading.get_native_id()}/schedstat").exists()


@pytest.mark.skipif(not LINUX_SCHEDSTAT, reason="waits per handling are measured on Linux")
def test_a_nodes_awaiting_handler_fails_and_its_excused_check_is_inconclusive_unless_strict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every run counts as starved (the rule itself: tests/pantheon/test_timing_honesty.py),
    # so what is left to see is the node's figures reaching the driver's judge.
    monkeypatch.setattr(pantheon.runner._report, "STARVED_SHARE", 0.0)
    (tmp_path / "timing_zmq_agents.py").write_text(AGENTS)
    path = tmp_path / "scenario.yaml"
    path.write_text(SCENARIO)
    summary = run_scenario(path, record=False)
    assert set(summary.nodes) == {"driver", "work"}
    worker = summary.hops["worker"]
    assert worker["handle_p99_ms"] >= 25.0 and 0.0 < worker["cpu_p99_ms"] < 10.0
    # The node's own time (less its waits for a CPU) has the 30 ms awaited: slow code.
    assert worker["own_p99_ms"] >= 25.0
    assert set(summary.scheduling) == {"source", "wall_s", "cpu_s", "wait_s", "share"}
    (check,) = [e for e in summary.expectations if e["name"].startswith("timing:")]
    assert (check["state"], check["passed"], summary.passed) == ("failed", False, False)
    assert check["why"].endswith("over the bound: slow at any load")

    # Had the node's waits for a CPU explained the 30 ms: inconclusive, failed when strict.
    scenario = load_scenario(path)
    excused = dataclasses.replace(summary, hops={"worker": worker | {"own_p99_ms": 1.0}})
    (check,) = [e for e in judge(scenario, excused) if e["name"].startswith("timing:")]
    assert (check["state"], check["passed"]) == ("inconclusive", True)
    strict = scenario.model_copy(
        update={"expect": scenario.expect.model_copy(update={"strict_timing": True})}
    )
    (check,) = [e for e in judge(strict, excused) if e["name"].startswith("timing:")]
    assert (check["state"], check["passed"]) == ("failed", False)
    assert check["why"].endswith("), and timing is strict")
