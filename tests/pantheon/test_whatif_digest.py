"""A what-if decides each recorded effect by its request digest: on a two-ModelAgent team
(a triager with a side-effecting lookup tool, and a writer) against the real stand-in
model server, an instructions edit runs live only the edited agent's model calls, a
setting that changes no request runs nothing live, an older (schema 3) store migrates and
keeps the older rule, and a ZeroMQ session's nodes ship the digests too."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import msgspec
import pytest
from cli_run import pantheon as cli

import pantheon
from pantheon.scenario import parse_scenario
from pantheon.sessions import SessionStore
from pantheon.testing import ModelServer, Reply

MODULE = '''
"""The triager's tool (test module): every call leaves a line in $WD_DIGEST_LOG."""
import os

ORDERS = {"A-1": 40.0, "A-2": 95.5, "A-3": 12.0}


def lookup(order_id: str) -> dict:
    """What was paid for an order. Writes to the log: a side effect a what-if must not redo."""
    with open(os.environ["WD_DIGEST_LOG"], "a") as log:
        log.write(order_id + "\\n")
    return {"order_id": order_id, "paid": ORDERS[order_id]}
'''

SCENARIO = """\
version: 1
name: digest-desk
input:
  kind: jsonl
  path: asks.jsonl
  topic: ticket.in
agents:
  triage:
    class: "agents:ModelAgent"
    subscribe: [ticket.in]
    settings:
      instructions: "Triage ticket {ticket}. Look the order up."
      tools: ["wd_digest_mod:lookup"]
      output: {type: object, properties: {priority: {type: string}}, required: [priority]}
      output_topic: ticket.triaged
      carry: [ticket]
  writer:
    class: "agents:ModelAgent"
    subscribe: [ticket.triaged]
    settings:
      instructions: "Write the reply to a {priority} ticket."
      output_topic: ticket.answered
      carry: [ticket]
expect:
  zero_lost: true
  max_dlq: 0
"""

ASKS = [{"ticket": f"T-{n}", "order": f"A-{n}"} for n in (1, 2, 3)]

#: Recorded per ask: the triager's two model calls around one lookup, the writer's one call.
RECORDED = {"model.openai.chat": 9, "tool.lookup": 3}

EDIT = (
    'agents:\n  triage:\n    settings:\n      instructions: "Triage ticket {ticket} with care."\n'
)
MORE_TURNS = "agents:\n  triage:\n    settings: {max_turns: 5}\n"


def reply(request: dict[str, Any]) -> Reply:
    """The scripted model: the triager looks the order up, then ranks it by what was paid;
    the writer answers in one line. The same conversation gets the same answer."""
    messages = request["messages"]
    user = json.loads(next(m["content"] for m in messages if m["role"] == "user"))
    if messages[0]["content"].startswith("Triage"):
        results = [json.loads(m["content"]) for m in messages if m["role"] == "tool"]
        if not results:
            call = {"name": "lookup", "arguments": {"order_id": user["order"]}, "id": "call-1"}
            return Reply(tool_calls=[call])
        return Reply(json.dumps({"priority": "high" if results[0]["paid"] > 30 else "low"}))
    return Reply(f"Your {user['priority']} ticket {user['ticket']} is handled.")


@pytest.fixture
def server() -> Any:
    with ModelServer(reply) as s:
        yield s


@pytest.fixture
def desk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # The log's path by the environment: the module is imported once per process, and a
    # ZeroMQ run's node processes inherit it.
    monkeypatch.setenv("WD_DIGEST_LOG", str(tmp_path / "lookups.log"))
    (tmp_path / "wd_digest_mod.py").write_text(MODULE, encoding="utf-8")
    (tmp_path / "asks.jsonl").write_text("".join(json.dumps(a) + "\n" for a in ASKS))
    return tmp_path


def provider(server: ModelServer) -> str:
    return f"provider: {{kind: openai, base_url: '{server.base_url}', model: stand-in}}\n"


def lookups(desk: Path) -> int:
    log = desk / "lookups.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def record(desk: Path, server: ModelServer) -> tuple[Path, str]:
    store = desk / "sessions.db"
    scenario = parse_scenario(SCENARIO + provider(server), str(desk / "desk.yaml"), desk)
    summary = asyncio.run(pantheon.run(scenario, store=store))
    assert summary.passed, summary.expectations
    assert (len(server.requests), lookups(desk)) == (9, 3)
    return store, summary.session_id


def answers(store: Path, session: str) -> list[Any]:
    with SessionStore(store) as st:
        return sorted(
            (e.payload for e in st.envelopes(session) if e.topic == "ticket.answered"),
            key=lambda p: p["ticket"],
        )


def test_an_instructions_edit_calls_live_only_that_agents_model_calls(
    desk: Path, server: ModelServer
) -> None:
    store, session = record(desk, server)
    with SessionStore(store) as st:
        recorded = st.effects(session)
    assert all(e.digest is not None and len(e.digest) == 16 for e in recorded)

    report = asyncio.run(pantheon.replay(session, store=store, with_=EDIT))
    # The triager's six model calls ask with the new instructions; its lookups are asked
    # with the recorded arguments, and the writer gets the same triage: both served.
    assert report.called_by_name == {"model.openai.chat": 6}
    assert report.served_by_name == {"model.openai.chat": 3, "tool.lookup": 3}
    assert (report.effects_called, report.effects_served) == (6, 6)
    assert lookups(desk) == 3  # no lookup made a second time
    asked = [r.body["messages"][0]["content"] for r in server.requests[9:]]
    assert sorted(asked) == [f"Triage ticket T-{n} with care." for n in (1, 1, 2, 2, 3, 3)]
    assert answers(store, report.new_session_id) == answers(store, session)
    assert report.to_dict()["called_by_name"] == {"model.openai.chat": 6}


def test_a_setting_that_changes_no_request_calls_nothing_live(
    desk: Path, server: ModelServer
) -> None:
    store, session = record(desk, server)
    report = asyncio.run(pantheon.replay(session, store=store, with_=MORE_TURNS))
    assert (report.effects_called, report.called_by_name) == (0, {})
    assert report.served_by_name == RECORDED
    assert (len(server.requests), lookups(desk)) == (9, 3)


def _as_schema_3(store: Path, session: str) -> None:
    """Make ``store`` what Pantheon wrote before digests: schema 3, no ``digest`` column,
    and the session's effects back in one journal chunk of 11-field tuples (a run killed
    before the store was opened by a newer Pantheon)."""
    with sqlite3.connect(store) as conn:
        rows = conn.execute(
            "SELECT seq, envelope_id, subscriber, ordinal, name, flag, result, error_type, "
            "error, time, started_ns, ended_ns FROM effects WHERE session = ? ORDER BY seq",
            (session,),
        ).fetchall()
        chunk = [(r[1] + 2**64 if r[1] < 0 else r[1], *r[2:]) for r in rows]
        conn.execute("DELETE FROM effects WHERE session = ?", (session,))
        conn.execute("ALTER TABLE effects DROP COLUMN digest")
        (jseq,) = conn.execute("SELECT coalesce(max(seq) + 1, 0) FROM journal").fetchone()
        conn.execute(
            "INSERT INTO journal VALUES (?, ?, 'effects', ?, ?, 0.0, ?, NULL)",
            (session, jseq, rows[0][0], len(rows), msgspec.msgpack.encode(chunk)),
        )
        conn.execute("UPDATE meta SET value = '3' WHERE key = 'schema_version'")


def test_a_schema_3_store_migrates_and_its_whatif_keeps_the_older_rule(
    desk: Path, server: ModelServer
) -> None:
    store, session = record(desk, server)
    _as_schema_3(store, session)
    with SessionStore(store) as st:
        effects = st.effects(session)
    with sqlite3.connect(store) as conn:
        assert conn.execute("SELECT value FROM meta").fetchone() == ("4",)
        assert "digest" in {r[1] for r in conn.execute("PRAGMA table_info(effects)")}
    assert len(effects) == 12 and all(e.digest is None for e in effects)

    report = asyncio.run(pantheon.replay(session, store=store, with_=MORE_TURNS))
    # No digests: the triager's configuration changed, so every call of it runs live, its
    # lookups included; the writer's, unchanged and asked the same messages, are served.
    assert report.called_by_name == {"model.openai.chat": 6, "tool.lookup": 3}
    assert report.served_by_name == {"model.openai.chat": 3}
    assert lookups(desk) == 6
    assert answers(store, report.new_session_id) == answers(store, session)


ZMQ = """\
transport:
  kind: zmq
  broker: tcp://127.0.0.1:0
  nodes:
    work: [triage]
"""


def test_a_zeromq_sessions_nodes_ship_the_digests_its_whatif_serves_by(
    desk: Path, server: ModelServer
) -> None:
    (desk / "desk.yaml").write_text(SCENARIO + provider(server) + ZMQ, encoding="utf-8")
    proc = cli("run", "desk.yaml", "--json", "--store", "s.db", cwd=desk)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    session = json.loads(proc.stdout)["session_id"]
    assert (len(server.requests), lookups(desk)) == (9, 3)
    with SessionStore(desk / "s.db") as st:
        effects = st.effects(session)
    by_node = {(e.name, e.node, e.digest is not None) for e in effects}
    # The triager's calls were made, and recorded, on the node; the writer's on the driver.
    assert by_node == {
        ("model.openai.chat", "work", True),
        ("tool.lookup", "work", True),
        ("model.openai.chat", None, True),
    }

    (desk / "turns.yaml").write_text(MORE_TURNS, encoding="utf-8")
    proc = cli("replay", session, "--with", "turns.yaml", "--store", "s.db", "--json", cwd=desk)
    report = json.loads(proc.stdout)
    assert (report["effects_called"], report["called_by_name"]) == (0, {}), proc.stderr
    assert report["served_by_name"] == RECORDED
    assert (len(server.requests), lookups(desk)) == (9, 3)

    proc = cli("replay", session, "--with", "turns.yaml", "--store", "s.db", cwd=desk)
    assert "served 12: model.openai.chat 9, tool.lookup 3; called live 0" in proc.stdout
    proc = cli("replay", session, "--store", "s.db", cwd=desk)
    assert "served 12: model.openai.chat 9, tool.lookup 3; called 0" in proc.stdout


MCP_MODULE = '''
"""A desk whose only tool is the SDK-written notes server (test module)."""
import sys

from agents import MCPServer

NOTES = MCPServer(
    command=[sys.executable, "-m", "pantheon.testing.mcp_notes", "--db", NOTES_DB],
    allow=["add_note"],
    timeout=20.0,
    start_timeout=60.0,
)
'''

MCP_SCENARIO = """\
version: 1
name: digest-notes
input:
  kind: jsonl
  path: asks.jsonl
  topic: ticket.in
agents:
  noter:
    class: "agents:ModelAgent"
    subscribe: [ticket.in]
    settings:
      instructions: "Note ticket {ticket}."
      tools: ["wd_digest_mcp_mod:NOTES"]
expect:
  zero_lost: true
  max_dlq: 0
"""


def noting(request: dict[str, Any]) -> Reply:
    """Note the ticket on the MCP server, then say so."""
    messages = request["messages"]
    user = json.loads(next(m["content"] for m in messages if m["role"] == "user"))
    if not any(m["role"] == "tool" for m in messages):
        args = {"title": user["ticket"], "text": f"order {user['order']}"}
        return Reply(tool_calls=[{"name": "add_note", "arguments": args, "id": "n1"}])
    return Reply(f"noted {user['ticket']}")


def test_an_instructions_edit_serves_an_mcp_servers_tool_calls_and_listing(
    desk: Path,
) -> None:
    notes_db = desk / "notes.db"
    (desk / "wd_digest_mcp_mod.py").write_text(
        MCP_MODULE.replace("NOTES_DB", repr(str(notes_db))), encoding="utf-8"
    )
    store = desk / "sessions.db"
    with ModelServer(noting) as server:
        text = MCP_SCENARIO + provider(server)
        summary = asyncio.run(pantheon.run(parse_scenario(text, str(desk / "n.yaml"), desk),
                                           store=store))  # fmt: skip
        assert summary.passed, summary.expectations
        edit = 'agents:\n  noter:\n    settings:\n      instructions: "Note it: {ticket}."\n'
        report = asyncio.run(pantheon.replay(summary.session_id, store=store, with_=edit))
    # The server's identity (its command), the tool's name and arguments are the request:
    # the listing and the notes are served, and the server is never started again.
    assert report.called_by_name == {"model.openai.chat": 6}
    assert report.served_by_name == {"tool.add_note": 3, "tools.list": 3}
    with sqlite3.connect(notes_db) as conn:
        assert conn.execute("SELECT count(*) FROM notes").fetchone() == (3,)
