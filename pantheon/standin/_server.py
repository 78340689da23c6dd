"""A real model server on 127.0.0.1 speaking both the OpenAI chat-completions protocol and
Anthropic's Messages protocol, for tests and benchmarks of providers.

Real sockets rather than a mocked transport, because what breaks against a model server is
mostly on the wire: keep-alive and connection reuse, retry timing against ``Retry-After``,
server-sent events split across reads, a refused connection. The server runs
``http.server.ThreadingHTTPServer`` (HTTP/1.1, keep-alive) on a free port in a background
thread, so the event loop under test is never blocked by it::

    with ModelServer(reply=classify_reply, delay=0.001) as server:
        provider = OpenAIProvider(server.base_url, model="local")
        ...
        assert len(server.requests) == 1

The same replies answer both protocols: a Messages request is shown to the reply source in
the chat-completions shape (:func:`openai_view`), so one script drives a team whichever
provider it runs on.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import re
import socket
import sysconfig
import threading
import time
import traceback
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Self

__all__ = [
    "ModelServer",
    "ReceivedRequest",
    "Reply",
    "classify_reply",
    "openai_view",
    "schema_reply",
]


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
    """Serves ``POST /v1/chat/completions`` (OpenAI) and ``POST /v1/messages`` (Anthropic)
    from ``reply``.

    ``reply`` is one :data:`ReplyLike` given to every request, a list of them served in
    order (a request past the end gets HTTP 500 saying the script ran out), or a
    :data:`Responder` called with each request body. Streaming requests (``"stream": true``)
    get server-sent events: the content in whitespace-led pieces, tool calls in two
    fragments each (parallel calls interleaved: every first fragment, then every second),
    the finish reason, then (with ``stream_options.include_usage``) a last
    chunk carrying the usage, then ``[DONE]``. Usage counts whitespace-separated words of
    the prompt's text contents and of the answer (tool calls: name plus arguments), the
    same whether streamed or not.

    A Messages request is answered from the same source, which sees it as
    :func:`openai_view` gives it (system prompt, ``tool_use``/``tool_result`` blocks and
    ``output_config.format`` turned into their chat-completions equivalents); the answer is
    a Message with a text block and ``tool_use`` blocks, or with ``"stream": true`` the
    Messages events: ``message_start``, per block ``content_block_start``, its deltas
    (``text_delta`` pieces, ``input_json_delta`` halves) and ``content_block_stop``, then
    ``message_delta`` with the stop reason and usage, then ``message_stop``.

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
    def anthropic_base_url(self) -> str:
        """What an Anthropic client's ``base_url`` takes: the root, before ``/v1/messages``."""
        return f"http://127.0.0.1:{self.port}"

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
            route = self.path.rstrip("/")
            anthropic = route == "/v1/messages"
            error = functools.partial(self._error, anthropic=anthropic)
            if not anthropic and route != "/v1/chat/completions":
                return 404, lambda: self._error(404, f"no route {self.path}")
            if not isinstance(body, dict):
                return 400, lambda: error(400, "the body is not a JSON object")
            with state.lock:
                forced = state.forced.popleft() if state.forced else None
            if state.delay:
                time.sleep(state.delay)
            if forced is not None:
                return forced.status, lambda: error(forced.status, forced.body, forced.retry_after)
            try:
                view = openai_view(body) if anthropic else body
                reply = _reply(state.source(view))
            except Exception as exc:
                # Where in the reply function: the 500 is all the caller ever sees of it.
                # The same request fails the same way again, so no client should retry it
                # (``x-should-retry``, which the OpenAI and Anthropic clients honour too).
                frame = _user_frame(exc)
                message = (
                    f"the reply failed: {type(exc).__name__}: {exc} "
                    f"(at {frame.filename}:{frame.lineno}, in {frame.name})"
                )
                return 500, lambda: error(500, message, should_retry=False)
            if anthropic:
                send = self._message_stream if body.get("stream") else self._message
                return 200, lambda: send(body, view, reply)
            if body.get("stream"):
                return 200, lambda: self._stream(body, reply)
            return 200, lambda: self._complete(body, reply)

        def _error(
            self,
            status: int,
            message: str,
            retry_after: float | None = None,
            *,
            should_retry: bool = True,
            anthropic: bool = False,
        ) -> None:
            """An error in the shape each API's clients read: OpenAI's or Anthropic's."""
            extra = _retry_headers(retry_after, should_retry)
            if anthropic:
                kind = _ANTHROPIC_ERRORS.get(status, "api_error")
                error = {"type": kind, "message": message}
                body: dict[str, Any] = {"type": "error", "error": error}
            else:
                body = {"error": {"message": message, "code": status}}
            self._send(status, body, extra)

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
            # Parallel calls interleave: every call's first fragment (id, name, half the
            # arguments), then every call's second, so a client must join them by index,
            # not by arrival.
            halves = [len(c["function"]["arguments"]) // 2 for c in calls]
            for i, call in enumerate(calls):
                head = {
                    "name": call["function"]["name"],
                    "arguments": call["function"]["arguments"][: halves[i]],
                }
                event(
                    {
                        "tool_calls": [
                            {"index": i, "id": call["id"], "type": "function", "function": head}
                        ]
                    }
                )
            for i, call in enumerate(calls):
                tail = {"arguments": call["function"]["arguments"][halves[i] :]}
                event({"tool_calls": [{"index": i, "function": tail}]})
            event({}, _finish(reply))
            if (body.get("stream_options") or {}).get("include_usage"):
                self._chunk(meta | {"choices": [], "usage": _usage(body, reply, calls)})
            self._chunk("[DONE]")
            self.wfile.write(b"0\r\n\r\n")

        def _chunk(self, payload: Any, event: str | None = None) -> None:
            text = payload if isinstance(payload, str) else json.dumps(payload)
            named = f"event: {event}\n" if event else ""
            data = f"{named}data: {text}\n\n".encode()
            self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
            self.wfile.flush()

        # -- Anthropic Messages ------------------------------------------------------------

        def _message_meta(self, body: dict[str, Any]) -> dict[str, Any]:
            with state.lock:
                n = next(state.ids)
            return {
                "id": f"msg_{n:024d}",
                "type": "message",
                "role": "assistant",
                "model": state.model or str(body.get("model") or "pantheon-test"),
            }

        def _message(self, body: dict[str, Any], view: dict[str, Any], reply: Reply) -> None:
            blocks = _blocks(reply)
            self._send(
                200,
                self._message_meta(body)
                | {
                    "content": blocks,
                    "stop_reason": _stop_reason(reply),
                    "stop_sequence": None,
                    "usage": _message_usage(view, reply),
                },
            )

        def _message_stream(self, body: dict[str, Any], view: dict[str, Any], reply: Reply) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            usage = _message_usage(view, reply)

            def event(kind: str, data: dict[str, Any]) -> None:
                self._chunk({"type": kind, **data}, kind)

            start = self._message_meta(body) | {
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": usage["input_tokens"], "output_tokens": 1},
            }
            event("message_start", {"message": start})
            for index, block in enumerate(_blocks(reply)):
                if block["type"] == "text":
                    empty = {"type": "text", "text": ""}
                    event("content_block_start", {"index": index, "content_block": empty})
                    for piece in _pieces(block["text"]):
                        delta = {"type": "text_delta", "text": piece}
                        event("content_block_delta", {"index": index, "delta": delta})
                else:
                    head = {**block, "input": {}}
                    event("content_block_start", {"index": index, "content_block": head})
                    arguments = json.dumps(block["input"])
                    half = len(arguments) // 2
                    for part in (arguments[:half], arguments[half:]):
                        delta = {"type": "input_json_delta", "partial_json": part}
                        event("content_block_delta", {"index": index, "delta": delta})
                event("content_block_stop", {"index": index})
            event(
                "message_delta",
                {
                    "delta": {"stop_reason": _stop_reason(reply), "stop_sequence": None},
                    "usage": {"output_tokens": usage["output_tokens"]},
                },
            )
            event("message_stop", {})
            self.wfile.write(b"0\r\n\r\n")

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


#: The Messages API's error ``type`` for each status the server may answer.
_ANTHROPIC_ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}

#: A chat-completions finish reason -> the Messages stop reason that means the same.
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


def _stop_reason(reply: Reply) -> str:
    finish = _finish(reply)
    return _STOP_REASONS.get(finish, finish)


def _blocks(reply: Reply) -> list[dict[str, Any]]:
    """The Message content of a reply: a text block (when there is text) and a ``tool_use``
    block per call, its ``input`` the decoded arguments (a string that is not JSON is sent
    as it is, so a test can send a malformed call)."""
    blocks: list[dict[str, Any]] = []
    if reply.content:
        blocks.append({"type": "text", "text": reply.content})
    for i, call in enumerate(reply.tool_calls):
        arguments = call.get("arguments", {})
        if isinstance(arguments, str):
            with contextlib.suppress(ValueError):
                arguments = json.loads(arguments)
        blocks.append(
            {
                "type": "tool_use",
                "id": str(call.get("id") or f"toolu_{i}"),
                "name": str(call["name"]),
                "input": arguments,
            }
        )
    return blocks


def _message_usage(view: dict[str, Any], reply: Reply) -> dict[str, int]:
    """The Messages usage: the same word counts as the chat-completions one."""
    counted = _usage(view, reply, _tool_calls(reply))
    return {"input_tokens": counted["prompt_tokens"], "output_tokens": counted["completion_tokens"]}


def _text(content: Any) -> str:
    """The text of a Messages ``content``: a string, or the text of its text blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(b.get("text", ""))
            for b in content
            if isinstance(b, dict) and b.get("type") == "text"
        )
    return ""


def openai_view(body: Mapping[str, Any]) -> dict[str, Any]:
    """A Messages request as the chat-completions request that asks the same, which is what
    a reply source is given: ``system`` becomes the first message, an assistant's
    ``tool_use`` blocks its ``tool_calls``, a user's ``tool_result`` blocks ``tool``
    messages, ``tools`` function tools (``input_schema`` their ``parameters``) and
    ``output_config.format`` a ``response_format``."""
    messages: list[dict[str, Any]] = []
    system = _text(body.get("system"))
    if system:
        messages.append({"role": "system", "content": system})
    for message in body.get("messages") or ():
        if not isinstance(message, dict):
            continue
        role, content = message.get("role"), message.get("content")
        blocks = content if isinstance(content, list) else []
        blocks = [b for b in blocks if isinstance(b, dict)]
        if role == "assistant":
            out: dict[str, Any] = {"role": "assistant", "content": _text(content) or None}
            calls = [
                {
                    "id": b.get("id"),
                    "type": "function",
                    "function": {"name": b.get("name"), "arguments": json.dumps(b.get("input"))},
                }
                for b in blocks
                if b.get("type") == "tool_use"
            ]
            if calls:
                out["tool_calls"] = calls
            messages.append(out)
            continue
        for b in blocks:
            if b.get("type") == "tool_result":
                result = b.get("content")
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": b.get("tool_use_id"),
                        "content": result if isinstance(result, str) else _text(result),
                    }
                )
        text = _text(content)
        if text or not blocks:
            messages.append({"role": str(role), "content": text})
    view: dict[str, Any] = {"model": body.get("model"), "messages": messages}
    for key in ("max_tokens", "temperature", "stream"):
        if key in body:
            view[key] = body[key]
    tools = [
        {
            "type": "function",
            "function": {
                "name": t.get("name"),
                "description": t.get("description", ""),
                "parameters": t.get("input_schema") or {},
            },
        }
        for t in body.get("tools") or ()
        if isinstance(t, dict)
    ]
    if tools:
        view["tools"] = tools
    fmt = (body.get("output_config") or {}).get("format")
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        view["response_format"] = {
            "type": "json_schema",
            "json_schema": {"name": "output", "schema": fmt.get("schema") or {}},
        }
    return view


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


def _retry_headers(retry_after: float | None, should_retry: bool) -> dict[str, str]:
    """An error's headers: when to come back, or not to (``x-should-retry: false``)."""
    headers = {} if retry_after is None else {"Retry-After": f"{retry_after:g}"}
    if not should_retry:
        headers["x-should-retry"] = "false"
    return headers


#: Where Python's own modules and installed packages live: not where a reply went wrong.
_LIBRARY_DIRS = tuple(
    {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    | {str(Path(__file__).resolve().parents[1])}  # pantheon itself
)


def _user_frame(exc: BaseException) -> traceback.FrameSummary:
    """The innermost frame of the reply function's own code (a ``json.loads`` that failed
    inside it names the reply's line, not ``json/decoder.py``); the innermost of all when
    every frame is a library's."""
    frames = traceback.extract_tb(exc.__traceback__)
    own = [f for f in frames if not str(Path(f.filename).resolve()).startswith(_LIBRARY_DIRS)]
    return (own or frames)[-1]
