"""The OpenAI-compatible provider against a real local HTTP server (no mock objects)."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from agents import OpenAIProvider, ProviderError


class _Server:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.reply: tuple[int, Any] = (200, {})
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                server.requests.append({"path": self.path, **json.loads(self.rfile.read(length))})
                server.headers.append(dict(self.headers))
                status, body = server.reply
                data = body if isinstance(body, bytes) else json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def answer(self, content: str) -> None:
        self.reply = (200, {"choices": [{"message": {"role": "assistant", "content": content}}]})


@pytest.fixture
def server() -> Iterator[_Server]:
    s = _Server()
    s.thread.start()
    yield s
    s.httpd.shutdown()
    s.httpd.server_close()


async def test_classifies_through_chat_completions(server: _Server) -> None:
    server.answer('```json\n{"intent": "Refund", "confidence": 0.82}\n```')
    provider = OpenAIProvider(server.url, model="local-model", api_key="sk-test")
    verdict = await provider.classify("Refund please", "ORD-1 was broken")
    assert verdict == {"intent": "refund", "confidence": 0.82, "scores": {"refund": 0.82}}
    [req] = server.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["model"] == "local-model" and req["temperature"] == 0
    assert req["messages"][1]["content"] == "Subject: Refund please\n\nORD-1 was broken"
    assert server.headers[0]["Authorization"] == "Bearer sk-test"


async def test_base_url_from_environment(server: _Server, monkeypatch: pytest.MonkeyPatch) -> None:
    server.answer('{"intent": "spam", "confidence": 1.7}')
    monkeypatch.setenv("OPENAI_BASE_URL", server.url)
    verdict = await OpenAIProvider().classify("win", "lottery")
    assert verdict["intent"] == "spam" and verdict["confidence"] == 1.0  # clamped
    assert "Authorization" not in server.headers[0]


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        ((500, b"boom"), "answered HTTP 500: boom"),
        ((200, {"choices": []}), "unusable answer"),
        ((200, {"choices": [{"message": {"content": '{"intent": "poetry"}'}}]}), "unknown intent"),
    ],
)
async def test_bad_answers_raise_provider_error(
    server: _Server, reply: tuple[int, Any], message: str
) -> None:
    server.reply = reply
    with pytest.raises(ProviderError, match=message):
        await OpenAIProvider(server.url).classify("s", "b")


async def test_unreachable_server_is_a_provider_error() -> None:
    with pytest.raises(ProviderError, match=r"127\.0\.0\.1:9"):
        await OpenAIProvider("http://127.0.0.1:9/v1", timeout=2).classify("s", "b")


def test_missing_base_url_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ProviderError, match="OPENAI_BASE_URL"):
        OpenAIProvider()
