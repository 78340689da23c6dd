"""A model agent with two Python tools and one stdio MCP server (the SDK-written notes
server of ``pantheon.testing.mcp_notes``), against the scripted stand-in model server: it
completes multi-turn tool use, and its session replays matched with the model server and
the MCP server both stopped (every model call, tool listing and tool call served)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pantheon
from pantheon.scenario import Scenario, parse_scenario
from pantheon.sessions import SessionStore
from pantheon.testing import ModelServer, Reply

MODULE = '''
"""A refund desk's tools: two functions here, notes on an MCP server."""
import sys
from typing import Literal

from pydantic import BaseModel

from agents import MCPServer

ORDERS = {"A-1": {"status": "delivered", "paid": 40.0}, "A-2": {"status": "lost", "paid": 95.5}}


class Verdict(BaseModel):
    action: Literal["refund", "none"]
    amount: float
    note: int


def order_status(order_id: str) -> dict:
    """The shipping status of an order and what was paid for it."""
    return {"order_id": order_id, **ORDERS[order_id]}


def customer_tier(customer: str) -> str:
    """The customer's loyalty tier."""
    return {"Cy": "gold"}.get(customer, "silver")


NOTES = MCPServer(
    command=[sys.executable, "-m", "pantheon.testing.mcp_notes", "--db", NOTES_DB],
    allow=["add_note"],
    timeout=20.0,
    start_timeout=60.0,
)
'''

SCENARIO = """\
version: 1
name: refund-desk-mcp
input:
  kind: jsonl
  path: asks.jsonl
  topic: refund.asked
agents:
  refunds:
    class: "agents:ModelAgent"
    subscribe: [refund.asked]
    settings:
      instructions: "You handle refunds for {customer}. Use the tools; note what you did."
      tools: ["ma_mcp_mod:order_status", "ma_mcp_mod:customer_tier", "ma_mcp_mod:NOTES"]
      output: "ma_mcp_mod:Verdict"
      output_topic: refund.decided
      carry: [ticket]
expect:
  zero_lost: true
  max_dlq: 0
"""


def _value(content: str) -> Any:
    try:
        return json.loads(content)
    except ValueError:
        return content


def conversation(request: dict[str, Any]) -> Reply:
    """Look the order and the customer up (two calls in one answer), note it on the MCP
    server, then answer with the note's id."""
    messages = request["messages"]
    results = [_value(m["content"]) for m in messages if m["role"] == "tool"]
    ask = json.loads(next(m["content"] for m in messages if m["role"] == "user"))
    if not results:
        return Reply(
            tool_calls=[
                {"name": "order_status", "arguments": {"order_id": ask["order"]}},
                {"name": "customer_tier", "arguments": {"customer": ask["customer"]}},
            ]
        )
    order = results[0]
    amount = order["paid"] if order["status"] == "lost" else 0.0
    if len(results) == 2:
        text = f"{ask['order']} {order['status']}: refund {amount}"
        return Reply(
            tool_calls=[{"name": "add_note", "arguments": {"title": ask["ticket"], "text": text}}]
        )
    note = results[2]["id"]
    action = "refund" if amount else "none"
    return Reply(json.dumps({"action": action, "amount": amount, "note": note}))


def _desk(tmp_path: Path, module: str = "ma_mcp_mod") -> Path:
    """The desk's files in ``tmp_path``: its module (whose notes server keeps its SQLite file
    there; named otherwise by each test, as a process keeps the module it imported first),
    its asks and its scenario; the notes file's path."""
    notes_db = tmp_path / "notes.db"
    (tmp_path / f"{module}.py").write_text(
        MODULE.replace("NOTES_DB", repr(str(notes_db))), encoding="utf-8"
    )
    asks = [
        {"ticket": "T-1", "customer": "Ada", "order": "A-1"},
        {"ticket": "T-2", "customer": "Bo", "order": "A-2"},
    ]
    (tmp_path / "asks.jsonl").write_text("".join(json.dumps(a) + "\n" for a in asks))
    (tmp_path / "desk.yaml").write_text(SCENARIO.replace("ma_mcp_mod", module), encoding="utf-8")
    return notes_db


def _scenario(tmp_path: Path, server: ModelServer) -> Scenario:
    text = (tmp_path / "desk.yaml").read_text(encoding="utf-8")
    text += f"provider: {{kind: openai, base_url: '{server.base_url}', model: stand-in}}\n"
    return parse_scenario(text, str(tmp_path / "desk.yaml"), tmp_path)


async def test_python_tools_and_an_mcp_server_replay_with_both_servers_stopped(
    tmp_path: Path,
) -> None:
    notes_db = _desk(tmp_path)
    store = tmp_path / "sessions.db"
    with ModelServer(conversation) as server:
        summary = await pantheon.run(_scenario(tmp_path, server), store=store)
        assert len(server.requests) == 6  # three turns for each of the two asks
    assert summary.passed, summary.expectations

    # The MCP server really took the notes, in its own SQLite file.
    with sqlite3.connect(notes_db) as conn:
        notes = sorted(conn.execute("SELECT title, text FROM notes").fetchall())
    assert notes == [("T-1", "A-1 delivered: refund 0.0"), ("T-2", "A-2 lost: refund 95.5")]
    with SessionStore(store) as st:
        decided = sorted(
            (e.payload for e in st.envelopes(summary.session_id) if e.topic == "refund.decided"),
            key=lambda p: p["ticket"],
        )
        names = sorted({e.name for e in st.effects(summary.session_id)})
    assert [(d["ticket"], d["action"], d["amount"]) for d in decided] == [
        ("T-1", "none", 0.0),
        ("T-2", "refund", 95.5),
    ]
    assert {d["note"] for d in decided} == {1, 2}
    assert names == [
        "model.openai.chat", "tool.add_note", "tool.customer_tier", "tool.order_status",
        "tools.list",
    ]  # fmt: skip

    # Both servers are gone (the run closed the MCP server with its agent; the model
    # server's context has ended): a replay that called either would fail or diverge.
    report = await pantheon.replay(summary.session_id, store=store)
    assert report.matched, report.divergence
    assert report.effects_called == 0 and report.effects_served == 14
    with sqlite3.connect(notes_db) as conn:
        assert conn.execute("SELECT count(*) FROM notes").fetchone() == (2,)


async def test_the_team_runs_twice_in_one_process_on_its_module_level_server(
    tmp_path: Path,
) -> None:
    """The module's one ``MCPServer`` is started by the first run and closed with its agent;
    the second run (a test helper's, or a what-if after the run) starts it again."""
    notes_db = _desk(tmp_path, "ma_mcp_twice")
    with ModelServer(conversation) as server:
        first = await pantheon.run(_scenario(tmp_path, server), record=False)
        second = await pantheon.run(_scenario(tmp_path, server), record=False)
        assert len(server.requests) == 12
    for summary in (first, second):
        assert summary.passed, (summary.expectations, summary.dead_letters)
        assert summary.dlq == {}
    with sqlite3.connect(notes_db) as conn:  # both runs' notes, the second's numbered on
        notes = conn.execute("SELECT title FROM notes ORDER BY title").fetchall()
    assert notes == [("T-1",), ("T-1",), ("T-2",), ("T-2",)]
