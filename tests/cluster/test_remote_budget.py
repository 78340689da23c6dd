"""A run budget holds team-wide on ZeroMQ and NATS: two askers on two node processes, each making a
model call per ticket, are charged to the driver's one ``run`` ledger, so the run stops at
its N tokens (plus at most the call that crossed it), not at N per node.

Every process is real: ``pantheon run`` (the driver) in a subprocess starts the broker and
the nodes (the NATS server is started here on a free port); the model is the stand-in
server of ``pantheon.testing``."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from budget_session import PER_CALL, REPLY, TICKETS, budget_scenario, budget_team
from cli_run import pantheon
from transports import transport_section

from pantheon.sessions import SessionStore
from pantheon.testing import ModelServer, assert_replays

#: The run's budget: 23 tokens, four and a bit calls of 5.
TOKENS = 23
PLACEMENT = "  nodes:\n    one: [asker1]\n    two: [asker2]\n"


@pytest.fixture(params=["zmq", "nats"])
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """The scenario's ``transport:`` section: a ZeroMQ broker the run starts, or this
    test's own ``nats-server -js``."""
    with transport_section(request.param, PLACEMENT) as section:
        yield section


def test_a_run_budget_across_two_nodes_stops_the_team_at_n(tmp_path: Path, transport: str) -> None:
    with ModelServer(reply=REPLY) as server:
        path = budget_scenario(
            budget_team(tmp_path),
            f"run: {{tokens: {TOKENS}}}",
            'asker1: {class: "budget_team_mod:Asker"}\n'
            'asker2: {class: "budget_team_mod:Asker"}\n'
            'listener: {class: "budget_team_mod:Listener"}',
        )
        text = path.read_text(encoding="utf-8").replace("http://127.0.0.1:1/v1", server.base_url)
        path.write_text(text.replace("\ninput:", f"\n{transport}input:"), encoding="utf-8")
        proc = pantheon("run", path.name, "--json", "--store", "s.db", cwd=tmp_path)
        calls = len(server.requests)
    summary = json.loads(proc.stdout)
    assert summary["nodes"]["one"]["status"] == "ok", proc.stderr
    assert summary["nodes"]["two"]["status"] == "ok", proc.stderr

    # One ledger for the team: N plus at most the call that crossed it (each process
    # keeping its own would have let both nodes spend N: 50 tokens, 10 calls).
    run = summary["budget"]["run"]
    assert run["limit_tokens"] == TOKENS and run["stopped"]
    assert TOKENS <= run["tokens"] < TOKENS + PER_CALL
    assert calls * PER_CALL == run["tokens"]
    # Every other delivery of a ticket (one per asker) was refused: dead-lettered `budget`.
    assert summary["dlq"] == {"budget": 2 * TICKETS - calls}
    assert run["refused"] == 2 * TICKETS - calls
    # The refusals of both nodes made one system.budget, the driver's Listener heard it.
    assert summary["topics"]["system.budget"] == 1
    assert summary["topics"]["budget.heard"] == 1
    with SessionStore(tmp_path / "s.db") as store:
        [event] = [e for e in store.envelopes(summary["session_id"]) if e.topic == "system.budget"]
    assert event.payload["scope"] == "run" and event.payload["agent"] in ("asker1", "asker2")

    # The admissions were the nodes' recorded effects: the replay refuses the same calls.
    assert_replays(summary["session_id"], tmp_path / "s.db")
