"""Multi-process sessions recorded by real ``pantheon run``s (a broker and one process per
ZeroMQ node), for the tests of what shows the node of each hop: ``sessions show``, ``diff``,
both dashboards. Recorded once per test session (per xdist worker) by the fixture
:func:`node_sessions`; a test that changes the store works on a copy."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tripping import ACTOR_BREAKER, TICKETS_FAIL, run_json
from untimed import copy_untimed

__all__ = ["NodeSessions", "record_node_sessions"]

#: The reference team's placement on three nodes (scenarios/support_email_3node.yaml).
THREE = """  nodes:
    perception: [sensor, monitor]
    cognition: [reasoner, memory, planner]
    action: [guardian, actor]
"""
#: Two Reasoners, one on a node the scenario kills mid-run (as tests/cluster kill one).
KILL = """  heartbeat: 0.2
  liveness: 10
  nodes:
    keep: [sensor, memory, planner, monitor, guardian, actor]
    work1: [reasoner]
    work2: [reasoner]
"""
KILL_FAULTS = """
faults:
  agents:
    reasoner: {latency_ms: 5}
  kill_node: {node: work2, at: 0.15}
"""


@dataclass(frozen=True)
class NodeSessions:
    """``three``: the support team on three nodes, 40 emails, its tickets failing (dead
    letters on node ``action``); ``alone``: the same scenario in one process with a lower
    refund limit (so the two differ somewhere); ``killed``: 300
    emails over two Reasoner nodes, ``work2`` SIGKILLed 0.15 s in (its journal stops)."""

    store: Path
    three: str
    alone: str
    killed: str
    summaries: dict[str, dict[str, object]]


def record_node_sessions(workdir: Path) -> NodeSessions:
    """Record the three sessions in ``workdir/s.db`` (scenarios copied untimed there)."""
    scenarios = copy_untimed(workdir)
    base = (scenarios / "support_email_3node.yaml").read_text(encoding="utf-8")
    assert THREE in base and "  rate: 1000 " in base
    three = base.replace("  rate: 1000 ", "  count: 40\n  rate: 1000 ") + TICKETS_FAIL
    # The breaker opens at the first failed ticket, so every run has a breaker change on
    # node action: at the bus's default (5 failures in a row) it depended on how the
    # Actor's replies and failing tickets interleaved, and a loaded run could have none.
    assert ACTOR_BREAKER in three
    three = three.replace(ACTOR_BREAKER, "    breaker: {consecutive_failures: 1}\n")
    (scenarios / "nodes3.yaml").write_text(
        three.replace("name: support_email_3node", "name: nodes3")
    )
    start, end = three.index("transport:"), three.index("provider:")
    alone = (three[:start] + three[end:]).replace("name: support_email_3node", "name: alone")
    # A lower refund limit: the Guardian decides some emails otherwise, so a diff of the
    # two runs always has a first difference to place.
    assert "  refund_limit: 200.0 " in alone
    alone = alone.replace("  refund_limit: 200.0 ", "  refund_limit: 20.0 ")
    (scenarios / "alone.yaml").write_text(alone)
    killed = base.replace(THREE, KILL).replace("name: support_email_3node", "name: killed")
    killed = killed.replace("  rate: 1000 ", "  count: 300\n  rate: 1000 ") + KILL_FAULTS
    (scenarios / "killed.yaml").write_text(killed)
    summaries = {
        name: run_json(workdir, f"scenarios/{name}.yaml") for name in ("nodes3", "alone", "killed")
    }
    return NodeSessions(
        workdir / "s.db",
        three=str(summaries["nodes3"]["session_id"]),
        alone=str(summaries["alone"]["session_id"]),
        killed=str(summaries["killed"]["session_id"]),
        summaries=summaries,
    )
