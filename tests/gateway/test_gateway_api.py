"""The gateway's HTTP and WebSocket API against a real ``pantheon serve`` process."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import msgspec
import pytest
import websockets
from gateway_server import ADMIN, PUBLISHER, READER, Server
from store_poll import until
from untrusted_corpus import CORPUS

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:websockets")


def auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def recv_messages(ws: Any, n: int, timeout: float = 15.0) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    async with asyncio.timeout(timeout):
        while len(out) < n:
            frame = json.loads(await ws.recv())
            assert frame["dropped"] == 0
            out.extend(frame["messages"])
    return out


async def test_publish_reaches_a_websocket_subscriber(server: Server) -> None:
    async with websockets.connect(
        f"{server.ws}/v1/subscribe?pattern=data.*", additional_headers=auth(READER)
    ) as ws:
        async with httpx.AsyncClient(base_url=server.url, headers=auth(PUBLISHER)) as http:
            r = await http.post(
                "/v1/topics/data.one", json={"n": 1}, headers={"X-Priority": "high"}
            )
            assert r.status_code == 202
            first = r.json()["id"]
            packed = msgspec.msgpack.encode({"n": 2, "blob": [1, 2, 3]})
            r = await http.post(
                "/v1/topics/data.two",
                content=packed,
                headers={"content-type": "application/msgpack"},
            )
            assert r.status_code == 202
            second = r.json()["id"]
        got = await recv_messages(ws, 2)
    assert [(m["id"], m["topic"], m["payload"]) for m in got] == [
        (first, "data.one", {"n": 1}),
        (second, "data.two", {"n": 2, "blob": [1, 2, 3]}),
    ]
    assert got[0]["priority"] == 1 and got[1]["priority"] == 2
    assert got[0]["causation_id"] is None and got[0]["source"] is None  # outside input


async def test_batch_in_both_forms_is_published_in_order(server: Server) -> None:
    async with websockets.connect(
        f"{server.ws}/v1/subscribe?pattern=data.*", additional_headers=auth(READER)
    ) as ws:
        async with httpx.AsyncClient(base_url=server.url, headers=auth(PUBLISHER)) as http:
            r1 = await http.post(
                "/v1/batch", json={"topic": "data.bulk", "payloads": [{"i": i} for i in range(50)]}
            )
            r2 = await http.post(
                "/v1/batch",
                json={
                    "messages": [
                        {"topic": "data.a", "payload": "x"},
                        {"topic": "data.b", "payload": "y", "priority": "critical"},
                    ]
                },
            )
        assert r1.status_code == 202 and r2.status_code == 202
        ids = r1.json()["ids"] + r2.json()["ids"]
        assert len(ids) == 52 and len(set(ids)) == 52
        got = await recv_messages(ws, 52)
    # Same priority: in publish order. The CRITICAL one may overtake what waits beside it.
    normal = [m for m in got if m["priority"] == 2]
    assert [m["id"] for m in normal] == ids[:51]
    assert [m["payload"] for m in normal[:50]] == [{"i": i} for i in range(50)]
    (urgent,) = [m for m in got if m["priority"] == 0]
    assert (urgent["id"], urgent["topic"]) == (ids[51], "data.b")


async def test_sse_streams_matching_messages(server: Server) -> None:
    async with (
        httpx.AsyncClient(base_url=server.url, timeout=15) as http,
        # EventSource cannot set headers: the token rides in access_token.
        http.stream(
            "GET", "/v1/sse", params={"pattern": "data.sse", "access_token": READER}
        ) as resp,
    ):
        assert resp.status_code == 200
        assert resp.headers["content-type"].startswith("text/event-stream")
        lines = resp.aiter_lines()
        assert await anext(lines) == ": subscribed"
        r = await http.post("/v1/topics/data.sse", json=[1, 2], headers=auth(PUBLISHER))
        await http.post("/v1/topics/data.other", json=0, headers=auth(PUBLISHER))
        async for line in lines:
            if line.startswith("data: "):
                frame = json.loads(line[6:])
                break
    assert [(m["id"], m["payload"]) for m in frame["messages"]] == [(r.json()["id"], [1, 2])]


def test_request_reply_and_its_failures(server: Server) -> None:
    with httpx.Client(base_url=server.url, headers=auth(PUBLISHER), timeout=20) as http:
        r = http.post("/v1/request/svc.echo", json={"q": "ping"})
        assert (r.status_code, r.json()) == (
            200,
            {"reply": {"echo": {"q": "ping"}, "topic": "svc.echo"}},
        )
        r = http.post("/v1/request/svc.nobody", json=1)
        assert r.status_code == 404 and "svc.nobody" in r.json()["error"]
        r = http.post("/v1/request/svc.silent", params={"timeout": "0.3"}, json=1)
        assert r.status_code == 504 and "0.3s" in r.json()["error"]
        r = http.post("/v1/request/svc.fail", json=1)
        assert r.status_code == 502
        assert r.json()["error"] == "the handler failed: ValueError: this service always fails"
        r = http.post("/v1/request/svc.echo", params={"timeout": "99"}, json=1)
        assert r.status_code == 400 and r.json()["error"] == "query timeout: 99 is not in (0, 10.0]"


def test_no_token_or_unknown_token_is_401(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/topics/data.x", json=1)
    assert r.status_code == 401 and r.headers["www-authenticate"] == "Bearer"
    r = httpx.post(f"{server.url}/v1/topics/data.x", json=1, headers=auth(PUBLISHER + "x"))
    assert r.status_code == 401 and r.json() == {"error": "unknown token"}
    assert httpx.get(f"{server.url}/metrics").status_code == 401


async def test_websocket_without_token_is_refused_with_401(server: Server) -> None:
    with pytest.raises(websockets.InvalidStatus) as caught:
        async with websockets.connect(f"{server.ws}/v1/subscribe?pattern=data.*"):
            pass
    assert caught.value.response.status_code == 401


def test_acl_patterns_from_file_and_env_decide_403(server: Server) -> None:
    # reader (from the environment variable) may subscribe to anything, publish nothing.
    r = httpx.post(f"{server.url}/v1/topics/data.x", json=1, headers=auth(READER))
    assert (r.status_code, r.json()["error"]) == (
        403,
        "token 'reader' may not publish to 'data.x'",
    )
    # publisher (from the file) publishes data.* but not audit.*; admin (env) anything.
    r = httpx.post(f"{server.url}/v1/topics/audit.x", json=1, headers=auth(PUBLISHER))
    assert r.status_code == 403
    assert (
        httpx.post(f"{server.url}/v1/topics/audit.x", json=1, headers=auth(ADMIN)).status_code
        == 202
    )
    # a batch with one forbidden topic publishes nothing
    r = httpx.post(
        f"{server.url}/v1/batch",
        json={"messages": [{"topic": "data.ok"}, {"topic": "audit.no"}]},
        headers=auth(PUBLISHER),
    )
    assert r.status_code == 403 and "audit.no" in r.json()["error"]


async def test_subscribe_outside_acl_is_403(server: Server) -> None:
    # publisher may subscribe to data.* only: svc.*, the deeper data.> and > are outside it
    for pattern in ("svc.*", "data.>", ">"):
        with pytest.raises(websockets.InvalidStatus) as caught:
            async with websockets.connect(
                f"{server.ws}/v1/subscribe?pattern={pattern}", additional_headers=auth(PUBLISHER)
            ):
                pass
        assert caught.value.response.status_code == 403, pattern
    async with httpx.AsyncClient(base_url=server.url) as http:
        r = await http.get("/v1/sse", params={"pattern": "svc.*"}, headers=auth(PUBLISHER))
    assert r.status_code == 403


def test_body_over_the_limit_is_413(server: Server) -> None:
    big = b'"' + b"x" * 5000 + b'"'
    r = httpx.post(f"{server.url}/v1/topics/data.big", content=big, headers=auth(PUBLISHER))
    assert r.status_code == 413 and "4096" in r.json()["error"]

    def chunks() -> Any:  # no content-length: the limit holds while reading
        for _ in range(10):
            yield b"x" * 1000

    r = httpx.post(f"{server.url}/v1/batch", content=chunks(), headers=auth(PUBLISHER))
    assert r.status_code == 413 and r.json()["error"] == "body is over the limit of 4096 bytes"


def test_bad_input_is_400_naming_the_field(server: Server) -> None:
    h = auth(PUBLISHER)
    cases = [
        ("/v1/topics/data.x", {"content": b"{not json"}, "body: not valid application/json"),
        ("/v1/topics/data..x", {"json": 1}, "topic: 'data..x' is not a dotted topic name"),
        (
            "/v1/batch",
            {"json": {"messages": [{"topic": "data.a"}, {"topic": 5}]}},
            "body: Expected `str`, got `int` - at `$.messages[1].topic`",
        ),
        (
            "/v1/batch",
            {"json": {"messages": [{"topic": "data.a", "priority": "urgent"}]}},
            "body.messages[0].priority: 'urgent' is not a priority (critical, high, normal or 0-2)",
        ),
        (
            "/v1/batch",
            {"json": {"messages": [], "mood": 1}},
            "body: Object contains unknown field `mood`",
        ),
        ("/v1/topics/system.breaker.x", {"json": 1}, "system.* topics are the bus's own"),
    ]
    for path, kwargs, message in cases:
        r = httpx.post(f"{server.url}{path}", headers=h, **kwargs)
        assert r.status_code == 400, (path, r.text)
        assert message in r.json()["error"], (path, r.json())
    r = httpx.post(f"{server.url}/v1/topics/data.x", json=1, headers={**h, "X-Priority": "9"})
    assert (r.status_code, r.json()["error"]) == (
        400,
        "header X-Priority: '9' is not a priority (critical, high, normal or 0-2)",
    )
    r = httpx.get(f"{server.url}/v1/sse", params={"pattern": "data*"}, headers=auth(READER))
    assert r.status_code == 400 and r.json()["error"].startswith("query pattern: ")


def test_a_full_mailbox_is_429_with_retry_after(server: Server) -> None:
    """`slow` handles one message for 3 s with a mailbox of one and overflow reject: the
    third message is refused by the bus itself."""
    h = auth(PUBLISHER)
    codes = [httpx.post(f"{server.url}/v1/topics/slow.x", json=i, headers=h) for i in range(3)]
    assert [r.status_code for r in codes] == [202, 202, 429]
    assert codes[2].headers["retry-after"] == "1"
    assert "mailbox full for topic 'slow.x': slow" in codes[2].json()["error"]
    r = httpx.post(
        f"{server.url}/v1/batch", json={"topic": "slow.y", "payloads": [1, 2]}, headers=h
    )
    assert r.status_code == 429 and r.json()["refused_index"] == 0 and r.json()["ids"] == []


def test_idempotency_key_publishes_once(server: Server) -> None:
    h = {**auth(PUBLISHER), "Idempotency-Key": "order-77"}
    first = httpx.post(f"{server.url}/v1/topics/data.idem", json=1, headers=h)
    again = httpx.post(f"{server.url}/v1/topics/data.idem", json=1, headers=h)
    assert first.status_code == 202 and again.status_code == 200
    assert again.json() == {"id": first.json()["id"], "duplicate": True}
    metrics = httpx.get(f"{server.url}/metrics", headers=auth(READER)).text
    assert 'pantheon_bus_topic_published_total{topic="data.idem"} 1.0' in metrics


async def test_inbox_feeds_the_observer(server: Server) -> None:
    http = httpx.AsyncClient(base_url=server.url)
    async with (
        http,
        websockets.connect(
            f"{server.ws}/v1/subscribe?pattern=inbox.*", additional_headers=auth(READER)
        ) as ws,
    ):
        r = await http.post(
            f"{server.url}/v1/inbox", json={"id": "hook-1", "x": 1}, headers=auth(PUBLISHER)
        )
        assert r.json() == {"published": True, "topic": "inbox.received", "malformed": False}
        assert r.status_code == 202
        got = await recv_messages(ws, 1)
        assert got[0]["payload"] == {"id": "hook-1", "x": 1}
        assert got[0]["source"] is None  # published by the Observer as outside input
        r = await http.post("/v1/inbox", json=1, headers=auth(READER))
    assert r.status_code == 403


def test_health_ready_and_metrics(server: Server) -> None:
    assert httpx.get(f"{server.url}/healthz").json() == {"status": "ok"}
    assert httpx.get(f"{server.url}/readyz").json() == {"status": "ready"}
    r = httpx.get(f"{server.url}/metrics", headers=auth(READER))
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=")
    text = r.text
    for needle in (
        "# TYPE pantheon_bus_published_total counter",
        'pantheon_bus_subscriber_delivered_total{subscriber="echo"}',
        'pantheon_bus_breaker_state{state="closed",subscriber="sink"} 1.0',
        'pantheon_gateway_requests_total{route="/v1/topics/{}",status="401"}',
        "pantheon_gateway_published_total",
        "pantheon_bus_dlq_size",
    ):
        assert needle in text, needle


def test_tokens_never_reach_the_logs(server: Server) -> None:
    """Runs after the tests above (file order): every token was presented, by header,
    subprotocol-less WebSocket headers and the access_token parameter, at DEBUG level."""
    r = httpx.get(f"{server.url}/v1/sse", params={"pattern": ">", "access_token": ADMIN + "zz"})
    assert r.status_code == 401
    # uvicorn writes the access line after the response is sent: wait for it, not race it
    until(
        "the refused SSE request's access line",
        lambda: "access_token=***" in server.logs() or "GET /v1/sse 401" in server.logs(),
        timeout=30,
    )
    logs = server.logs()
    assert "POST /v1/topics/data.one 202" in logs  # the access log is there...
    for token in (PUBLISHER, READER, ADMIN):
        assert token not in logs  # ...and no token in it


def test_undecodable_bodies_are_400_on_every_route(server: Server) -> None:
    """The shared corpus, JSON 990 deep (it decodes, then failed re-encoded deeper in the
    stack) and msgpack not UTF-8, on all four routes that take a body: each a 400 with one
    line naming the body, or 413 when over the body limit; never a 500 traceback."""
    routes = ["/v1/topics/data.x", "/v1/batch", "/v1/request/svc.echo", "/v1/inbox"]
    deep = b"[" * 990 + b"]" * 990
    bodies: list[tuple[str, bytes, str]] = [
        *(("application/json", data, name) for name, data in CORPUS.items()),
        *(("application/msgpack", data, name) for name, data in CORPUS.items()),
        ("application/json", deep, "JSON 990 deep"),
        ("application/json", b'{"topic": "data.x", "payloads": [' + deep + b"]}", "deep batch"),
    ]
    # The inbox publishes what it cannot read on input.malformed: admin may publish there.
    with httpx.Client(base_url=server.url, headers=auth(ADMIN), timeout=20) as http:
        for route in routes:
            for kind, data, name in bodies:
                r = http.post(route, content=data, headers={"Content-Type": kind})
                where = (route, kind, name, r.text[:200])
                if len(data) > 4096:
                    assert r.status_code == 413, where
                    continue
                assert r.status_code == 400, where
                error = r.json()["error"]
                assert error.startswith("body: ") and "\n" not in error, where
        r = http.post("/v1/topics/data.x", content=b'"\xff"')
        assert r.json()["error"] == (
            "body: not valid application/json: UnicodeDecodeError: 'utf-8' codec can't "
            "decode byte 0xff in position 0: invalid start byte"
        )
        r = http.post("/v1/topics/data.x", content=deep)
        assert r.json()["error"] == "body: nested over 100 levels"
        r = http.post("/v1/batch", content=b'{"topic": "data.x", "payloads": [' + deep + b"]}")
        assert r.json()["error"] == "body: nested over 100 levels"
        r = http.post("/v1/topics/data.x", content=b"[" * 100 + b"]" * 100)
        assert r.status_code == 202


def test_a_topic_with_a_final_newline_is_refused(server: Server) -> None:
    r = httpx.post(f"{server.url}/v1/topics/data.x%0A", json=1, headers=auth(PUBLISHER))
    assert (r.status_code, r.json()["error"]) == (
        400,
        "topic: 'data.x\\n' is not a dotted topic name",
    )
