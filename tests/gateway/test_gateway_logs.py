"""What a real ``pantheon serve`` writes while clients misbehave: no token anywhere (logs at
DEBUG, tracebacks, the session store), refusals at info, and no traceback for a client's
own mistake."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import socket
import sys
from pathlib import Path

import pytest
import websockets
from gateway_server import ADMIN, PUBLISHER, READER, TOKENS_ENV, start_server, write_scenario

from pantheon.gateway._server import _RedactTokens

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:websockets")


def raw(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(request)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


async def refused_websockets(ws_url: str) -> None:
    for extra in (
        {"additional_headers": {"Authorization": f"Bearer {PUBLISHER}"}},  # 403: no ACL
        {"subprotocols": ["pantheon.v1", f"bearer.{PUBLISHER}x"]},  # 401: unknown
    ):
        with pytest.raises(websockets.InvalidStatus):
            async with websockets.connect(f"{ws_url}/v1/subscribe?pattern=x.*", **extra):  # type: ignore[arg-type]
                pass


def test_no_token_reaches_a_log_or_the_store_and_refusals_are_info(tmp_path: Path) -> None:
    srv = start_server(write_scenario(tmp_path), tmp_path, env={"GW_TEST_TOKENS": TOKENS_ENV})
    try:
        port = int(srv.url.rsplit(":", 1)[1])
        # A bad chunk size: answered 400, and the request's body read ends mid-way.
        bad_chunk = raw(
            port,
            b"POST /v1/topics/data.x HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
            + PUBLISHER.encode()
            + b"\r\nTransfer-Encoding: chunked\r\ncontent-type: application/json\r\n\r\nzz\r\n",
        )
        assert bad_chunk.startswith(b"HTTP/1.1 400 ")
        asyncio.run(refused_websockets(srv.ws))
        ok = raw(
            port,
            b"GET /metrics?access_token=" + READER.encode() + b" HTTP/1.1\r\nHost: x\r\n"
            b"Connection: close\r\n\r\n",
        )
        assert ok.startswith(b"HTTP/1.1 200 ")
    finally:
        assert srv.stop() == 0
    logs = srv.logs()
    store = srv.store.read_bytes()
    for token in (PUBLISHER, READER, ADMIN):
        assert token not in logs
        assert token.encode() not in store
    lines = [json.loads(x) for x in srv.stderr.read_text().splitlines() if x.startswith("{")]
    assert not [x for x in lines if x["level"] in ("error", "critical")], logs
    assert not [x for x in lines if "exception" in x or "Traceback" in x["event"]], logs
    assert [x for x in lines if x["level"] == "info" and "WS /v1/subscribe 403" in x["event"]]


def test_a_traceback_is_rendered_without_locals_and_redacted() -> None:
    redact = _RedactTokens()
    secret = "s3cr3t-token-0123456789"
    redact.digests.add(hashlib.sha256(secret.encode()).digest())
    redact.lengths = (len(secret),)
    headers = {"authorization": f"Bearer {secret}"}  # a local the traceback would show
    try:
        raise KeyError(f"no route for {secret}")
    except KeyError:
        record = logging.LogRecord(
            "uvicorn.error", logging.ERROR, __file__, 1, "failed %s", (headers,), None
        )
        record.exc_info = sys.exc_info()
    record.extra_headers = [(b"authorization", secret.encode())]
    assert redact.filter(record)
    assert record.exc_info is None
    text = record.getMessage() + repr(vars(record))
    assert secret not in text
    assert "Traceback" in record.getMessage() and "KeyError" in record.getMessage()


def test_a_token_is_found_by_value_whatever_punctuation_stands_beside_it() -> None:
    redact = _RedactTokens()
    tokens = ("Zm9vYmFyYmF6cXV4cXV1eA==", "s3cr3t-t0ken-0123456789")
    redact.digests |= {hashlib.sha256(t.encode()).digest() for t in tokens}
    redact.lengths = tuple(sorted({len(t) for t in tokens}, reverse=True))
    b64, plain = tokens
    for line, shown in (
        (f"got {b64} here", "got *** here"),
        (f"token:{plain}", "token:***"),
        (f"bad token {plain}.", "bad token ***."),
        (f"path /x/{plain}/y", "path /x/***/y"),
        (f"{plain}{plain}", "******"),
        (f"not-a-token-but-long-enough {plain[:-1]}", f"not-a-token-but-long-enough {plain[:-1]}"),
    ):
        assert redact.redact(line) == shown
    # A run too long to search window by window is still searched between its punctuation.
    long = "x" * 5000 + f"/{plain}/" + "y" * 10
    assert plain not in redact.redact(long)
