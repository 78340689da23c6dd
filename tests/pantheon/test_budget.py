"""Live budgets: a scenario's ``budget:`` stops model calls at its limit during the run (the
message dead-lettered with reason ``budget``, ``system.budget`` said once per scope), the
summary says what each scope spent, and a replay refuses exactly the same calls.

Every run here is a real scenario run against the scripted stand-in model server over real
sockets (``pantheon.testing.ModelServer``), recorded in a real SQLite store."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from budget_session import PER_CALL, REPLY, TICKETS, budget_scenario, budget_team
from cli_run import pantheon as pantheon_cli

import pantheon
from pantheon.scenario import ScenarioError
from pantheon.testing import ModelServer, assert_replays, run_scenario, whatif


@pytest.fixture
def team(tmp_path: Path) -> Path:
    return budget_team(tmp_path / "team")


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(reply=REPLY) as s:
        yield s


def test_a_run_budget_stops_model_calls_at_n_tokens_within_one_call(
    team: Path, server: ModelServer
) -> None:
    n = 23
    path = budget_scenario(
        team,
        f"run: {{tokens: {n}}}",
        """\
        asker: {class: "budget_team_mod:Asker", concurrency: 4}
        listener: {class: "budget_team_mod:Listener"}
        monitor: {}
        """,
    )
    summary = run_scenario(path, provider=server)
    spent = summary.usage["input_tokens"] + summary.usage["output_tokens"]
    calls = summary.usage["calls"]
    assert spent == calls * PER_CALL  # the server's counting, as assumed
    # Stopped at N, give or take the one call that crossed it, with 4 handlings at once.
    assert n <= spent < n + PER_CALL
    assert len(server.requests) == calls  # a refused call never reached the server
    assert summary.dlq == {"budget": TICKETS - calls}
    assert {d["reason"] for d in summary.dead_letters} == {"budget"}
    assert all("BudgetExceeded: budget 'run' spent" in d["error"] for d in summary.dead_letters)
    # system.budget once for the scope, however many calls it refused.
    assert summary.topics["system.budget"] == 1
    assert summary.topics["budget.heard"] == 1
    assert summary.topics["monitor.alert.budget_spent"] == 1  # the Monitor raises an alert
    assert summary.budget == {
        "run": {
            "scope": "run",
            "tokens": spent,
            "cost_usd": pytest.approx(calls * (3 * 1.0 + 2 * 2.0) / 1e6),
            "limit_tokens": n,
            "limit_cost_usd": None,
            "refused": TICKETS - calls,
            "stopped": True,
        }
    }
    report = assert_replays(summary)  # the same calls refused, with the server gone
    assert report.matched


def test_an_agent_budget_stops_only_that_agent_and_a_cost_budget_counts_dollars(
    team: Path, server: ModelServer
) -> None:
    path = budget_scenario(
        team,
        """\
        agents:
          asker: {tokens: 12}
          second: {cost_usd: 0.0000141}
        """,
        """\
        asker: {class: "budget_team_mod:Asker", concurrency: 3}
        second: {class: "budget_team_mod:Asker", concurrency: 2}
        free: {class: "budget_team_mod:Asker"}
        """,
    )
    summary = run_scenario(path, provider=server)
    by_agent = summary.usage["by_agent"]
    asker = by_agent["asker"]["input_tokens"] + by_agent["asker"]["output_tokens"]
    assert 12 <= asker < 12 + PER_CALL
    # 7 micro-dollars a call: the third crosses 14.1.
    assert by_agent["second"]["calls"] == 3
    assert by_agent["free"]["calls"] == TICKETS
    assert summary.budget["agent:asker"]["stopped"] is True
    assert summary.budget["agent:second"]["refused"] == TICKETS - 3
    assert set(summary.budget) == {"agent:asker", "agent:second"}
    assert summary.dlq["budget"] == (TICKETS - by_agent["asker"]["calls"]) + (TICKETS - 3)
    assert summary.topics["system.budget"] == 2
    assert_replays(summary)


def test_a_run_within_its_budget_says_so_and_refuses_nothing(
    team: Path, server: ModelServer
) -> None:
    path = budget_scenario(
        team, "run: {tokens: 10000, cost_usd: 1}", 'asker: {class: "budget_team_mod:Asker"}'
    )
    summary = run_scenario(path, provider=server)
    assert summary.usage["calls"] == TICKETS and "budget" not in summary.dlq
    assert summary.budget["run"]["stopped"] is False
    assert summary.budget["run"]["tokens"] == TICKETS * PER_CALL
    assert "system.budget" not in summary.topics


def test_a_budget_for_an_unknown_agent_is_one_located_error(team: Path) -> None:
    path = budget_scenario(
        team,
        """\
        agents:
          askr: {tokens: 12}
        """,
        'asker: {class: "budget_team_mod:Asker"}',
    )
    with pytest.raises(ScenarioError) as info:
        pantheon.load_scenario(path)
    text = str(info.value)
    assert "budget.agents.askr" in text and "unknown agent 'askr'" in text
    assert f"{path}:" in text


def test_an_empty_budget_limit_is_refused_at_its_line(team: Path) -> None:
    path = budget_scenario(team, "run: {}", 'asker: {class: "budget_team_mod:Asker"}')
    with pytest.raises(ScenarioError) as info:
        pantheon.load_scenario(path)
    assert "budget.run" in str(info.value)
    assert "a budget needs tokens, cost_usd or both" in str(info.value)


def test_pantheon_run_says_what_each_scope_spent_and_pantheon_replay_refuses_the_same(
    team: Path, server: ModelServer
) -> None:
    path = budget_scenario(team, "run: {tokens: 23}", 'asker: {class: "budget_team_mod:Asker"}')
    # The CLI reads the file as it is: point it at the stand-in server.
    path.write_text(
        path.read_text(encoding="utf-8").replace("http://127.0.0.1:1/v1", server.base_url),
        encoding="utf-8",
    )
    proc = pantheon_cli("run", path.name, "--store", "b.db", "--json", cwd=team)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    calls = summary["usage"]["calls"]
    assert summary["budget"]["run"] == {
        "scope": "run",
        "tokens": calls * PER_CALL,
        "cost_usd": pytest.approx(calls * 7 / 1e6),
        "limit_tokens": 23,
        "limit_cost_usd": None,
        "refused": TICKETS - calls,
        "stopped": True,
    }
    text = pantheon_cli("run", path.name, "--store", "b.db", cwd=team)
    assert (
        f"budget    run: {calls * PER_CALL} of 23 tokens, stopped {TICKETS - calls} calls"
        in text.stdout
    )
    proc = pantheon_cli("replay", summary["session_id"], "--store", "b.db", "--json", cwd=team)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    assert report["matched"] is True and report["effects_called"] == 0


def test_a_whatif_with_a_larger_budget_asks_the_refused_calls_live(
    team: Path, server: ModelServer
) -> None:
    path = budget_scenario(team, "run: {tokens: 23}", 'asker: {class: "budget_team_mod:Asker"}')
    summary = run_scenario(path, provider=server)
    calls = summary.usage["calls"]
    assert summary.dlq == {"budget": TICKETS - calls}
    asked = len(server.requests)
    report = whatif(summary, "budget:\n  run: {tokens: 1000}\n")
    # The calls the run made are served; the ones its budget refused are asked now.
    assert len(server.requests) - asked == TICKETS - calls
    assert report.effects_called >= TICKETS - calls
    same = whatif(summary, "budget:\n  run: {tokens: 23}\n")
    assert len(server.requests) - asked == TICKETS - calls  # the same budget: nothing asked
    assert same.effects_called == TICKETS  # every admission decided again, on the record
