"""The dashboard's live view through the gateway: ``/v1/live`` carries the run's live feed
over a WebSocket, so the terminal monitor works from another machine (item 3 of #17)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from gateway_server import ADMIN, PUBLISHER, ROOT, TOKENS_ENV, Server, start_server, write_scenario

from pantheon.live import FeedNotFound, connect_url

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:websockets")
pytest.importorskip("textual")

from pilot_wait import until  # noqa: E402 - textual, which it imports, may be missing

from dashboard.tui import LiveSource, MonitorApp  # noqa: E402

EXAMPLE = ROOT / "scenarios" / "support_gateway.yaml"


async def test_the_monitor_watches_a_run_through_the_gateway(tmp_path: Path) -> None:
    server: Server = start_server(EXAMPLE, tmp_path)
    try:
        client = await connect_url(f"{server.url}/v1/live")
        app = MonitorApp(LiveSource(client))
        async with app.run_test(size=(120, 40)) as pilot:
            await until(pilot, lambda: app.snapshot is not None, "a live snapshot")
            assert app.sub_title.startswith("live feed")
            first = app.snapshot
            assert first is not None and first.live and first.status == "running"
            async with httpx.AsyncClient(base_url=server.url) as http:
                r = await http.post(
                    "/v1/inbox",
                    json={
                        "id": "remote-1",
                        "from": "bo@example.com",
                        "to": "support@acme.example",
                        "subject": "Refund",
                        "body": "Please refund order ORD-123456, 40 EUR.",
                    },
                )
            assert r.status_code == 202
            # the email and what the team made of it show up in the remote view's counters
            await until(
                pilot,
                lambda: app.snapshot is not None and app.snapshot.totals.published >= 6,
                "the team's messages in a snapshot",
            )
            assert app.snapshot is not None and app.snapshot.session_id == client.session_id
            # Ctrl-C on the server: the remote view gets the session's final snapshot
            assert await asyncio.to_thread(server.stop) == 0
            await until(
                pilot,
                lambda: app.snapshot is not None and not app.snapshot.live,
                "the final snapshot",
            )
            assert app.snapshot is not None and app.snapshot.status == "completed"
        await client.aclose()
    finally:
        server.stop()


async def test_the_live_feed_needs_a_token_that_may_watch_everything(tmp_path: Path) -> None:
    scenario = write_scenario(tmp_path)
    server = start_server(scenario, tmp_path, env={"GW_TEST_TOKENS": TOKENS_ENV})
    try:
        with pytest.raises(FeedNotFound, match="the gateway answered 401"):
            await connect_url(f"{server.url}/v1/live")
        with pytest.raises(FeedNotFound, match="the gateway answered 403"):
            await connect_url(f"{server.url}/v1/live", token=PUBLISHER)  # data.* only
        client = await connect_url(f"{server.url}/v1/live", token=ADMIN)
        snap = await client.next(timeout=10)
        assert snap.session_id == client.session_id and snap.live
        await client.aclose()
    finally:
        assert server.stop() == 0
