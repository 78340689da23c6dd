"""The shipped access desk: the scenario passes from the CLI with its accuracy, replays
exactly with its stand-in model and its MCP server never started, and the what-if that edits
one sentence of the reviewer's instructions changes exactly the admin requests' decisions,
asking live only the model calls whose prompt changed (the reviewer's) and the registry
writes whose decision changed; every other call is served."""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from access.registry import SEED, Registry
from cli_run import pantheon as cli

import pantheon
from pantheon.sessions import SessionStore
from pantheon.testing import ModelServer, assert_outcomes_changed

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "access_requests.yaml"
CHANGE = ROOT / "scenarios" / "changes" / "admin_to_a_person.yaml"
REQUESTS = ROOT / "scenarios" / "data" / "access_requests.jsonl"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One recorded run of the scenario from the CLI, in a directory that is not the
    repository: its store and its summary."""
    work = tmp_path_factory.mktemp("access")
    proc = cli("run", str(SCENARIO), "--json", cwd=work)
    summary = json.loads(proc.stdout)
    assert proc.returncode == (0 if summary["passed"] else 1), proc.stderr
    return work / ".pantheon" / "sessions.db", summary


def _effects(store: Path, session: str) -> Counter[tuple[str | None, str]]:
    with SessionStore(store) as st:
        return Counter((e.subscriber, e.name) for e in st.effects(session))


def test_the_scenario_passes_with_its_accuracy(recorded: tuple[Path, dict[str, Any]]) -> None:
    store, summary = recorded
    assert summary["passed"], summary["expectations"]
    assert {e["name"] for e in summary["expectations"]} == {
        "zero lost",
        "dead letters other than shed <= 0",
        "accuracy >= 0.8",
    }
    # Deterministic: the scripted model follows the written policy with two blind spots
    # (tickets not written CHG-1234, justifications judged by length) and the policy denies
    # admin access the labels send to a person.
    assert summary["accuracy"] == {
        "scored": 200,
        "unlabelled": 0,
        "accuracy": 0.84,
        "decision_accuracy": 0.84,
    }
    assert (summary["inputs"], summary["dlq"]) == (200, {})
    by_agent = summary["usage"]["by_agent"]
    # Intake: look up, answer. Reviewer: policy and grants, record, answer.
    assert (by_agent["intake"]["calls"], by_agent["reviewer"]["calls"]) == (400, 600)
    effects = _effects(store, summary["session_id"])
    assert effects[("reviewer", "tools.list")] == 200
    assert effects[("reviewer", "tool.record_decision")] == 200
    assert effects[("intake", "tool.lookup_employee")] == 200


async def test_the_session_replays_with_the_stand_in_and_the_mcp_server_never_started(
    recorded: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, summary = recorded

    def refuse(*args: Any) -> Any:
        raise AssertionError("a replay started a server")

    monkeypatch.setattr(ModelServer, "start", refuse)
    monkeypatch.setattr(Registry, "start", refuse)
    report = await pantheon.replay(summary["session_id"], store=store)
    assert report.matched, report.divergence
    assert report.effects_called == 0
    assert report.effects_served == sum(_effects(store, summary["session_id"]).values())


async def test_the_what_if_changes_the_admin_requests_and_asks_only_the_edited_prompts_live(
    recorded: tuple[Path, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    store, summary = recorded
    servers: list[ModelServer] = []
    start = ModelServer.start

    def noted(server: ModelServer) -> ModelServer:
        servers.append(start(server))
        return server

    monkeypatch.setattr(ModelServer, "start", noted)
    registry_starts: list[Registry] = []
    registry_start = Registry.start

    async def noted_registry(registry: Registry) -> None:
        registry_starts.append(registry)
        await registry_start(registry)

    monkeypatch.setattr(Registry, "start", noted_registry)
    seed = hashlib.sha256(SEED.read_bytes()).hexdigest()
    report = await pantheon.replay(summary["session_id"], store=store, with_=CHANGE)

    admins = sorted(
        r["request_id"]
        for r in map(json.loads, REQUESTS.read_text(encoding="utf-8").splitlines())
        if r["expected"]["rule"] == "admin"
    )
    assert_outcomes_changed(report, {"deny→escalate": admins})
    assert len(admins) == 19
    assert report.passed
    assert report.summary.accuracy["decision_accuracy"] == pytest.approx(187 / 200)

    # Live: exactly the model calls whose prompt changed (the reviewer's, three for each of
    # the 200 requests that reached it), and the registry writes whose decision changed.
    # Served: the intake's every call, and every registry call asked as recorded.
    assert report.called_by_name == {"model.openai.chat": 600, "tool.record_decision": 19}
    assert report.served_by_name == {
        "model.openai.chat": 400,
        "tool.current_grants": 200,
        "tool.lookup_employee": 200,
        "tool.resource_policy": 200,
        "tools.list": 200,
        "tool.record_decision": 181,
    }
    [server] = servers  # the stand-in, started once for the live calls, asked only those
    tools = [{t["function"]["name"] for t in r.body.get("tools", ())} for r in server.requests]
    assert len(tools) == 600
    assert all("resource_policy" in t and "lookup_employee" not in t for t in tools)
    effects = _effects(store, report.new_session_id)
    assert effects[("reviewer", "model.openai.chat")] == 600
    assert effects[("intake", "model.openai.chat")] == 400
    # The registry was started for the 19 writes, seeded afresh; its seed file is untouched.
    assert len(registry_starts) == 1
    assert hashlib.sha256(SEED.read_bytes()).hexdigest() == seed
