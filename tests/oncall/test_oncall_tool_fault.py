"""``faults.agents.actor.tool`` aimed at a tool of the team's own (the on-call Actor's
``page``): it validates against that Actor's tools, and in a run exactly that tool's calls
fail, each one dead-lettered, while the team's other tools go on working."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_run import pantheon as cli

from pantheon.scenario import ScenarioError, load_scenario

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"


def oncall_with(tmp_path: Path, fault: str) -> Path:
    """scenarios/oncall.yaml over its first 200 alerts with ``fault`` under
    ``faults.agents.actor``, written to ``tmp_path`` (the team still imported from
    scenarios/)."""
    text = (SCENARIOS / "oncall.yaml").read_text(encoding="utf-8")
    data = SCENARIOS / "data" / "oncall_alerts.jsonl"
    text = text.replace("  path: data/oncall_alerts.jsonl", f"  path: {data}\n  count: 200")
    text = text.replace("seed: 11\n", f"seed: 11\npath: [{SCENARIOS}]\n")
    text = text.replace("\nexpect:\n", f"\nfaults:\n  agents:\n    actor: {fault}\nexpect:\n")
    path = tmp_path / "oncall_faulty.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_a_tool_fault_names_a_tool_of_the_actor(tmp_path: Path) -> None:
    ok = load_scenario(oncall_with(tmp_path, "{failure_rate: 0.5, tool: restart_service}"))
    fault = ok.faults.agents["actor"]
    assert fault.tool == "restart_service"

    path = oncall_with(tmp_path, "{failure_rate: 0.5, tool: pgae}")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    (problem,) = info.value.problems
    lines = path.read_text(encoding="utf-8").splitlines()
    assert (problem.file, problem.field) == (str(path), "faults.agents.actor.tool")
    assert "tool: pgae" in lines[problem.line - 1]
    assert problem.message == (
        "actor 'actor' has no tool 'pgae' (did you mean 'page'?); its tools: reply, ticket, "
        "escalate, page, restart_service, clear_disk, failover_db, renew_cert, scale_out"
    )


def test_a_fault_on_the_team_s_own_tool_fails_exactly_its_calls(tmp_path: Path) -> None:
    path = oncall_with(tmp_path, "{failure_rate: 1.0, tool: page}")
    proc = cli("run", str(path), "--json", "--no-record", cwd=tmp_path)
    summary = json.loads(proc.stdout)
    assert proc.returncode == 1, proc.stderr  # max_dlq: 0 fails
    dead = summary["dead_letters"]
    assert dead and summary["dlq"] == {"failed": len(dead)}
    assert {(d["subscriber"], d["reason"]) for d in dead} == {("actor", "failed")}
    assert all(d["error"].startswith("InjectedFault: actor: injected failure") for d in dead)
    # Every page failed (each after the Actor's three attempts); the other tools ran.
    assert "page" not in summary["outbox"]
    assert set(summary["outbox"]) >= {"restart_service", "renew_cert"}
