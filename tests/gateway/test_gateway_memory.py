"""Memory a subscriber can make the gateway hold: bounded in bytes, not only in messages,
and given back once it leaves."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import websockets
from gateway_server import ADMIN, READER, TOKENS_ENV, Server, start_server, write_scenario

from bus import Envelope
from pantheon.gateway import Client, Encoder, Hub

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:websockets")

BIG = 256 * 1024


def envelope(i: int, size: int) -> Envelope:
    return Envelope(topic="big.x", payload="x" * size, id=i)


async def test_a_client_queue_is_bounded_in_bytes_and_keeps_the_newest() -> None:
    client = Client("c", limit=4096, max_drops=0, max_bytes=1024 * 1024)
    hub = Hub("h", "big.*", Encoder())
    hub.add(client)
    for i in range(1, 101):
        await hub(envelope(i, BIG))
    assert client.size <= 1024 * 1024
    assert sum(map(len, client.queue)) == client.size
    assert client.queue_dropped == 100 - len(client.queue)
    assert b'"id":100' in client.queue[-1]
    frame = await anext(aiter(client.frames()))
    assert len(frame) <= 1024 * 1024 + 1024  # a frame is bounded in bytes too


def test_the_encoder_cache_is_bounded_in_bytes() -> None:
    encode = Encoder(max_bytes=1024 * 1024)
    for i in range(1, 101):
        encode(envelope(i, BIG))
    assert encode.size <= 1024 * 1024
    assert encode.encoded == 100


@pytest.fixture
def big_server(tmp_path: Path) -> Iterator[Server]:
    scenario = write_scenario(tmp_path, max_body=1024 * 1024)
    srv = start_server(scenario, tmp_path, "--no-record", env={"GW_TEST_TOKENS": TOKENS_ENV})
    try:
        yield srv
    finally:
        assert srv.stop() == 0


async def test_a_subscriber_that_never_reads_holds_bounded_memory_given_back_when_it_leaves(
    big_server: Server,
) -> None:
    body = b'"' + b"y" * BIG + b'"'
    async with httpx.AsyncClient(
        base_url=big_server.url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=30
    ) as http:
        for _ in range(20):  # warm up the allocator and the server's buffers
            await http.post("/v1/topics/warm.x", content=body)
        start = big_server.rss_kib()
        async with websockets.connect(
            f"{big_server.ws}/v1/subscribe?pattern=big.*",
            additional_headers={"Authorization": f"Bearer {READER}"},
            max_queue=1,
        ) as ws:
            ws.transport.pause_reading()  # never reads: the server's send buffer fills
            for _ in range(400):  # 100 MiB
                assert (await http.post("/v1/topics/big.x", content=body)).status_code == 202
            full = big_server.rss_kib()
        for _ in range(50):  # the server notices the close, then frees
            left = big_server.rss_kib()
            if left - start < 24 * 1024:
                break
            await asyncio.sleep(0.2)
    # Held: at most the client's 16 MiB, the encoder's 32 MiB and socket buffers; the
    # 4,096-message queue and cache alone would hold all 100 MiB, twice.
    assert full - start < 80 * 1024, (start, full)
    assert left - start < 24 * 1024, (start, full, left)
