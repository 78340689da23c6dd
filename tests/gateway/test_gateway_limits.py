"""Connection limits on real sockets: header and body timeouts, a bounded request line and
headers, a connection cap answered 503 with Retry-After, and probes answered past the cap.

The gateway runs in the test's own loop over an in-process bus, with limits small enough
to show each mechanism in well under a second (the 1,250-connection and file-limit
figures are in benchmarks/gateway_limits_bench.py)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator

import pytest

from bus import Bus
from pantheon.gateway import Gateway, ServerLimits
from pantheon.scenario import GatewayConfig

LIMITS = ServerLimits(
    header_timeout=0.3, body_timeout=0.3, max_connections=4, probe_reserve=2, retry_after=7
)


_OPEN: list[asyncio.StreamWriter] = []


@pytest.fixture
async def gateway() -> AsyncIterator[Gateway]:
    async with Bus() as bus, Gateway(bus, GatewayConfig(port=0), limits=LIMITS) as gw:
        try:
            yield gw
        finally:
            while _OPEN:  # whatever a test left open, even when it failed
                writer = _OPEN.pop()
                writer.close()
                with contextlib.suppress(OSError):
                    await writer.wait_closed()


async def connect(gw: Gateway) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    reader, writer = await asyncio.open_connection("127.0.0.1", gw.port)
    _OPEN.append(writer)
    return reader, writer


async def answer(reader: asyncio.StreamReader, within: float = 2.0) -> bytes:
    """Everything the server sends until it closes the connection."""
    return await asyncio.wait_for(reader.read(), within)


async def test_headers_that_never_finish_get_408_and_a_close(gateway: Gateway) -> None:
    reader, writer = await connect(gateway)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # and never the blank line
    got = await answer(reader)
    assert got.startswith(b"HTTP/1.1 408 ")
    writer.close()


async def test_a_connection_that_sends_nothing_is_closed(gateway: Gateway) -> None:
    reader, writer = await connect(gateway)
    got = await answer(reader)
    assert got.startswith(b"HTTP/1.1 408 ")
    writer.close()


async def test_a_body_that_trickles_gets_408_and_a_close(gateway: Gateway) -> None:
    reader, writer = await connect(gateway)
    writer.write(
        b"POST /v1/topics/a.b HTTP/1.1\r\nHost: x\r\ncontent-type: application/json\r\n"
        b"content-length: 100\r\n\r\n{"
    )
    got = await answer(reader)
    assert got.startswith(b"HTTP/1.1 408 ")
    writer.close()


async def test_a_websocket_upgrade_with_a_9_kb_request_line_is_answered_414(
    gateway: Gateway,
) -> None:
    reader, writer = await connect(gateway)
    writer.write(
        b"GET /v1/subscribe?pattern=" + b"a" * 9 * 1024 + b" HTTP/1.1\r\nHost: x\r\n"
        b"Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    got = await answer(reader)
    assert got.startswith(b"HTTP/1.1 414 ")
    writer.close()


async def test_oversized_headers_get_431(gateway: Gateway) -> None:
    reader, writer = await connect(gateway)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * 20_000 + b"\r\n\r\n")
    got = await answer(reader)
    assert got.startswith(b"HTTP/1.1 431 ")
    writer.close()


async def test_past_the_cap_503_with_retry_after_and_probes_still_answer(
    gateway: Gateway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    held = [await connect(gateway) for _ in range(LIMITS.max_connections)]
    await asyncio.sleep(0.05)  # the server has accepted them all
    reader, writer = await connect(gateway)
    writer.write(b"POST /v1/topics/a.b HTTP/1.1\r\nHost: x\r\ncontent-length: 4\r\n\r\nnull")
    refused = await answer(reader)
    assert refused.startswith(b"HTTP/1.1 503 ")
    assert b"\r\nretry-after: 7\r\n" in refused.lower()
    probe_reader, probe_writer = await connect(gateway)
    probe_writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    probe = await answer(probe_reader)
    assert probe.startswith(b"HTTP/1.1 200 ") and b'"ok"' in probe
    for _, w in held:
        w.close()
    writer.close()
    probe_writer.close()
    # A refusal is the client's doing: info, and never a traceback.
    refusals = [r for r in caplog.records if "refused" in r.getMessage()]
    assert refusals and all(r.levelno == logging.INFO and not r.exc_info for r in refusals)


async def test_the_held_connections_free_their_places_when_they_time_out(
    gateway: Gateway,
) -> None:
    held = [await connect(gateway) for _ in range(LIMITS.max_connections + 1)]
    answers = [(await answer(r))[:13] for r, _ in held]
    # Slowloris: each is closed at the header timeout, the one past the cap sooner.
    assert sorted(answers) == [b"HTTP/1.1 408 "] * LIMITS.max_connections + [b"HTTP/1.1 503 "]
    reader, writer = await connect(gateway)
    writer.write(b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
    assert (await answer(reader)).startswith(b"HTTP/1.1 200 ")
    for _, w in held:
        w.close()
    writer.close()


async def test_a_kept_alive_connection_gets_408_when_its_next_headers_stall(
    gateway: Gateway,
) -> None:
    reader, writer = await connect(gateway)
    writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 2)
    assert head.startswith(b"HTTP/1.1 200 ")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    await reader.readexactly(length)
    writer.write(b"GET /healthz HTTP/1.1\r\n")  # the next request's headers never end
    assert (await answer(reader)).startswith(b"HTTP/1.1 408 ")
