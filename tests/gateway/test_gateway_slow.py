"""A subscriber that reads too slowly: counted drops, then a close; never unbounded memory."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from gateway_server import ADMIN, READER, TOKENS_ENV, Server, start_server, write_scenario

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:websockets")

SEND_QUEUE = 1000
MAX_DROPS = 60_000
PAYLOAD = {"text": "x" * 160, "n": 0}


@pytest.fixture
def slow_server(tmp_path: Path) -> Iterator[Server]:
    scenario = write_scenario(
        tmp_path, send_queue=SEND_QUEUE, max_drops=MAX_DROPS, max_body=1024 * 1024
    )
    srv = start_server(scenario, tmp_path, "--no-record", env={"GW_TEST_TOKENS": TOKENS_ENV})
    try:
        yield srv
    finally:
        assert srv.stop() == 0


async def publish(http: httpx.AsyncClient, count: int, start: int = 0) -> None:
    for first in range(start, start + count, 500):
        payloads = [dict(PAYLOAD, n=i) for i in range(first, first + 500)]
        r = await http.post("/v1/batch", json={"topic": "flood.x", "payloads": payloads})
        assert r.status_code == 202, r.text


async def read_all(ws: websockets.ClientConnection, quiet: float = 2.0) -> tuple[int, int]:
    """(messages, dropped) until nothing arrives for ``quiet`` seconds."""
    messages = dropped = 0
    while True:
        try:
            frame = json.loads(await asyncio.wait_for(ws.recv(), quiet))
        except TimeoutError:
            return messages, dropped
        messages += len(frame["messages"])
        dropped += frame["dropped"]


async def test_a_slow_reader_is_told_what_it_missed_and_nothing_else_is_lost(
    slow_server: Server,
) -> None:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with (
        httpx.AsyncClient(base_url=slow_server.url, headers=headers, timeout=30) as http,
        websockets.connect(
            f"{slow_server.ws}/v1/subscribe?pattern=flood.*",
            additional_headers={"Authorization": f"Bearer {READER}"},
            max_queue=1,
        ) as ws,
    ):
        await publish(http, 50_000)  # the client reads nothing meanwhile
        messages, dropped = await read_all(ws)
    assert dropped > 0  # it fell behind, and the frames said by how much
    assert messages + dropped == 50_000  # every message: received, or counted as dropped


async def test_memory_stays_bounded_and_the_slow_client_is_closed(slow_server: Server) -> None:
    headers = {"Authorization": f"Bearer {ADMIN}"}
    async with (
        httpx.AsyncClient(base_url=slow_server.url, headers=headers, timeout=30) as http,
        websockets.connect(
            f"{slow_server.ws}/v1/subscribe?pattern=flood.*",
            additional_headers={"Authorization": f"Bearer {READER}"},
            max_queue=4,
        ) as ws,
    ):
        await publish(http, 10_000)  # warm up: the send queue and socket buffers fill
        before = slow_server.rss_kib()
        await publish(http, 90_000, start=10_000)
        after = slow_server.rss_kib()
        # 90,000 more messages of ~250 bytes each: held anywhere, they would add well over
        # 40 MiB (envelopes, dicts, encoded frames); a bounded queue adds nothing.
        assert after - before < 12 * 1024, (before, after)
        with pytest.raises(websockets.ConnectionClosed) as caught:
            while True:
                await asyncio.wait_for(ws.recv(), 10)
        metrics = (await http.get("/metrics")).text
    close = caught.value.rcvd
    assert close is not None and close.code == 1008
    assert close.reason.startswith("too slow: ") and close.reason.endswith(" messages dropped")
    assert int(close.reason.split()[2]) >= MAX_DROPS
    line = next(x for x in metrics.splitlines() if x.startswith("pantheon_gateway_dropped_total"))
    assert float(line.split()[1]) >= MAX_DROPS
