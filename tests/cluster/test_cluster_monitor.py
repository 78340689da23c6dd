"""A Monitor watches the whole team in a ZeroMQ run, wherever it runs, and ``pantheon diff``
of the team in one process against the same team on three: real ``pantheon`` processes (a
broker and one process per node) on loopback, and a real store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from claims_team import PLACEMENT, placed, write_team
from cli_run import pantheon

from pantheon.sessions import SessionStore

ALERT = "monitor.alert.dead_letters"


def run_json(tmp_path: Path, path: Path) -> dict[str, Any]:
    proc = pantheon("run", str(path), "--json", "--store", "s.db", cwd=tmp_path)
    assert proc.stdout.strip(), proc.stderr
    summary: dict[str, Any] = json.loads(proc.stdout)
    assert proc.returncode == 0 and summary["passed"], summary["expectations"]
    return summary


def alerts(tmp_path: Path, session: str) -> list[dict[str, Any]]:
    with SessionStore(tmp_path / "s.db") as st:
        return [e.payload for e in st.envelopes(session) if e.topic == ALERT]


@pytest.mark.parametrize("where", ["driver", "node"])
def test_the_monitor_alerts_on_dead_letters_of_other_processes(tmp_path: Path, where: str) -> None:
    """The payer fails on its node (``bank``); the Monitor runs on the driver, or on the
    intake's node (``checks``). It used to sample only its own bus, where no dead letter
    ever was: ``alerts 0``, where the same team in one process alerted."""
    transport = placed("zmq")
    if where == "node":
        assert "checks: [intake]" in PLACEMENT
        transport = transport.replace("checks: [intake]", "checks: [intake, monitor]")
    summary = run_json(tmp_path, write_team(tmp_path, transport=transport, concurrency=8))
    hosts = {name: node["agents"] for name, node in summary["nodes"].items()}
    assert "monitor" in hosts["driver" if where == "driver" else "checks"]
    dead = summary["dlq"]["failed"]
    assert dead > 0  # the payer's, on bank
    assert summary["alerts"] >= 1
    seen = alerts(tmp_path, summary["session_id"])
    assert len(seen) == summary["alerts"]
    # Each sample counted the team's dead letters, never more than there were.
    sizes = [a["dlq_size"] for a in seen]
    assert sizes == sorted(sizes) and 0 < sizes[-1] <= dead


def test_diff_of_one_process_and_three_finds_no_difference(tmp_path: Path) -> None:
    """The same team, the same seed, in one process and over ZeroMQ: every claim is
    decided and paid alike (the payer's failures are drawn per claim). The Monitor's
    alerts came when its samples fell: not compared, and said so. The diff used to pair
    the in-process run's alert with the other run's next input ("A has
    'monitor.alert.dead_letters', B has 'claim.rejected_input'") and exit 1."""
    alone = run_json(tmp_path, write_team(tmp_path, concurrency=8))
    three = run_json(
        tmp_path, write_team(tmp_path, transport=placed("zmq"), concurrency=8, name="zmq.yaml")
    )
    assert alone["alerts"] >= 1
    a, b = alone["session_id"], three["session_id"]
    proc = pantheon("diff", a, b, "--json", "--store", "s.db", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    diff = json.loads(proc.stdout)
    assert diff["identical"] is True and diff["differences"] == 0
    assert diff["not_compared_a"].get("sampled") == alone["alerts"]
    assert diff["not_compared_b"].get("sampled", 0) == three["alerts"]
    text = pantheon("diff", a, b, "--store", "s.db", cwd=tmp_path)
    assert text.returncode == 0, text.stdout
    assert "sampled Monitor alerts and what they caused" in text.stdout
    assert "no difference" in text.stdout


def test_the_driver_tells_a_node_the_rest_of_the_teams_dead_letters() -> None:
    """What the driver keeps from its polls: the nodes' sum for its own Monitors, and for
    each node hosting one the team's total less its own, said again only once it changed
    (a killed node's last figure stays in: its dead letters happened)."""
    from pantheon.runner._team_dead_letters import TeamDeadLetters

    team = TeamDeadLetters()
    statuses: dict[str, dict[str, Any] | None] = {"checks": None, "bank": {"dead_letters": 4}}
    assert team.polled({"dead_letters": 1}, statuses, {"checks"}) == {"checks": 5}
    assert team() == 4
    assert team.polled({"dead_letters": 1}, statuses, {"checks"}) == {}  # unchanged
    statuses["checks"] = {"dead_letters": 2}
    assert team.polled({"dead_letters": 1}, statuses, {"checks"}) == {}  # its own: same rest
    assert team() == 6
    node = TeamDeadLetters()
    node.heard({"cmd": "team_dead_letters", "dead_letters": 5})
    assert node() == 5
