"""The OpenAI-compatible provider over real sockets, against :class:`pantheon.testing.ModelServer`:
usage, JSON modes, tool calls, streaming, retries, unreachable servers, connection reuse, and
:meth:`agents.Agent.chat` recorded in a session and replayed without a single request."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.intents import ACTION_FOR_INTENT, classify

from agents import (
    Agent,
    AgentUsage,
    ChatResult,
    OpenAIProvider,
    ProviderError,
    ProviderResponseError,
    ProviderUnavailable,
    Reasoner,
    ToolCall,
    Usage,
)
from bus import Bus, Envelope
from bus.testing import capture_events
from pantheon.rerun import replay_session
from pantheon.sessions import Recorder, SessionStore
from pantheon.testing import ModelServer, Reply, classify_reply

HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "parameters": {"type": "object", "properties": {"order": {"type": "string"}}},
    },
}


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer("Hello there, friend.") as s:
        yield s


def provider_for(server: ModelServer, **kwargs: Any) -> OpenAIProvider:
    """Retries fast enough for tests, unless a test says otherwise."""
    return OpenAIProvider(server.base_url, **{"model": "local", "backoff": 0.001} | kwargs)


def free_port() -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- answers -----------------------------------------------------------------------------------


async def test_plain_chat_reports_the_servers_usage(server: ModelServer) -> None:
    async with provider_for(server, api_key="sk-local") as provider:
        result = await provider.chat(HELLO, temperature=0.2, max_tokens=50)
    assert result == ChatResult(
        content="Hello there, friend.",
        usage=Usage(input_tokens=4, output_tokens=3),  # words: "Be brief." + "Say hello"
        model="local",
        finish_reason="stop",
    )
    [req] = server.requests
    assert req.body == {"model": "local", "messages": HELLO, "temperature": 0.2, "max_tokens": 50}
    assert req.headers["Authorization"] == "Bearer sk-local"


@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "json_object"},
        {
            "type": "json_schema",
            "json_schema": {
                "name": "answer",
                "schema": {"type": "object", "properties": {"n": {"type": "integer"}}},
            },
        },
    ],
)
async def test_json_output_is_parsed_into_data(response_format: dict[str, Any]) -> None:
    with ModelServer({"n": 3, "why": ["a", "b"]}) as s:
        async with provider_for(s) as provider:
            result = await provider.chat(HELLO, response_format=response_format)
        assert result.data == {"n": 3, "why": ["a", "b"]}
        assert s.requests[0].body["response_format"] == response_format


async def test_fenced_json_is_accepted() -> None:
    with ModelServer('```json\n{"ok": true}\n```') as s:
        async with provider_for(s) as provider:
            result = await provider.chat(HELLO, response_format={"type": "json_object"})
    assert result.data == {"ok": True}


async def test_prose_when_json_was_asked_is_a_response_error() -> None:
    with ModelServer("Sure! Here is your JSON: none") as s:
        async with provider_for(s) as provider:
            with pytest.raises(ProviderResponseError, match="not JSON") as caught:
                await provider.chat(HELLO, response_format={"type": "json_object"})
        assert s.url in str(caught.value) and caught.value.url == s.url
        assert len(s.requests) == 1  # a bad answer is not retried


async def test_tool_calls_are_parsed_and_tools_sent() -> None:
    reply = Reply(
        tool_calls=[
            {"id": "call_a", "name": "lookup_order", "arguments": {"order": "ORD-1"}},
            {"id": "call_b", "name": "lookup_order", "arguments": {"order": "ORD-2"}},
        ]
    )
    with ModelServer(reply) as s:
        async with provider_for(s) as provider:
            result = await provider.chat(HELLO, tools=[LOOKUP_TOOL])
        assert s.requests[0].body["tools"] == [LOOKUP_TOOL]
    assert result.content is None and result.finish_reason == "tool_calls"
    assert result.tool_calls == (
        ToolCall("call_a", "lookup_order", {"order": "ORD-1"}),
        ToolCall("call_b", "lookup_order", {"order": "ORD-2"}),
    )


async def test_tool_arguments_that_are_not_json_are_a_response_error() -> None:
    with ModelServer(Reply(tool_calls=[{"name": "lookup_order", "arguments": "{order: ORD"}])) as s:
        async with provider_for(s) as provider:
            with pytest.raises(ProviderResponseError, match="'lookup_order' with arguments"):
                await provider.chat(HELLO, tools=[LOOKUP_TOOL])


# -- streaming ---------------------------------------------------------------------------------


async def test_streaming_hands_out_tokens_in_order_and_returns_the_same_result() -> None:
    text = "The quick  brown fox\njumps over the lazy dog."
    with ModelServer(text) as s:
        async with provider_for(s) as provider:
            whole = await provider.chat(HELLO)
            tokens: list[str] = []
            streamed = await provider.chat(HELLO, stream=True, on_token=tokens.append)
        stream_request = s.requests[1].body
    assert tokens == ["The", " quick", "  brown", " fox", "\njumps", " over", " the", " lazy",
                      " dog."]  # fmt: skip
    assert streamed == whole
    assert streamed.usage == Usage(4, 9) and streamed.content == text
    assert stream_request["stream"] is True
    assert stream_request["stream_options"] == {"include_usage": True}


async def test_streamed_tool_call_fragments_are_joined() -> None:
    reply = Reply(
        tool_calls=[
            {"id": "c1", "name": "lookup_order", "arguments": {"order": "ORD-123456"}},
            {"id": "c2", "name": "refund", "arguments": {"amount": 12.5, "currency": "EUR"}},
        ]
    )
    with ModelServer(reply) as s:
        async with provider_for(s) as provider:
            whole = await provider.chat(HELLO, tools=[LOOKUP_TOOL])
            streamed = await provider.chat(HELLO, tools=[LOOKUP_TOOL], stream=True)
    assert streamed == whole
    assert streamed.tool_calls[1] == ToolCall("c2", "refund", {"amount": 12.5, "currency": "EUR"})


async def test_parallel_tool_calls_stream_interleaved_and_round_trip() -> None:
    """Two calls in one assistant turn, their fragments interleaved on the wire (every
    call's id, name and first half of arguments, then every second half): joined by index,
    answered by two tool messages, and the final answer streamed."""

    def script(request: dict[str, Any]) -> Any:
        if request["messages"][-1]["role"] != "tool":
            return Reply(
                "Checking both.",
                tool_calls=[
                    {"id": "c1", "name": "lookup_order", "arguments": {"order": "ORD-1"}},
                    {"id": "c2", "name": "lookup_order", "arguments": {"order": "ORD-22"}},
                ],
            )
        amounts = {m["tool_call_id"]: float(m["content"]) for m in request["messages"][3:]}
        return f"Refund {amounts['c1'] + amounts['c2']:g} in total."

    with ModelServer(script) as s:
        async with provider_for(s) as provider:
            tokens: list[str] = []
            turn = await provider.chat(
                HELLO, tools=[LOOKUP_TOOL], stream=True, on_token=tokens.append
            )
            calls = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for c in turn.tool_calls
            ]  # fmt: skip
            answers = [
                {"role": "tool", "tool_call_id": "c2", "content": "40"},
                {"role": "tool", "tool_call_id": "c1", "content": "12.5"},
            ]
            final = await provider.chat(
                [*HELLO, {"role": "assistant", "content": turn.content, "tool_calls": calls},
                 *answers],
                tools=[LOOKUP_TOOL], stream=True, on_token=tokens.append,
            )  # fmt: skip
        first, second = (r.body for r in s.requests)
    assert turn.tool_calls == (
        ToolCall("c1", "lookup_order", {"order": "ORD-1"}),
        ToolCall("c2", "lookup_order", {"order": "ORD-22"}),
    )
    assert turn.content == "Checking both." and turn.finish_reason == "tool_calls"
    assert first["stream"] is True and second["stream"] is True
    assert second["messages"][2]["tool_calls"] == calls
    assert final.content == "Refund 52.5 in total." and final.finish_reason == "stop"
    assert "".join(tokens) == "Checking both.Refund 52.5 in total."
    assert final.usage.input_tokens > 0 and final.usage.output_tokens == 4


async def test_streamed_json_is_parsed_too() -> None:
    with ModelServer({"intent": "bug", "confidence": 0.9}) as s:
        async with provider_for(s) as provider:
            result = await provider.chat(
                HELLO, response_format={"type": "json_object"}, stream=True
            )
    assert result.data == {"intent": "bug", "confidence": 0.9}


# -- failures and retries ----------------------------------------------------------------------


async def test_429_with_retry_after_then_200_succeeds_with_two_requests(
    server: ModelServer,
) -> None:
    server.fail_next(429, retry_after=0.2)
    async with provider_for(server) as provider:
        started = time.monotonic()
        result = await provider.chat(HELLO)
        waited = time.monotonic() - started
    assert result.content == "Hello there, friend."
    assert [r.status for r in server.requests] == [429, 200]
    assert waited >= 0.2  # Retry-After honoured, not the 1 ms backoff


async def test_retry_after_is_capped_by_max_backoff(server: ModelServer) -> None:
    server.fail_next(503, retry_after=30)
    async with provider_for(server, max_backoff=0.05) as provider:
        started = time.monotonic()
        await provider.chat(HELLO)
        assert time.monotonic() - started < 5
    assert [r.status for r in server.requests] == [503, 200]


async def test_503_on_every_attempt_is_a_response_error_naming_url_and_status(
    server: ModelServer,
) -> None:
    server.fail_next(503, times=3, body="model is loading")
    async with provider_for(server, max_retries=2) as provider:
        with pytest.raises(ProviderResponseError) as caught:
            await provider.chat(HELLO)
    message = str(caught.value)
    assert server.url in message and "HTTP 503 after 3 attempts" in message
    assert "model is loading" in message
    assert caught.value.status == 503
    assert len(server.requests) == 3


async def test_a_client_error_status_is_not_retried(server: ModelServer) -> None:
    server.fail_next(400, times=5, body="unknown model 'local'")
    async with provider_for(server) as provider:
        with pytest.raises(ProviderResponseError, match=r"HTTP 400: .*unknown model") as caught:
            await provider.chat(HELLO)
    assert caught.value.status == 400 and len(server.requests) == 1


async def test_refused_connection_is_unavailable_naming_the_url_quickly() -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    provider = OpenAIProvider(url, max_retries=3, backoff=0.01)
    started = time.monotonic()
    with pytest.raises(ProviderUnavailable) as caught:
        await provider.chat(HELLO)
    elapsed = time.monotonic() - started
    await provider.aclose()
    assert str(caught.value).startswith(
        f"cannot reach model server at {url}/chat/completions: connection refused"
    )
    assert "(4 attempts)" in str(caught.value)
    assert elapsed < 1.0  # 0.01 + 0.02 + 0.04 s of backoff at most, plus four refusals


async def test_a_closed_provider_refuses_to_chat(server: ModelServer) -> None:
    provider = provider_for(server)
    await provider.chat(HELLO)
    await provider.aclose()
    with pytest.raises(ProviderError, match="closed"):
        await provider.chat(HELLO)


# -- connections -------------------------------------------------------------------------------


async def test_calls_reuse_one_kept_alive_connection(server: ModelServer) -> None:
    async with provider_for(server) as provider:
        for i in range(5):
            await provider.chat(HELLO, stream=i % 2 == 1)
    ports = {r.client_port for r in server.requests}
    assert len(server.requests) == 5 and len(ports) == 1


async def test_concurrent_calls_share_at_most_max_connections() -> None:
    with ModelServer("ok", delay=0.05) as s:
        async with provider_for(s, max_connections=2) as provider:
            await asyncio.gather(*(provider.chat(HELLO) for _ in range(6)))
        ports = {r.client_port for r in s.requests}
    assert len(s.requests) == 6 and len(ports) == 2


# -- through an agent --------------------------------------------------------------------------


class Asker(Agent):
    """Asks the model about each question and publishes the answer."""

    role = "asker"
    subscriptions = ("question.asked",)

    async def handle(self, env: Envelope) -> None:
        result = await self.chat(
            [{"role": "user", "content": env.payload["text"]}],
            response_format={"type": "json_object"},
        )
        await self.emit("question.answered", {"n": env.payload["n"], "result": result.to_dict()})


def answer(request: dict[str, Any]) -> dict[str, Any]:
    text = request["messages"][-1]["content"]
    return {"echo": text, "words": len(text.split())}


PRICES = {"local": (0.5, 2.0)}  # USD per million tokens in, out


async def test_agent_chat_replays_from_the_record_without_requests(tmp_path: Path) -> None:
    questions = [{"n": i, "text": "word " * (i + 1)} for i in range(3)]
    askers: list[Asker] = []

    def make_setup(server: ModelServer) -> Any:
        async def setup(bus: Bus) -> None:
            asker = Asker(provider=provider_for(server), prices=PRICES)
            askers.append(asker)
            await asker.attach(bus)

        return setup

    with ModelServer(answer) as server, SessionStore(tmp_path / "sessions.db") as store:
        recorder = Recorder(store, scenario="ask", scenario_text="ask", seed=1)
        async with Bus() as bus:
            recorder.attach(bus)
            await make_setup(server)(bus)
            with capture_events(bus, "question.answered") as answered:
                for q in questions:
                    await bus.emit("question.asked", q)
                await bus.drain()
        await recorder.finish("completed", {})
        live = {e.payload["n"]: ChatResult.from_dict(e.payload["result"]) for e in answered}
        assert len(server.requests) == 3
        assert [e.name for e in store.effects(recorder.session_id)] == ["model.openai.chat"] * 3

        report = await replay_session(store, recorder.session_id, make_setup(server))
        assert report.matched, report.divergence
        assert len(server.requests) == 3  # the replay asked nothing
        replayed = {
            e.payload["n"]: ChatResult.from_dict(e.payload["result"])
            for e in store.envelopes(report.new_session_id)
            if e.topic == "question.answered"
        }
    for asker in askers:
        assert asker.provider is not None
        await asker.provider.aclose()
    assert replayed == live
    assert live[2].data == {"echo": "word word word ", "words": 3}
    original, replay = askers
    assert replay.usage == original.usage
    assert original.usage == AgentUsage(
        calls=3, input_tokens=6, output_tokens=18, cost_usd=(6 * 0.5 + 18 * 2.0) / 1e6
    )


async def test_agent_usage_prices_only_known_models(server: ModelServer) -> None:
    async with provider_for(server) as provider:
        priced = Agent(provider=provider, prices=PRICES)
        await priced.chat(HELLO)
        await priced.chat(HELLO)
        unpriced = Agent(provider=provider, prices={"other-model": (1.0, 1.0)})
        await unpriced.chat(HELLO)
    assert priced.usage.as_dict() == {
        "calls": 2,
        "input_tokens": 8,
        "output_tokens": 6,
        "cost_usd": (8 * 0.5 + 6 * 2.0) / 1e6,
        "priced": True,
    }
    assert unpriced.usage.cost_usd == 0 and not unpriced.usage.priced
    assert unpriced.usage.total_tokens == 7


async def test_agent_without_a_provider_says_so() -> None:
    with pytest.raises(ProviderError, match="'lonely' has no model provider"):
        await Agent("lonely").chat(HELLO)
    with pytest.raises(TypeError, match="Reasoner needs a model provider"):
        Reasoner()


async def test_the_reasoner_counts_tokens_against_a_server() -> None:
    email = {"id": "e1", "from": "a@x.example", "subject": "Refund", "body": "I was charged"}
    with ModelServer(classify_reply) as s:
        async with provider_for(s) as provider, Bus() as bus:
            reasoner = Reasoner(
                provider=provider,
                settings={"question": classify, "actions": ACTION_FOR_INTENT},
            )
            await reasoner.attach(bus)

            @bus.on("memory.lookup", name="memory")
            async def memory(env: Envelope) -> dict[str, Any]:
                return {"count": 0, "complaints": 0}

            with capture_events(bus, "reasoning.intent.classified") as classified:
                await bus.emit("sensor.email.enriched", {"email": email, "features": {}})
                await bus.drain()
        [req] = s.requests
    [c] = classified
    assert c.payload["intent"] == "refund"
    words = sum(len(m["content"].split()) for m in req.body["messages"])
    assert reasoner.usage.calls == 1 and reasoner.usage.input_tokens == words
    assert reasoner.usage.output_tokens == 4  # {"intent": "refund", "confidence": 0.75}
