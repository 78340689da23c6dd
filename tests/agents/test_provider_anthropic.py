"""The Anthropic provider over real sockets, against :class:`pantheon.testing.ModelServer`
speaking the Messages protocol: the translation both ways (system prompt, ``tool_use`` and
``tool_result`` blocks, ``input_schema``, structured output), streaming, usage, the errors a
caller sees, and that ``import agents`` never loads the SDK."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest

from agents import (
    AnthropicProvider,
    ChatResult,
    ProviderError,
    ProviderResponseError,
    ProviderUnavailable,
    ToolCall,
    Usage,
)
from pantheon.testing import ModelServer, Reply, openai_view

HELLO = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hello"}]
LOOKUP_TOOL = {
    "type": "function",
    "function": {
        "name": "lookup_order",
        "description": "The order's refundable amount.",
        "parameters": {"type": "object", "properties": {"order": {"type": "string"}}},
    },
}
TWO_CALLS = Reply(
    tool_calls=[
        {"id": "toolu_a", "name": "lookup_order", "arguments": {"order": "ORD-1"}},
        {"id": "toolu_b", "name": "lookup_order", "arguments": {"order": "ORD-22", "n": [1, 2]}},
    ]
)


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer("Hello there, friend.") as s:
        yield s


def provider_for(server: ModelServer, **kwargs: Any) -> AnthropicProvider:
    return AnthropicProvider(server.anthropic_base_url, **{"model": "claude-test"} | kwargs)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- answers -----------------------------------------------------------------------------------


async def test_a_plain_answer_with_the_system_prompt_apart_and_the_usage_counted(
    server: ModelServer,
) -> None:
    async with provider_for(server, api_key="sk-ant-local", max_tokens=77) as provider:
        result = await provider.chat(HELLO, temperature=0.2)
    assert result == ChatResult(
        content="Hello there, friend.",
        usage=Usage(input_tokens=4, output_tokens=3),  # words: "Be brief." + "Say hello"
        model="claude-test",
        finish_reason="stop",  # end_turn, in the words every provider answers with
    )
    [req] = server.requests
    assert req.path == "/v1/messages"
    assert req.body == {
        "model": "claude-test",
        "max_tokens": 77,
        "system": "Be brief.",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "Say hello"}]}],
        "temperature": 0.2,
    }
    assert any("sk-ant-local" in value for value in req.headers.values())


async def test_without_a_key_no_credential_is_sent_or_looked_up(
    server: ModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The SDK would otherwise pick this up by itself: the scenario's named variable decides.
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-from-the-environment")
    async with provider_for(server) as provider:
        await provider.chat(HELLO)
    [req] = server.requests
    assert not any("sk-from-the-environment" in v for v in req.headers.values())
    assert "authorization" not in {k.lower() for k in req.headers}


async def test_params_go_with_every_call_under_the_calls_own_arguments(
    server: ModelServer,
) -> None:
    params = {"top_k": 5, "temperature": 0.9, "stop_sequences": ["END"]}
    async with provider_for(server, params=params) as provider:
        await provider.chat(HELLO)
        await provider.chat(HELLO, temperature=0.1, max_tokens=9)
    first, second = (r.body for r in server.requests)
    assert (first["top_k"], first["temperature"], first["stop_sequences"]) == (5, 0.9, ["END"])
    assert (second["temperature"], second["max_tokens"], second["top_k"]) == (0.1, 9, 5)


async def test_a_json_schema_is_sent_as_the_output_format_and_parsed() -> None:
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    with ModelServer({"n": 3}) as s:
        async with provider_for(s) as provider:
            result = await provider.chat(
                HELLO,
                response_format={
                    "type": "json_schema",
                    "json_schema": {"name": "a", "schema": schema},
                },
            )
            mode = await provider.chat(HELLO, response_format={"type": "json_object"})
        first, second = (r.body for r in s.requests)
    assert result.data == {"n": 3} and mode.data == {"n": 3}
    assert first["output_config"] == {"format": {"type": "json_schema", "schema": schema}}
    # No JSON mode in the Messages API: the model is told instead.
    assert second["system"] == "Be brief.\n\nAnswer with one JSON object and nothing else."


async def test_prose_when_json_was_asked_is_a_response_error(server: ModelServer) -> None:
    async with provider_for(server) as provider:
        with pytest.raises(ProviderResponseError, match=r"JSON was asked .* not JSON: Hello"):
            await provider.chat(HELLO, response_format={"type": "json_object"})


# -- tools -------------------------------------------------------------------------------------


async def test_a_tool_use_round_trip_keeps_ids_and_reaches_the_script_as_openai_messages() -> None:
    seen: list[dict[str, Any]] = []

    def script(request: dict[str, Any]) -> Any:
        seen.append(request)
        if request["messages"][-1]["role"] != "tool":
            return TWO_CALLS
        results = [m for m in request["messages"] if m["role"] == "tool"]
        return {"refunds": [json.loads(m["content"]) for m in results]}

    with ModelServer(script) as s:
        async with provider_for(s) as provider:
            first = await provider.chat(HELLO, tools=[LOOKUP_TOOL])
            calls = [
                {"id": c.id, "type": "function",
                 "function": {"name": c.name, "arguments": json.dumps(c.arguments)}}
                for c in first.tool_calls
            ]  # fmt: skip
            messages = [
                *HELLO,
                {"role": "assistant", "content": None, "tool_calls": calls},
                {"role": "tool", "tool_call_id": "toolu_a", "content": "12.5"},
                {"role": "tool", "tool_call_id": "toolu_b", "content": "40"},
            ]
            final = await provider.chat(
                messages, tools=[LOOKUP_TOOL], response_format={"type": "json_object"}
            )
        wire = [r.body for r in s.requests]
    assert first.content is None and first.finish_reason == "tool_calls"
    assert first.tool_calls == (
        ToolCall("toolu_a", "lookup_order", {"order": "ORD-1"}),
        ToolCall("toolu_b", "lookup_order", {"order": "ORD-22", "n": [1, 2]}),
    )
    assert final.data == {"refunds": [12.5, 40]} and final.finish_reason == "stop"
    # On the wire: Anthropic's shapes. The tool has an input_schema; the assistant's calls
    # are tool_use blocks and both results share the one user turn after them.
    assert wire[0]["tools"] == [
        {
            "name": "lookup_order",
            "description": "The order's refundable amount.",
            "input_schema": LOOKUP_TOOL["function"]["parameters"],
        }
    ]
    assert wire[1]["messages"][1:] == [
        {
            "role": "assistant",
            "content": [
                {"type": "tool_use", "id": "toolu_a", "name": "lookup_order",
                 "input": {"order": "ORD-1"}},
                {"type": "tool_use", "id": "toolu_b", "name": "lookup_order",
                 "input": {"order": "ORD-22", "n": [1, 2]}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "12.5"},
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": "40"},
            ],
        },
    ]  # fmt: skip
    # The script saw the same conversation in the chat-completions shape it is written for.
    assert [m["role"] for m in seen[1]["messages"]] == [
        "system", "user", "assistant", "tool", "tool"
    ]  # fmt: skip
    assert seen[1]["messages"][2]["tool_calls"][1]["id"] == "toolu_b"
    assert seen == [openai_view(body) for body in wire]
    assert seen[0]["tools"][0]["function"]["name"] == "lookup_order"


async def test_text_before_tool_calls_is_not_taken_for_the_json_answer() -> None:
    with ModelServer(Reply("Let me look both up.", tool_calls=TWO_CALLS.tool_calls)) as s:
        async with provider_for(s) as provider:
            turn = await provider.chat(
                HELLO, tools=[LOOKUP_TOOL], response_format={"type": "json_object"}
            )
    assert turn.content == "Let me look both up." and turn.data is None
    assert [c.id for c in turn.tool_calls] == ["toolu_a", "toolu_b"]


async def test_a_tool_input_that_is_not_an_object_is_a_response_error() -> None:
    with ModelServer(Reply(tool_calls=[{"name": "lookup_order", "arguments": "[1, 2]"}])) as s:
        async with provider_for(s) as provider:
            with pytest.raises(ProviderResponseError, match=r"'lookup_order' .* not a JSON object"):
                await provider.chat(HELLO, tools=[LOOKUP_TOOL])


async def test_messages_with_no_anthropic_equivalent_fail_before_any_request(
    server: ModelServer,
) -> None:
    async with provider_for(server) as provider:
        with pytest.raises(ProviderError, match="message 1: content part 'image_url'"):
            await provider.chat(
                [HELLO[0], {"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]
            )
        with pytest.raises(ProviderError, match="message 0: role 'critic'"):
            await provider.chat([{"role": "critic", "content": "no"}])
    assert server.requests == []


# -- streaming ---------------------------------------------------------------------------------


async def test_streaming_hands_out_text_in_order_and_returns_the_same_result() -> None:
    text = "The quick  brown fox\njumps over the lazy dog."
    with ModelServer(text) as s:
        async with provider_for(s) as provider:
            whole = await provider.chat(HELLO)
            tokens: list[str] = []
            streamed = await provider.chat(HELLO, stream=True, on_token=tokens.append)
        assert s.requests[1].body["stream"] is True
    assert tokens == ["The", " quick", "  brown", " fox", "\njumps", " over", " the", " lazy",
                      " dog."]  # fmt: skip
    assert streamed == whole
    assert streamed.usage == Usage(4, 9) and streamed.content == text


async def test_streamed_tool_inputs_are_assembled_from_their_json_fragments() -> None:
    with ModelServer(Reply("Looking both up.", tool_calls=TWO_CALLS.tool_calls)) as s:
        async with provider_for(s) as provider:
            whole = await provider.chat(HELLO, tools=[LOOKUP_TOOL])
            tokens: list[str] = []
            streamed = await provider.chat(
                HELLO, tools=[LOOKUP_TOOL], stream=True, on_token=tokens.append
            )
    assert streamed == whole
    assert "".join(tokens) == "Looking both up." == streamed.content
    assert streamed.tool_calls[1] == ToolCall(
        "toolu_b", "lookup_order", {"order": "ORD-22", "n": [1, 2]}
    )
    assert streamed.finish_reason == "tool_calls"
    assert streamed.usage.output_tokens == whole.usage.output_tokens > 0


# -- failures ----------------------------------------------------------------------------------


async def test_a_429_with_retry_after_is_retried_by_the_sdk(server: ModelServer) -> None:
    server.fail_next(429, retry_after=0.01)
    async with provider_for(server, max_retries=1) as provider:
        result = await provider.chat(HELLO)
    assert result.content == "Hello there, friend."
    assert [r.status for r in server.requests] == [429, 200]


async def test_an_error_status_is_a_response_error_naming_url_status_and_message(
    server: ModelServer,
) -> None:
    server.fail_next(400, body="max_tokens: too large")
    async with provider_for(server, max_retries=3) as provider:
        with pytest.raises(ProviderResponseError) as info:
            await provider.chat(HELLO)
    assert info.value.status == 400 and info.value.url == f"{server.anthropic_base_url}/v1/messages"
    assert "answered HTTP 400: max_tokens: too large" in str(info.value)
    assert len(server.requests) == 1  # a client error is not retried


async def test_a_stream_that_breaks_after_text_is_not_retried_and_says_how_far_it_got() -> None:
    """A server that sends the message's start and two pieces of text, then drops the
    connection: the caller has shown those pieces, so nothing is asked again."""
    requests = 0

    def event(kind: str, data: dict[str, Any]) -> bytes:
        text = f"event: {kind}\ndata: {json.dumps({'type': kind, **data})}\n\n".encode()
        return f"{len(text):x}\r\n".encode() + text + b"\r\n"

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal requests
        head = await reader.readuntil(b"\r\n\r\n")
        length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
        await reader.readexactly(length)
        requests += 1
        start = {"id": "msg_1", "type": "message", "role": "assistant", "model": "m",
                 "content": [], "stop_reason": None, "stop_sequence": None,
                 "usage": {"input_tokens": 3, "output_tokens": 1}}  # fmt: skip
        writer.write(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
            + event("message_start", {"message": start})
            + event("content_block_start", {"index": 0, "content_block": {"type": "text",
                                                                          "text": ""}})
            + b"".join(
                event("content_block_delta", {"index": 0,
                                              "delta": {"type": "text_delta", "text": piece}})
                for piece in ("Half", " an")
            )
        )  # fmt: skip
        await writer.drain()
        writer.transport.abort()

    server = await asyncio.start_server(answer, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    tokens: list[str] = []
    try:
        async with AnthropicProvider(f"http://127.0.0.1:{port}", model="m", max_retries=3) as p:
            with pytest.raises(ProviderUnavailable, match="broke after 2 pieces"):
                await p.chat(HELLO, stream=True, on_token=tokens.append)
    finally:
        server.close()
        await server.wait_closed()
    assert tokens == ["Half", " an"] and requests == 1


async def test_a_refused_connection_is_unavailable_naming_the_url() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with AnthropicProvider(url, model="claude-test", max_retries=0) as provider:
        with pytest.raises(ProviderUnavailable, match="connection refused") as info:
            await provider.chat(HELLO)
        with pytest.raises(ProviderUnavailable, match=f"cannot reach model server at {url}"):
            await provider.check()
    assert info.value.url == f"{url}/v1/messages"


async def test_check_passes_on_any_http_answer(server: ModelServer) -> None:
    async with provider_for(server) as provider:
        await provider.check()  # the stand-in answers GET with 501: the server is there
    assert server.requests == []  # a GET is not a chat, and is not kept


async def test_a_closed_provider_refuses_to_chat(server: ModelServer) -> None:
    provider = provider_for(server)
    await provider.chat(HELLO)
    await provider.aclose()
    with pytest.raises(ProviderError, match="is closed"):
        await provider.chat(HELLO)


# -- the SDK is an optional extra --------------------------------------------------------------


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )


def test_import_agents_does_not_import_the_sdk() -> None:
    done = run_python(
        """
        import sys, agents
        agents.AnthropicProvider("http://127.0.0.1:1", model="m")
        print(sorted(m for m in sys.modules if m.split(".")[0] in ("anthropic", "httpx2")))
        """
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_without_the_sdk_a_call_says_which_extra_to_install() -> None:
    done = run_python(
        """
        import asyncio, sys
        sys.modules["anthropic"] = None  # as if it were not installed
        from agents import AnthropicProvider
        asyncio.run(AnthropicProvider("http://127.0.0.1:1", model="m").chat([]))
        """
    )
    assert done.returncode == 1
    assert "ImportError: the Anthropic provider needs the anthropic SDK: " in done.stderr
    assert "pip install 'pantheon[anthropic]'" in done.stderr
