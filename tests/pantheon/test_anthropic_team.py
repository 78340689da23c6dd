"""A team whose scenario says ``provider: {kind: anthropic}`` runs against the stand-in server
speaking the Messages protocol (parallel tool calls, streamed; a structured answer), and its
session replays exactly with the server gone: every model and tool call served from the
record."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

import pantheon
from pantheon.scenario import AnthropicProviderConfig, ScenarioError
from pantheon.testing import ModelServer, Reply, assert_passed, assert_replays, run_scenario

# Module names are unique per test file: a process imports a module once.
MODULE = '''
import json

from agents import Agent
from bus import Envelope

LOOKUP = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "The refundable amount of an order.",
        "parameters": {
            "type": "object",
            "properties": {"order": {"type": "string"}},
            "required": ["order"],
        },
    },
}
DECISION = {
    "type": "json_schema",
    "json_schema": {
        "name": "decision",
        "schema": {
            "type": "object",
            "properties": {
                "action": {"enum": ["approve", "escalate"]},
                "total": {"type": "number"},
            },
            "required": ["action", "total"],
        },
    },
}
AMOUNTS = {"A-1": 30.0, "A-2": 250.0}


def lookup(order):
    return AMOUNTS[order]


class Refunds(Agent):
    """Looks every order of a ticket up with the model's tool calls, then asks for the
    decision."""

    subscriptions = ("ticket.received",)

    async def handle(self, env: Envelope) -> None:
        messages = [
            {"role": "system", "content": "Decide the refund."},
            {"role": "user", "content": env.payload["text"]},
        ]
        turn = await self.chat(messages, tools=[LOOKUP], stream=True)
        while turn.tool_calls:
            messages.append(
                {
                    "role": "assistant",
                    "content": turn.content,
                    "tool_calls": [
                        {"id": c.id, "type": "function",
                         "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                        for c in turn.tool_calls
                    ],
                }
            )
            for call in turn.tool_calls:
                amount = await self.effect("tool.lookup_order", lookup, call.arguments["order"])
                messages.append(
                    {"role": "tool", "tool_call_id": call.id, "content": json.dumps(amount)}
                )
            turn = await self.chat(messages, tools=[LOOKUP], response_format=DECISION)
        await self.emit("ticket.decided", {"id": env.payload["id"], **turn.data})
'''

TICKETS = [
    {"id": "T-1", "text": "Refund orders A-1 and A-2 please"},
    {"id": "T-2", "text": "Refund order A-1"},
]

SCENARIO = """\
version: 1
name: anthropic_refunds
provider:
  kind: anthropic
  base_url: http://127.0.0.1:9        # replaced by the stand-in's address
  model: claude-test
  api_key_env: ""
  max_tokens: 256
  max_retries: 0
prices:
  claude-test: {input: 3.0, output: 15.0}
input:
  kind: jsonl
  path: tickets.jsonl
  topic: ticket.received
agents:
  refunds:
    class: "anthropic_team_mod:Refunds"
expect:
  zero_lost: true
  dlq: {failed: {max: 0}}
  topics:
    ticket.decided: {min: 2}
"""


def script(request: dict[str, Any]) -> Any:
    """The model, as the stand-in's script: one tool call per order named, all in one turn;
    once the results are in, the decision over their total."""
    messages = request["messages"]
    if messages[-1]["role"] == "tool":
        total = sum(json.loads(m["content"]) for m in messages if m["role"] == "tool")
        return {"action": "approve" if total <= 100 else "escalate", "total": total}
    orders = re.findall(r"A-\d", messages[-1]["content"])
    return Reply(
        tool_calls=[
            {"id": f"toolu_{o}", "name": "lookup_order", "arguments": {"order": o}} for o in orders
        ]
    )


@pytest.fixture
def team(tmp_path: Path) -> Path:
    (tmp_path / "anthropic_team_mod.py").write_text(MODULE, encoding="utf-8")
    (tmp_path / "tickets.jsonl").write_text(
        "".join(json.dumps(t) + "\n" for t in TICKETS), encoding="utf-8"
    )
    path = tmp_path / "refunds.yaml"
    path.write_text(SCENARIO, encoding="utf-8")
    return path


def test_an_anthropic_team_runs_on_the_stand_in_and_replays_with_it_stopped(team: Path) -> None:
    with ModelServer(script) as server:
        summary = run_scenario(team, provider=server)
        requests = server.requests
    assert_passed(summary)
    decided = {d["id"]: d for d in _decided(summary)}
    assert decided == {
        "T-1": {"id": "T-1", "action": "escalate", "total": 280.0},
        "T-2": {"id": "T-2", "action": "approve", "total": 30.0},
    }
    # Every call spoke the Messages protocol: two turns per ticket, the first streamed.
    assert [r.path for r in requests] == ["/v1/messages"] * 4
    assert sorted(r.body.get("stream", False) for r in requests) == [False, False, True, True]
    # T-1's second turn carries both results of its parallel calls in one user turn.
    [second] = [r.body for r in requests if len(r.body["messages"]) == 3 and "A-2" in str(r.body)]
    assert [b["tool_use_id"] for b in second["messages"][2]["content"]] == [
        "toolu_A-1",
        "toolu_A-2",
    ]
    assert second["output_config"]["format"]["schema"]["required"] == ["action", "total"]
    usage = summary.usage
    assert usage["calls"] == 4 and usage["input_tokens"] > 0 and usage["output_tokens"] > 0
    assert usage["cost_usd"] == pytest.approx(
        (usage["input_tokens"] * 3.0 + usage["output_tokens"] * 15.0) / 1e6
    )

    # The server is gone: the replay serves every model and tool call from the record.
    report = assert_replays(summary)
    assert report.matched and report.effects_called == 0


def test_the_provider_section_is_checked_where_it_is_written(team: Path) -> None:
    cfg = pantheon.load_scenario(team).provider
    assert isinstance(cfg, AnthropicProviderConfig)
    assert (cfg.model, cfg.max_tokens, cfg.api_key_env, cfg.params) == ("claude-test", 256, "", {})
    team.write_text(SCENARIO.replace("max_tokens: 256", "max_tokens: 0"), encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        pantheon.load_scenario(team)
    assert "provider.max_tokens" in str(info.value) and ":8:" in str(info.value)


def _decided(summary: Any) -> list[dict[str, Any]]:
    from pantheon.sessions import SessionStore
    from pantheon.testing import scratch_store

    with SessionStore(scratch_store()) as store:
        return [
            e.payload for e in store.envelopes(summary.session_id) if e.topic == "ticket.decided"
        ]
