"""A session fed through the gateway replays exactly: every message that came in over
HTTP went through the bus, so the recorder has it as outside input."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import httpx
import pytest
import websockets
from gateway_server import PANTHEON, ROOT, Server, start_server

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:websockets")

EXAMPLE = ROOT / "scenarios" / "support_gateway.yaml"


def email(n: int, subject: str, body: str) -> dict[str, object]:
    return {
        "id": f"gw-{n}",
        "from": f"customer{n}@example.com",
        "to": "support@acme.example",
        "subject": subject,
        "body": body,
    }


EMAILS = [
    email(1, "Refund", "Please refund order ORD-123456, I was charged twice. 80 EUR."),
    email(2, "Site down", "Your site is down for all of us, 503 everywhere. Urgent!"),
    email(3, "Question", "How do I download the invoice for ORD-654321?"),
    email(4, "Bug", "The export button does not work since the last update."),
    email(5, "Big refund", "Refund ORD-777777 please, 950 EUR, the item arrived damaged."),
]


async def feed(server: Server) -> None:
    """Emails in by every route, decisions out over the WebSocket."""
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=30) as http,
        websockets.connect(f"{server.ws}/v1/subscribe?pattern=guardian.decision") as ws,
    ):
        for e in EMAILS[:3]:  # the webhook inbox: the Observer publishes them
            r = await http.post("/v1/inbox", json=e)
            assert r.status_code == 202 and r.json()["malformed"] is False
        r = await http.post("/v1/inbox", json={"id": "junk", "note": "no email"})
        assert r.json() == {
            "published": True,
            "topic": "observation.email.malformed",
            "malformed": True,
        }
        r = await http.post("/v1/topics/observation.email.received", json=EMAILS[3])
        assert r.status_code == 202
        r = await http.post(
            "/v1/batch",
            json={"topic": "observation.email.received", "payloads": [EMAILS[4]]},
        )
        assert r.status_code == 202
        decisions = []
        async with asyncio.timeout(30):
            while len(decisions) < 5:
                decisions += json.loads(await ws.recv())["messages"]
    got = sorted(d["payload"]["email_id"] for d in decisions)
    assert got == [f"gw-{n}" for n in range(1, 6)]
    outage = next(d for d in decisions if d["payload"]["email_id"] == "gw-2")
    assert outage["payload"]["action"] == "escalate"


def test_a_gateway_fed_session_replays_exactly(tmp_path: Path) -> None:
    server = start_server(EXAMPLE, tmp_path, "--json")
    try:
        asyncio.run(feed(server))
    finally:
        assert server.stop() == 0
    summary = json.loads(server.stdout.read_text())
    assert summary["passed"] is True
    # The summary counts what the Observer published (the inbox); /v1/topics and /v1/batch
    # publish directly, and the replay below re-publishes those too (counted apart).
    assert (summary["inputs"], summary["malformed"]) == (3, 1)
    session = summary["session_id"]

    replay = subprocess.run(
        [*PANTHEON, "replay", session, "--store", str(server.store), "--json"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=120,
    )
    assert replay.returncode == 0, replay.stdout + replay.stderr
    report = json.loads(replay.stdout)
    assert report["matched"] is True
    # The inputs as the run counted them: three emails and the malformed record; the two
    # emails clients published directly were fed again beside them.
    assert report["inputs_replayed"] == 4
    assert report["others_replayed"].get("observation.email.received") == 2
    assert report["divergence"] is None
