"""A real OpenAI-compatible chat server on 127.0.0.1, for tests and benchmarks of providers.

Real sockets rather than a mocked transport, because what breaks against a model server is
mostly on the wire: keep-alive and connection reuse, retry timing against ``Retry-After``,
server-sent events split across reads, a refused connection. The server runs
``http.server.ThreadingHTTPServer`` (HTTP/1.1, keep-alive) on a free port in a background
thread, so the event loop under test is never blocked by it::

    with ModelServer(reply=classify_reply, delay=0.001) as server:
        provider = OpenAIProvider(server.base_url, model="local")
        ...
        assert len(server.requests) == 1
"""

from __future__ import annotations

import contextlib
import itertools
import json
import re
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

__all__ = ["ModelServer", "ReceivedRequest", "Reply", "classify_reply", "schema_reply"]


@dataclass(frozen=True, slots=True)
class Reply:
    """One assistant answer. ``tool_calls`` are ``{"name", "arguments", "id"?}`` mappings;
    ``arguments`` given as a mapping is JSON-encoded, as a string sent as it is (so a test
    can send arguments that are not JSON). ``finish_reason`` defaults to ``tool_calls`` when
    there are tool calls, else ``stop``."""

    content: str | None = None
    tool_calls: Sequence[Mapping[str, Any]] = ()
    finish_reason: str | None = None


#: What a reply source gives: text, a mapping (answered as its JSON text), or a :class:`Reply`.
ReplyLike = str | Mapping[str, Any] | Reply
#: Computes the reply from the decoded request body.
Responder = Callable[[dict[str, Any]], ReplyLike]


@dataclass(frozen=True, slots=True)
class ReceivedRequest:
    """A request as the server saw it: ``body`` is the decoded JSON (``None`` if it was not
    JSON), ``client_port`` the peer's port (one port per TCP connection), ``status`` what
    the server answered."""

    path: str
    body: Any
    headers: dict[str, str]
    client_port: int
    status: int


@dataclass(frozen=True, slots=True)
class _Forced:
    status: int
    retry_after: float | None
    body: str


@dataclass
class _State:
    """Everything handler threads share, behind one lock."""

    source: Callable[[dict[str, Any]], ReplyLike]
    model: str | None
    delay: float
    lock: threading.Lock = field(default_factory=threading.Lock)
    forced: deque[_Forced] = field(default_factory=deque)
    requests: list[ReceivedRequest] = field(default_factory=list)
    connections: set[socket.socket] = field(default_factory=set)
    ids: itertools.count[int] = field(default_factory=lambda: itertools.count(1))


class ModelServer:
    """Serves ``POST /v1/chat/completions`` from ``reply``.

    ``reply`` is one :data:`ReplyLike` given to every request, a list of them served in
    order (a request past the end gets HTTP 500 saying the script ran out), or a
    :data:`Responder` called with each request body. Streaming requests (``"stream": true``)
    get server-sent events: the content in whitespace-led pieces, tool calls in two
    fragments each, the finish reason, then (with ``stream_options.include_usage``) a last
    chunk carrying the usage, then ``[DONE]``. Usage counts whitespace-separated words of
    the prompt's text contents and of the answer (tool calls: name plus arguments), the
    same whether streamed or not.

    ``delay`` (seconds) is slept before each answer, as inference time. ``model`` is the
    model name answered; by default the requested one is echoed. :meth:`fail_next` queues
    error statuses answered before any reply. Every request is kept in :attr:`requests`.
    """

    def __init__(
        self,
        reply: ReplyLike | Sequence[ReplyLike] | Responder = "ok",
        *,
        delay: float = 0.0,
        model: str | None = None,
        port: int = 0,
    ) -> None:
        self._state = _State(_source(reply), model, delay)
        self._want_port = port
        self._httpd: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._port: int | None = None

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> Self:
        if self._httpd is not None:
            raise RuntimeError("the model server is already running")
        httpd = _Server(("127.0.0.1", self._want_port), _handler(self._state))
        self._httpd = httpd
        self._port = int(httpd.server_address[1])
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving and drop every kept-alive connection, so no handler thread lingers
        waiting for a client's next request."""
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        httpd.shutdown()
        with self._state.lock:
            connections = list(self._state.connections)
        for conn in connections:
            with contextlib.suppress(OSError):  # the client closed it first
                conn.shutdown(socket.SHUT_RDWR)
        httpd.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    # -- what tests use ------------------------------------------------------------------------

    @property
    def port(self) -> int:
        """The port it listens (or, once closed, listened) on."""
        if self._port is None:
            raise RuntimeError("the model server has not been started")
        return self._port

    @property
    def base_url(self) -> str:
        """What a provider's ``base_url`` takes: ends before ``/chat/completions``."""
        return f"http://127.0.0.1:{self.port}/v1"

    @property
    def url(self) -> str:
        return f"{self.base_url}/chat/completions"

    @property
    def model(self) -> str | None:
        """The model name every answer gives; ``None`` when it echoes the one asked for."""
        return self._state.model

    @property
    def requests(self) -> list[ReceivedRequest]:
        with self._state.lock:
            return list(self._state.requests)

    def fail_next(
        self, status: int, *, times: int = 1, retry_after: float | None = None, body: str = ""
    ) -> None:
        """Answer the next ``times`` requests with ``status`` (and ``Retry-After`` when
        given) instead of a reply; queued after any failures already waiting."""
        forced = _Forced(status, retry_after, body or f"forced HTTP {status}")
        with self._state.lock:
            self._state.forced.extend([forced] * times)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # socketserver's default backlog is 5: a client opening more connections at once than
    # that has the extra SYNs dropped and retried a second later.
    request_queue_size = 1024


def _source(reply: ReplyLike | Sequence[ReplyLike] | Responder) -> Responder:
    if isinstance(reply, str | Mapping | Reply):
        return lambda request: reply
    if callable(reply):
        return reply
    script = iter(list(reply))
    lock = threading.Lock()

    def next_reply(request: dict[str, Any]) -> ReplyLike:
        with lock:
            item = next(script, None)
        if item is None:
            raise LookupError("the scripted replies ran out")
        return item

    return next_reply


def _reply(value: ReplyLike) -> Reply:
    if isinstance(value, Reply):
        return value
    if isinstance(value, str):
        return Reply(value)
    return Reply(json.dumps(value))


def _words(text: Any) -> int:
    return len(text.split()) if isinstance(text, str) else 0


def _usage(request: dict[str, Any], reply: Reply, calls: list[dict[str, Any]]) -> dict[str, int]:
    prompt = sum(
        _words(m.get("content")) for m in request.get("messages") or () if isinstance(m, dict)
    )
    completion = _words(reply.content) + sum(1 + _words(c["function"]["arguments"]) for c in calls)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
    }


def _pieces(text: str) -> list[str]:
    """Whitespace-led words: they concatenate back to exactly ``text``."""
    pieces = re.findall(r"\s*\S+", text)
    tail = text[sum(map(len, pieces)) :]
    return [*pieces, tail] if tail else pieces


def _handler(state: _State) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: every answer has a length or is chunked
        # Headers and body go out in separate writes; with Nagle on, the body waits for the
        # client's delayed ACK of the headers, 40 ms on Linux, on every kept-alive answer.
        disable_nagle_algorithm = True

        def setup(self) -> None:
            super().setup()
            with state.lock:
                state.connections.add(self.connection)

        def finish(self) -> None:
            with state.lock:
                state.connections.discard(self.connection)
            super().finish()

        def log_message(self, format: str, *args: Any) -> None:
            pass  # tests read ModelServer.requests, not stderr

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            try:
                body = json.loads(raw)
            except ValueError:
                body = None
            status, send = self._answer(body)
            with state.lock:
                state.requests.append(
                    ReceivedRequest(
                        self.path, body, dict(self.headers), self.client_address[1], status
                    )
                )
            send()

        def _answer(self, body: Any) -> tuple[int, Callable[[], None]]:
            """The status, and what sends it (after the request is on record, so a test
            that saw the answer also sees the request)."""
            if self.path.rstrip("/") != "/v1/chat/completions":
                return 404, lambda: self._error(404, f"no route {self.path}")
            if not isinstance(body, dict):
                return 400, lambda: self._error(400, "the body is not a JSON object")
            with state.lock:
                forced = state.forced.popleft() if state.forced else None
            if state.delay:
                time.sleep(state.delay)
            if forced is not None:
                return forced.status, lambda: self._error(
                    forced.status, forced.body, forced.retry_after
                )
            try:
                reply = _reply(state.source(body))
            except Exception as exc:
                message = f"the reply failed: {type(exc).__name__}: {exc}"
                return 500, lambda: self._error(500, message)
            if body.get("stream"):
                return 200, lambda: self._stream(body, reply)
            return 200, lambda: self._complete(body, reply)

        def _error(self, status: int, message: str, retry_after: float | None = None) -> None:
            extra = {} if retry_after is None else {"Retry-After": f"{retry_after:g}"}
            self._send(status, {"error": {"message": message, "code": status}}, extra)

        def _send(self, status: int, payload: Any, extra: Mapping[str, str] | None = None) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            for name, value in (extra or {}).items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(data)

        def _meta(self, body: dict[str, Any]) -> dict[str, Any]:
            with state.lock:
                n = next(state.ids)
            return {
                "id": f"chatcmpl-{n}",
                "created": int(time.time()),
                "model": state.model or str(body.get("model") or "pantheon-test"),
            }

        def _complete(self, body: dict[str, Any], reply: Reply) -> None:
            calls = _tool_calls(reply)
            message: dict[str, Any] = {"role": "assistant", "content": reply.content}
            if calls:
                message["tool_calls"] = calls
            self._send(
                200,
                self._meta(body)
                | {
                    "object": "chat.completion",
                    "choices": [{"index": 0, "message": message, "finish_reason": _finish(reply)}],
                    "usage": _usage(body, reply, calls),
                },
            )

        def _stream(self, body: dict[str, Any], reply: Reply) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            meta = self._meta(body) | {"object": "chat.completion.chunk"}
            calls = _tool_calls(reply)

            def event(delta: dict[str, Any], finish: str | None = None) -> None:
                choice = {"index": 0, "delta": delta, "finish_reason": finish}
                self._chunk(meta | {"choices": [choice]})

            event({"role": "assistant", "content": ""})
            for piece in _pieces(reply.content or ""):
                event({"content": piece})
            for i, call in enumerate(calls):
                arguments = call["function"]["arguments"]
                half = len(arguments) // 2
                head = {"name": call["function"]["name"], "arguments": arguments[:half]}
                event({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                       "function": head}]})  # fmt: skip
                event({"tool_calls": [{"index": i, "function": {"arguments": arguments[half:]}}]})
            event({}, _finish(reply))
            if (body.get("stream_options") or {}).get("include_usage"):
                self._chunk(meta | {"choices": [], "usage": _usage(body, reply, calls)})
            self._chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

        def _chunk(self, payload: Any) -> None:
            text = payload if isinstance(payload, str) else json.dumps(payload)
            data = f"data: {text}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

    return Handler


def _tool_calls(reply: Reply) -> list[dict[str, Any]]:
    calls = []
    for i, call in enumerate(reply.tool_calls):
        arguments = call.get("arguments", {})
        calls.append(
            {
                "id": str(call.get("id") or f"call_{i}"),
                "type": "function",
                "function": {
                    "name": str(call["name"]),
                    "arguments": arguments if isinstance(arguments, str) else json.dumps(arguments),
                },
            }
        )
    return calls


def _finish(reply: Reply) -> str:
    return reply.finish_reason or ("tool_calls" if reply.tool_calls else "stop")


#: Words that point to each intent, strongest evidence first within a tie.
_KEYWORDS = {
    "spam": ("unsubscribe", "prize", "winner", "lottery", "crypto", "bitcoin", "http", "offer"),
    "outage": ("outage", "down", "unreachable", "unavailable", "502", "503", "urgent", "asap"),
    "bug": ("bug", "error", "crash", "crashes", "broken", "glitch", "exception", "reproduce"),
    "refund": ("refund", "charged", "billed", "reimburse", "money", "cancel", "return"),
    "complaint": ("disappointed", "terrible", "unacceptable", "awful", "complaint", "worst"),
    "question": ("how", "what", "where", "when", "which", "question", "wondering", "?"),
}


def classify_reply(request: dict[str, Any]) -> dict[str, Any]:
    """Answers the support desk's classification question (``support.intents.classify``)
    with a keyword count over the last user message: ``{"intent", "confidence"}``. Crude on
    purpose: enough for a whole team to run against the server, not a model of anything."""
    text = ""
    for message in reversed(request.get("messages") or ()):
        if isinstance(message, dict) and message.get("role") == "user":
            text = str(message.get("content") or "").lower()
            break
    words = re.findall(r"[a-z0-9]+|\?", text)
    counts = {intent: sum(words.count(k) for k in keys) for intent, keys in _KEYWORDS.items()}
    total = sum(counts.values())
    if not total:
        return {"intent": "question", "confidence": 0.3}
    intent = max(counts, key=lambda k: counts[k])
    return {"intent": intent, "confidence": round(0.5 + counts[intent] / total / 2, 4)}


def schema_reply(request: dict[str, Any]) -> ReplyLike:
    """Answers any request in the shape it asks for, offline: with a JSON schema, the
    smallest instance of it (first enum value, 0, false, a string quoting the question);
    with JSON mode, ``{"text": ...}``; else the last user message echoed. A stand-in model
    for trying a team's wiring, tokens and replays without a real one."""
    text = ""
    for message in reversed(request.get("messages") or ()):
        if isinstance(message, dict) and message.get("role") == "user":
            text = str(message.get("content") or "")
            break
    first = " ".join(text.split()[:12])
    fmt = request.get("response_format") or {}
    if fmt.get("type") == "json_schema":
        schema = (fmt.get("json_schema") or {}).get("schema") or {}
        return _instance(schema, first)
    if fmt.get("type") == "json_object":
        return {"text": first}
    return f"You wrote: {first}"


def _instance(schema: Mapping[str, Any], text: str) -> Any:
    if schema.get("enum"):
        return schema["enum"][0]
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if kind == "object":
        props = schema.get("properties") or {}
        return {name: _instance(sub, text) for name, sub in props.items()}
    if kind == "array":
        return [_instance(schema.get("items") or {}, text)]
    if kind == "integer":
        return int(schema.get("minimum", 0))
    if kind == "number":
        return float(schema.get("minimum", 0.0))
    if kind == "boolean":
        return False
    if kind == "null":
        return None
    return text
