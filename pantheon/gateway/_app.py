"""The gateway's ASGI application: HTTP and WebSocket routes over one bus.

Every message that comes in is published with the bus's public verbs (``emit_nowait``,
``request``), so it is recorded in the session like any other outside input and a replay
re-publishes it. Refusals are the bus's own: a mailbox that refuses (``QueueFullError``)
or an open publisher breaker (``CircuitOpenError``) becomes 429 with ``Retry-After``;
there is no separate rate limiter to disagree with the bus.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import re
import time
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
from starlette.applications import Starlette
from starlette.requests import ClientDisconnect, Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from bus import (
    Bus,
    BusClosedError,
    CircuitOpenError,
    DecodeError,
    NoRouteError,
    Priority,
    QueueFullError,
    RequestTimeout,
    UntrustedDecoder,
    validate_pattern,
)
from pantheon.gateway._auth import ANONYMOUS, Grant, Tokens
from pantheon.gateway._fanout import CLIENT_BYTES, Client, Encoder, Hub, release_memory
from pantheon.gateway._metrics import render_metrics
from pantheon.runner import HttpSource, InboxClosed, InboxFull
from pantheon.scenario import GatewayConfig
from pantheon.sessions import WATCHER_PREFIX

__all__ = ["GatewayState", "build_app"]

log = logging.getLogger("pantheon.gateway")

# fullmatch, not match with "$": "$" also matches before a final newline ("foo\n").
_TOPIC = re.compile(r"[A-Za-z0-9_-]+(\.[A-Za-z0-9_-]+)*")
_PRIORITIES = {
    "critical": Priority.CRITICAL,
    "high": Priority.HIGH,
    "normal": Priority.NORMAL,
    "0": Priority.CRITICAL,
    "1": Priority.HIGH,
    "2": Priority.NORMAL,
}
_STATIC = Path(__file__).with_name("static")
#: A departing client that held this many bytes at once hands the freed memory back to the
#: system (see :func:`release_memory`); smaller ones are not worth the call.
RELEASE_AFTER = 4 * 1024 * 1024
_json_encode = msgspec.json.Encoder(enc_hook=repr).encode
#: How deep a body may nest. Deeper than the interpreter's own limit (about 1,000) fails
#: the decode; a little less decodes, then fails wherever it is encoded again, deeper in
#: the stack (the bus, the recorder), as a 500. No message needs more than a few levels.
MAX_BODY_DEPTH = 100
_json_decode = UntrustedDecoder[Any](format="json", what="body", max_depth=MAX_BODY_DEPTH).decode
_msgpack_decode = UntrustedDecoder[Any](what="body", max_depth=MAX_BODY_DEPTH).decode


class _Item(msgspec.Struct, forbid_unknown_fields=True):
    topic: str
    payload: Any = None
    priority: int | str = 2


class _Batch(msgspec.Struct, forbid_unknown_fields=True):
    """``{"messages": [{"topic", "payload", "priority"}, ...]}``, or for one topic
    ``{"topic": ..., "payloads": [...], "priority": ...}``."""

    messages: list[_Item] | None = None
    topic: str | None = None
    payloads: list[Any] | None = None
    priority: int | str = 2


# Three levels more than a single body: the batch, its list of messages and the message
# (a struct is a level), so each payload is held to the same depth as a published body.
_batch_json = UntrustedDecoder[_Batch](
    _Batch, format="json", what="body", max_depth=MAX_BODY_DEPTH + 3
).decode
_batch_msgpack = UntrustedDecoder[_Batch](_Batch, what="body", max_depth=MAX_BODY_DEPTH + 3).decode


class _Refused(Exception):
    """An HTTP error answer: status, message, extra headers."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.headers = headers or {}


@dataclass(eq=False)
class GatewayState:
    """What the routes share: the bus, the configuration, the tokens and the counters."""

    bus: Bus
    config: GatewayConfig
    tokens: Tokens
    inboxes: dict[str, HttpSource] = field(default_factory=dict)
    #: The run's live feed (what ``pantheon monitor`` shows), once there is one.
    live: Callable[[], Any] | None = None
    ready: bool = False
    encoder: Encoder = field(default_factory=Encoder)
    #: Bytes waiting for one WebSocket or SSE client before its oldest message is dropped.
    client_bytes: int = CLIENT_BYTES
    clients: dict[str, Client] = field(default_factory=dict)
    #: The bus subscription of each subscribed pattern, shared by its clients.
    hubs: dict[str, Hub] = field(default_factory=dict)
    requests: Counter[tuple[str, int]] = field(default_factory=Counter)
    published: int = 0
    dropped_closed: int = 0
    delivered_closed: int = 0
    malformed_frames: int = 0
    #: Until when the last /metrics text is served again, and the text (see ``_metrics``).
    metrics_cache: tuple[float, bytes] | None = None
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _idempotent: OrderedDict[tuple[str, str], Any] = field(default_factory=OrderedDict)
    _topics_ok: set[str] = field(default_factory=set)

    def next_name(self, kind: str) -> str:
        # The watcher prefix keeps these deliveries out of a replay's comparison.
        return f"{WATCHER_PREFIX}{kind}.{next(self._ids)}"

    # -- auth ------------------------------------------------------------------------------

    def grant(self, token: str | None) -> Grant:
        if not self.tokens:
            return ANONYMOUS
        if not token:
            raise _Refused(401, "a bearer token is required", {"WWW-Authenticate": "Bearer"})
        found = self.tokens.check(token)
        if found is None:
            raise _Refused(
                401, "unknown token", {"WWW-Authenticate": 'Bearer error="invalid_token"'}
            )
        return found

    def check_topic(self, grant: Grant, topic: str, where: str = "topic") -> None:
        if topic not in self._topics_ok:
            if not _TOPIC.fullmatch(topic):
                raise _Refused(400, f"{where}: {topic!r} is not a dotted topic name")
            if topic.startswith("system."):
                raise _Refused(400, f"{where}: {topic!r}: system.* topics are the bus's own")
            if len(self._topics_ok) >= 10_000:
                self._topics_ok.clear()
            self._topics_ok.add(topic)
        if not grant.may_publish(topic):
            raise _Refused(403, f"token {grant.name!r} may not publish to {topic!r}")

    # -- idempotency -----------------------------------------------------------------------

    def seen(self, grant: Grant, key: str | None) -> Any:
        if key is None or not self.config.idempotency_keys:
            return None
        return self._idempotent.get((grant.name, key))

    def remember(self, grant: Grant, key: str | None, answer: Any) -> None:
        if key is None or not self.config.idempotency_keys:
            return
        keys = self._idempotent
        if len(keys) >= self.config.idempotency_keys:
            keys.popitem(last=False)
        keys[(grant.name, key)] = answer

    def retry_after(self, exc: BaseException) -> str:
        wait = exc.retry_after if isinstance(exc, CircuitOpenError) else self.config.retry_after
        return str(max(1, math.ceil(wait)))


def _json(status: int, body: Any, headers: dict[str, str] | None = None) -> Response:
    return Response(_json_encode(body), status, headers, media_type="application/json")


def _bearer(headers: Any, query: Any) -> str | None:
    auth = headers.get("authorization")
    if auth:
        scheme, _, token = auth.partition(" ")
        return token.strip() if scheme.lower() == "bearer" else None
    # Browsers cannot set headers on a WebSocket or an EventSource: a subprotocol
    # ``bearer.<token>`` or the ``access_token`` parameter carries it instead (the access
    # log never prints a query string).
    for proto in headers.get("sec-websocket-protocol", "").split(","):
        proto = proto.strip()
        if proto.startswith("bearer."):
            return proto[7:]
    return query.get("access_token")


def _priority(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 2:
        return value
    found = _PRIORITIES.get(str(value).lower()) if isinstance(value, str | int) else None
    if found is None:
        raise _Refused(400, f"{where}: {value!r} is not a priority (critical, high, normal or 0-2)")
    return int(found)


async def _body(request: Request, limit: int) -> bytes:
    length = request.headers.get("content-length")
    if length is not None:
        if not length.isdigit():
            raise _Refused(400, "content-length: not a number")
        if int(length) > limit:
            raise _Refused(413, f"body of {length} bytes is over the limit of {limit}")
        return await request.body()
    chunks = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise _Refused(413, f"body is over the limit of {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _decode(request: Request, body: bytes) -> Any:
    if not body:
        raise _Refused(400, "body: empty; send a JSON (or msgpack) payload, null for none")
    kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
    try:
        if kind in ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack"):
            return _msgpack_decode(body)
        if kind in ("application/json", "text/json", ""):
            return _json_decode(body)
    except DecodeError as exc:
        raise _Refused(400, _bad_body(kind, exc)) from None
    raise _Refused(415, f"content-type {kind!r}: send application/json or application/msgpack")


def _bad_body(kind: str, exc: DecodeError) -> str:
    """One line for a 400: a schema mismatch names the field, anything else the format."""
    if exc.reason == "too_deep":  # the same words from a batch, deeper by its own levels
        return f"body: nested over {MAX_BODY_DEPTH} levels"
    if isinstance(exc.__cause__, msgspec.ValidationError):
        return f"body: {exc.detail}"
    return f"body: not valid {kind}: {exc.detail}"


def build_app(state: GatewayState) -> ASGIApp:
    """The Starlette app over ``state``, wrapped in the access log."""
    bus = state.bus
    config = state.config

    def route(
        name: str, fn: Callable[[Request, Grant], Awaitable[Response]]
    ) -> Callable[[Request], Awaitable[Response]]:
        async def endpoint(request: Request) -> Response:
            try:
                grant = state.grant(_bearer(request.headers, request.query_params))
                return await fn(request, grant)
            except _Refused as exc:
                return _json(exc.status, {"error": exc.message}, exc.headers)
            except BusClosedError:
                return _json(503, {"error": "the bus is closed"}, {"Retry-After": "1"})
            except ClientDisconnect:
                # The client went away mid-body (or the server closed it: a bad chunk, a
                # body timeout). Nobody reads this answer; the access log shows the 499.
                return Response(status_code=499)

        endpoint.__name__ = name
        return endpoint

    async def publish(request: Request, grant: Grant) -> Response:
        topic = request.path_params["topic"]
        state.check_topic(grant, topic)
        key = request.headers.get("idempotency-key")
        earlier = state.seen(grant, key)
        if earlier is not None:
            return _json(200, {"id": earlier, "duplicate": True})
        priority = _priority(request.headers.get("x-priority", "normal"), "header X-Priority")
        payload = _decode(request, await _body(request, config.max_body))
        try:
            env = bus.emit_nowait(topic, payload, priority)
        except (QueueFullError, CircuitOpenError) as exc:
            return _json(429, {"error": str(exc)}, {"Retry-After": state.retry_after(exc)})
        state.published += 1
        state.remember(grant, key, env.id)
        return _json(202, {"id": env.id})

    async def batch(request: Request, grant: Grant) -> Response:
        body = await _body(request, config.max_body)
        if not body:
            raise _Refused(400, 'body: empty; send {"messages": [...]}')
        kind = request.headers.get("content-type", "application/json").split(";")[0].strip()
        try:
            if kind in ("application/msgpack", "application/x-msgpack", "application/vnd.msgpack"):
                parsed = _batch_msgpack(body)
            else:
                parsed = _batch_json(body)
        except DecodeError as exc:
            raise _Refused(400, _bad_body(kind or "JSON", exc)) from None
        key = request.headers.get("idempotency-key")
        earlier = state.seen(grant, key)
        if earlier is not None:
            return _json(200, {"ids": earlier, "duplicate": True})
        emit = bus.emit_nowait
        ids: list[int] = []
        if parsed.messages is not None:
            if parsed.payloads is not None or parsed.topic is not None:
                raise _Refused(400, "body: give messages, or topic with payloads, not both")
            items = parsed.messages
            if len(items) > config.max_batch:
                raise _Refused(
                    400, f"body.messages: {len(items)} messages, over {config.max_batch}"
                )
            # Everything is checked before anything is published: a bad item refuses the
            # whole batch, so a client never has to work out which half went through.
            prios = []
            for i, item in enumerate(items):
                state.check_topic(grant, item.topic, f"body.messages[{i}].topic")
                prios.append(_priority(item.priority, f"body.messages[{i}].priority"))
            try:
                for item, prio in zip(items, prios, strict=True):
                    ids.append(emit(item.topic, item.payload, prio).id)
            except (QueueFullError, CircuitOpenError) as exc:
                return _refused_batch(state, exc, ids)
        elif parsed.payloads is not None and parsed.topic is not None:
            topic = parsed.topic
            state.check_topic(grant, topic, "body.topic")
            prio = _priority(parsed.priority, "body.priority")
            payloads = parsed.payloads
            if len(payloads) > config.max_batch:
                raise _Refused(
                    400, f"body.payloads: {len(payloads)} messages, over {config.max_batch}"
                )
            append = ids.append
            try:
                for payload in payloads:
                    append(emit(topic, payload, prio).id)
            except (QueueFullError, CircuitOpenError) as exc:
                return _refused_batch(state, exc, ids)
        else:
            raise _Refused(400, "body: expected messages, or topic with payloads")
        state.published += len(ids)
        state.remember(grant, key, ids)
        return _json(202, {"ids": ids})

    async def request_reply(request: Request, grant: Grant) -> Response:
        topic = request.path_params["topic"]
        state.check_topic(grant, topic)
        raw = request.query_params.get("timeout") or str(min(5.0, config.request_timeout))
        try:
            timeout = float(raw)
        except ValueError:
            raise _Refused(400, f"query timeout: {raw!r} is not a number of seconds") from None
        if not 0 < timeout <= config.request_timeout:
            raise _Refused(400, f"query timeout: {raw} is not in (0, {config.request_timeout}]")
        priority = _priority(request.headers.get("x-priority", "high"), "header X-Priority")
        payload = _decode(request, await _body(request, config.max_body))
        try:
            reply = await bus.request(topic, payload, timeout=timeout, priority=priority)
        except NoRouteError:
            return _json(404, {"error": f"nothing answers requests on {topic!r}"})
        except RequestTimeout:
            return _json(504, {"error": f"no reply on {topic!r} within {timeout}s"})
        except (QueueFullError, CircuitOpenError) as exc:
            return _json(429, {"error": str(exc)}, {"Retry-After": state.retry_after(exc)})
        except BusClosedError:
            raise
        except Exception as exc:  # the answering handler failed: the DLQ has the traceback
            return _json(502, {"error": f"the handler failed: {type(exc).__name__}: {exc}"})
        state.published += 1
        return _json(200, {"reply": reply})

    async def inbox(request: Request, grant: Grant) -> Response:
        name = request.path_params.get("observer")
        if name is None:
            if len(state.inboxes) != 1:
                names = ", ".join(state.inboxes) or "none"
                raise _Refused(404, f"no single inbox: POST /v1/inbox/<observer> ({names})")
            name = next(iter(state.inboxes))
        source = state.inboxes.get(name)
        if source is None:
            raise _Refused(404, f"no http input read by an agent named {name!r}")
        body = await _body(request, config.max_body)
        problem = None
        record: Any = None
        try:
            record = _decode(request, body)
        except _Refused as exc:
            if exc.status != 400:
                raise
            problem = exc.message  # published on the malformed topic, and answered 400
        item = source.item(record, problem)
        if not grant.may_publish(item.topic):
            raise _Refused(403, f"token {grant.name!r} may not publish to {item.topic!r}")
        try:
            done = source.offer(item)
        except InboxFull as exc:
            return _json(429, {"error": str(exc)}, {"Retry-After": state.retry_after(exc)})
        except InboxClosed as exc:
            return _json(503, {"error": str(exc)})
        # Whoever stops waiting first, the outcome is read, never left "never retrieved".
        done.add_done_callback(_retrieve)
        try:
            await asyncio.wait_for(asyncio.shield(done), config.request_timeout)
        except InboxClosed as exc:
            return _json(503, {"error": str(exc)})
        except TimeoutError:
            return _json(202, {"queued": True, "topic": item.topic})
        if problem is not None:
            return _json(400, {"error": problem, "published_on": item.topic})
        state.published += 1
        return _json(202, {"published": True, "topic": item.topic, "malformed": item.malformed})

    async def healthz(request: Request) -> Response:
        return _json(200, {"status": "ok"})

    async def readyz(request: Request) -> Response:
        if state.ready:
            return _json(200, {"status": "ready"})
        return _json(503, {"status": "not ready"})

    async def metrics(request: Request) -> Response:
        try:
            state.grant(_bearer(request.headers, request.query_params))
        except _Refused as exc:
            return _json(exc.status, {"error": exc.message}, exc.headers)
        body, content_type = await render_metrics(state)
        return Response(body, 200, media_type=content_type)

    async def index(request: Request) -> Response:
        return FileResponse(_STATIC / "index.html", media_type="text/html")

    def subscription(pattern: str | None, grant: Grant) -> str:
        if not pattern:
            raise _Refused(400, "query pattern: required, e.g. ?pattern=action.*")
        try:
            validate_pattern(pattern)
        except ValueError as exc:
            raise _Refused(400, f"query pattern: {exc}") from None
        if not grant.may_subscribe(pattern):
            raise _Refused(403, f"token {grant.name!r} may not subscribe to {pattern!r}")
        return pattern

    def attach(kind: str, pattern: str) -> Client:
        name = state.next_name(kind)
        client = Client(
            name, limit=config.send_queue, max_drops=config.max_drops, max_bytes=state.client_bytes
        )
        hub = state.hubs.get(pattern)
        if hub is None:
            hub = Hub(state.next_name("gateway"), pattern, state.encoder)
            # The handler only appends to the clients' own bounded queues, so the bus
            # mailbox in front of it holds no more than a burst: room for a whole batch on
            # top of a send queue. It sheds (never blocks) so no publisher ever waits for a
            # web client; what it sheds is counted in its clients' drops.
            bus.on(
                pattern, hub, name=hub.name, max_queue=config.send_queue + config.max_batch,
                overflow="shed", breaker=None,
            )  # fmt: skip
            hub.subscription = bus.subscriptions()[hub.name]
            state.hubs[pattern] = hub
        hub.add(client)
        state.clients[name] = client
        return client

    async def detach(client: Client) -> None:
        state.clients.pop(client.name, None)
        state.dropped_closed += client.dropped
        state.delivered_closed += client.delivered
        hub = client.hub
        if hub is not None:
            hub.clients.pop(client.name, None)
            if not hub.clients and state.hubs.get(hub.pattern) is hub:
                # Out of the map before the await: a client attaching meanwhile gets a
                # new hub rather than one being unsubscribed.
                del state.hubs[hub.pattern]
                with contextlib.suppress(KeyError, BusClosedError):
                    await bus.off(hub.name)
        client.queue.clear()
        if not state.clients:
            state.encoder.clear()
        if client.peak >= RELEASE_AFTER:
            release_memory()

    async def subscribe(ws: WebSocket) -> None:
        try:
            grant = state.grant(_bearer(ws.headers, ws.query_params))
            pattern = subscription(ws.query_params.get("pattern"), grant)
        except _Refused as exc:
            # Refused before the handshake completes: the client sees the HTTP status.
            await ws.send_denial_response(_json(exc.status, {"error": exc.message}, exc.headers))
            return
        offered = [p.strip() for p in ws.headers.get("sec-websocket-protocol", "").split(",")]
        await ws.accept(subprotocol="pantheon.v1" if "pantheon.v1" in offered else None)
        client = attach("ws", pattern)
        send = ws.send
        reader = asyncio.get_running_loop().create_task(_drain_incoming(ws, state))
        reader.add_done_callback(lambda _: client.close())
        try:
            async for frame in client.frames():
                await send({"type": "websocket.send", "bytes": frame})
            if client.overflowed:
                reason = f"too slow: {client.dropped} messages dropped"
                log.info("closing %s: %s", client.name, reason)
                await ws.close(code=1008, reason=reason)
            elif not reader.done():  # the gateway is stopping
                await ws.close(code=1001, reason="the gateway is stopping")
        except (WebSocketDisconnect, OSError, RuntimeError):
            pass  # the client went away mid-send
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
            await detach(client)

    async def sse(request: Request, grant: Grant) -> Response:
        pattern = subscription(request.query_params.get("pattern"), grant)

        async def stream() -> AsyncIterator[bytes]:
            # Subscribed here, not before the response: a client gone before the stream
            # starts never runs this generator, and so never leaves a subscription behind.
            client = attach("sse", pattern)
            try:
                yield b": subscribed\n\n"
                async for frame in client.frames():
                    yield b"data: %b\n\n" % frame
                yield b"event: close\ndata: %d\n\n" % client.dropped
            finally:
                await detach(client)

        return StreamingResponse(
            stream(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def live(ws: WebSocket) -> None:
        """The run's live feed (snapshots, redrives) for a remote ``pantheon monitor
        --url``: the Unix socket's msgpack frames, one per WebSocket message."""
        feed = state.live() if state.live is not None else None
        try:
            grant = state.grant(_bearer(ws.headers, ws.query_params))
            if not grant.may_subscribe(">"):
                raise _Refused(403, f"token {grant.name!r} may not watch the whole run")
            if feed is None:
                raise _Refused(404, "this run has no live feed (it is not recorded)")
        except _Refused as exc:
            await ws.send_denial_response(_json(exc.status, {"error": exc.message}, exc.headers))
            return
        await ws.accept()

        async def recv() -> bytes | None:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return None
            return message.get("bytes") or b""

        async def send(body: bytes) -> None:
            await ws.send_bytes(body)

        try:
            state.malformed_frames += await feed.serve_messages(recv, send)
            await ws.close(code=1000)  # the run has ended: its last snapshot went out
        except (WebSocketDisconnect, OSError, RuntimeError):
            pass  # the client went away

    routes = [
        Route("/v1/topics/{topic}", route("publish", publish), methods=["POST"]),
        Route("/v1/batch", route("batch", batch), methods=["POST"]),
        Route("/v1/request/{topic}", route("request", request_reply), methods=["POST"]),
        Route("/v1/inbox", route("inbox", inbox), methods=["POST"]),
        Route("/v1/inbox/{observer}", route("inbox", inbox), methods=["POST"]),
        Route("/v1/sse", route("sse", sse), methods=["GET"]),
        WebSocketRoute("/v1/subscribe", subscribe),
        WebSocketRoute("/v1/live", live),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ]
    if config.static:
        routes.append(Route("/", index, methods=["GET"]))
    return AccessLog(Starlette(routes=routes), state)


async def _drain_incoming(ws: WebSocket, state: GatewayState) -> None:
    """Read (and ignore) what a subscriber sends, so a close from it is seen at once; a
    subscriber has nothing to say on this socket, and anything it says is counted."""
    while True:
        message = await ws.receive()
        if message["type"] == "websocket.disconnect":
            return
        state.malformed_frames += 1


def _retrieve(fut: asyncio.Future[None]) -> None:
    if not fut.cancelled():
        fut.exception()


def _refused_batch(state: GatewayState, exc: BaseException, ids: list[int]) -> Response:
    state.published += len(ids)
    return _json(
        429,
        {"error": str(exc), "ids": ids, "refused_index": len(ids)},
        {"Retry-After": state.retry_after(exc)},
    )


class AccessLog:
    """One line per request: method, path (never the query string, which may hold a
    token), status and time; and the per-route counters of /metrics. A plain ASGI
    wrapper, not Starlette middleware, so it costs a function call per request."""

    __slots__ = ("app", "state")

    def __init__(self, app: ASGIApp, state: GatewayState) -> None:
        self.app = app
        self.state = state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 0

        async def sending(message: Message) -> None:
            nonlocal status
            kind = message["type"]
            if kind == "http.response.start":
                status = message["status"]
            elif kind == "websocket.accept":
                status = 101
            elif kind == "websocket.http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            path = scope["path"]
            self.state.requests[(_route_of(path), status)] += 1
            if log.isEnabledFor(logging.INFO):
                log.info(
                    "%s %s %d %.1fms",
                    scope.get("method", "WS"),
                    path,
                    status,
                    (time.perf_counter() - started) * 1000,
                )


def _route_of(path: str) -> str:
    """The route, not the path, so /metrics labels do not grow with topic names."""
    for prefix in ("/v1/topics/", "/v1/request/", "/v1/inbox/"):
        if path.startswith(prefix):
            return prefix + "{}"
    return path if path in _KNOWN else "other"


_KNOWN = {
    "/v1/batch",
    "/v1/inbox",
    "/v1/sse",
    "/v1/subscribe",
    "/v1/live",
    "/healthz",
    "/readyz",
    "/metrics",
    "/",
}
