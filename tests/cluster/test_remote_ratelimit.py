"""The provider's rate limit holds team-wide on ZeroMQ and NATS: two askers on two node
processes, each making a model call per ticket, take their turns at the driver's one
limiter, as the model server meters the team's key and not a process.

Every process is real: ``pantheon run`` (the driver) in a subprocess starts the broker and
the nodes (the NATS server is started here on a free port); the model is the stand-in
server of ``pantheon.testing``. How the limiter spaces calls is tests/agents/test_ratelimit.py
and, across nodes on a fake clock, tests/pantheon/test_remote_budget_link.py."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from budget_session import REPLY, budget_team
from cli_run import pantheon
from transports import transport_section

from pantheon.testing import ModelServer, assert_replays

PLACEMENT = "  nodes:\n    one: [asker1]\n    two: [asker2]\n"
TICKETS = 5


@pytest.fixture(params=["zmq", "nats"])
def transport(request: pytest.FixtureRequest) -> Iterator[str]:
    """The scenario's ``transport:`` section: a ZeroMQ broker the run starts, or this
    test's own ``nats-server -js``."""
    with transport_section(request.param, PLACEMENT) as section:
        yield section


def test_two_nodes_take_their_model_calls_turns_at_the_drivers_limiter(
    tmp_path: Path, transport: str
) -> None:
    folder = budget_team(tmp_path)
    (folder / "tickets.jsonl").write_text(
        "".join(
            json.dumps({"id": f"t{i}", "text": "please help me"}) + "\n" for i in range(TICKETS)
        ),
        encoding="utf-8",
    )
    with ModelServer(reply=REPLY) as server:
        (folder / "limited.yaml").write_text(
            "version: 1\n"
            "name: limited\n"
            f"provider:\n  kind: openai\n  base_url: {server.base_url}\n  model: stand-in\n"
            "  rate_limit: {requests_per_minute: 3, window: 0.5}\n"
            "input: {kind: jsonl, path: tickets.jsonl, topic: ticket.received}\n"
            f"{transport}"
            "agents:\n"
            '  asker1: {class: "budget_team_mod:Asker"}\n'
            '  asker2: {class: "budget_team_mod:Asker"}\n',
            encoding="utf-8",
        )
        proc = pantheon("run", "limited.yaml", "--json", "--store", "s.db", cwd=folder)
        calls = len(server.requests)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["nodes"]["one"]["agents"] == ["asker1"]
    assert summary["nodes"]["two"]["agents"] == ["asker2"]
    assert summary["nodes"]["driver"]["agents"] == ["observer"]
    # Every call of both nodes took its turn at the driver's one limiter, which hosts no
    # asker: with a limiter per process it would have admitted none (and the nodes 3 per
    # window each, 6 for the team).
    assert calls == 2 * TICKETS
    rate = summary["rate_limit"]
    assert {k: v for k, v in rate.items() if k != "waited"} == {
        "requests_per_minute": 3,
        "tokens_per_minute": None,
        "window_s": 0.5,
        "admitted": 2 * TICKETS,
    }
    assert 0 <= rate["waited"] <= 2 * TICKETS - 3
    assert summary["usage"]["calls"] == 2 * TICKETS
    # The turns were taken inside the nodes' recorded model calls: a replay asks nobody.
    assert_replays(summary["session_id"], folder / "s.db")
