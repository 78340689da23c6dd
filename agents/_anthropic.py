"""Anthropic's Messages API behind the provider protocol, through the official ``anthropic`` SDK.

An agent speaks OpenAI-shaped chat messages whatever its model (see
:class:`agents.ModelProvider`), so this module is a translation both ways and nothing more:
system messages become the ``system`` prompt, an assistant's ``tool_calls`` its ``tool_use``
blocks, ``tool`` messages ``tool_result`` blocks in the next user turn, function tools
tools with an ``input_schema``, a JSON-schema ``response_format`` the request's
``output_config.format``; the Message comes back as a :class:`agents.ChatResult` with its
text, its tool calls (ids kept, inputs as JSON objects), its usage and its stop reason in the
chat-completions words (``stop``, ``length``, ``tool_calls``), so an agent written against
one provider runs unchanged on the other, and its record replays on either.

The SDK carries what would otherwise be hand-written here: the SSE parsing of a stream, the
assembly of ``input_json_delta`` fragments into tool inputs, retries with backoff that honour
``Retry-After``, connection pooling. It is an optional extra (``pip install
'pantheon[anthropic]'``), imported on first use, so ``import agents`` never loads it.
"""

from __future__ import annotations

import json
import os
import urllib.parse
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from agents._effects import genai_span
from agents._providers import (
    ChatResult,
    ProviderError,
    ProviderResponseError,
    ProviderUnavailable,
    ToolArgumentsNotJSON,
    ToolCall,
    Usage,
    _annotate,
    _excerpt,
    _Progress,
    _Provider,
    _strip_fence,
)

if TYPE_CHECKING:
    import anthropic

__all__ = ["AnthropicProvider"]

#: Where the Messages API is when neither ``base_url`` nor ``ANTHROPIC_BASE_URL`` says.
DEFAULT_BASE_URL = "https://api.anthropic.com"

#: A Messages stop reason -> the chat-completions finish reason that means the same; any
#: other (``refusal``, ``pause_turn``) is kept as it is.
FINISH_REASONS = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "tool_use": "tool_calls",
}

#: What a ``json_object`` response format becomes: the Messages API has no JSON mode, only
#: JSON schemas, so the model is told, and the answer parsed as the OpenAI provider does.
JSON_ONLY = "Answer with one JSON object and nothing else."


def _sdk() -> Any:
    try:
        import anthropic
    except ImportError as exc:
        raise ImportError(
            "the Anthropic provider needs the anthropic SDK: pip install 'pantheon[anthropic]'"
        ) from exc
    return anthropic


class AnthropicProvider(_Provider):
    """The Messages API (``POST {base_url}/v1/messages``) of Anthropic or any server speaking
    it (``base_url`` is the root, e.g. ``https://api.anthropic.com``).

    ``max_tokens`` is what a call may generate when it does not say (the API requires a
    bound); ``params`` are further request fields sent with every call (``top_k``,
    ``metadata``, ``stop_sequences``...), under the call's own arguments. One SDK client,
    made on first use and closed by :meth:`aclose`, pools up to ``max_connections``
    connections. ``timeout`` bounds a request, ``connect_timeout`` its connection.

    Retries are the SDK's: a refused connection, a timeout, 408, 409, 429 and 5xx are tried
    ``max_retries`` more times with exponential backoff (0.5 s doubling to 8 s, jittered),
    or after the server's ``Retry-After``. A stream that broke after its first piece is not
    retried (the caller has shown that text) and fails with how far it got.
    """

    name = "anthropic"

    def __init__(
        self,
        base_url: str | None = None,
        model: str = "claude-sonnet-4-5",
        api_key: str | None = None,
        timeout: float = 60.0,
        *,
        max_tokens: int = 1024,
        max_retries: int = 3,
        connect_timeout: float = 5.0,
        max_connections: int = 32,
        params: Mapping[str, Any] | None = None,
    ) -> None:
        if max_retries < 0:
            raise ValueError("max_retries must not be negative")
        if timeout <= 0 or connect_timeout <= 0 or max_connections < 1 or max_tokens < 1:
            raise ValueError("timeouts must be positive, max_connections and max_tokens at least 1")
        base = (base_url or os.environ.get("ANTHROPIC_BASE_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.base_url = base
        self.url = base + "/v1/messages"
        parts = urllib.parse.urlsplit(self.url)
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self.max_tokens = max_tokens
        self.max_retries = max_retries
        self.max_connections = max_connections
        self.params = dict(params or {})
        self._client: anthropic.AsyncAnthropic | None = None
        self._closed = False

    def _sdk_client(self) -> anthropic.AsyncAnthropic:
        if self._closed:
            raise ProviderError(f"the provider for {self.url} is closed")
        if self._client is None:
            sdk = _sdk()
            import httpx2  # the SDK's HTTP client, installed with it

            self._client = sdk.AsyncAnthropic(
                # A key given (even empty) keeps the SDK from looking for credentials of
                # its own in the environment and on disk: the scenario names its key. With
                # none, no Authorization header goes (an empty one is not legal HTTP).
                api_key=self.api_key or "",
                default_headers=None if self.api_key else {"Authorization": sdk.omit},
                base_url=self.base_url,
                timeout=sdk.Timeout(self.timeout, connect=self.connect_timeout),
                max_retries=self.max_retries,
                http_client=sdk.DefaultAsyncHttpxClient(
                    limits=httpx2.Limits(
                        max_connections=self.max_connections,
                        max_keepalive_connections=self.max_connections,
                    )
                ),
                # Pantheon's own span (``chat {model}``) describes the call; the SDK's
                # would be a second one for the same request.
                open_telemetry=False,
            )
        return self._client

    def request_identity(self) -> Any:
        """The server, the model and what every request carries (see
        :class:`agents.RequestIdentity`)."""
        return (self.url, self.model, self.max_tokens, self.params)

    async def check(self) -> None:
        """One ``GET {base_url}/v1/models`` without retries: any HTTP answer means the
        server is there (no tokens spent; a missing key is answered too)."""
        sdk = _sdk()
        client = self._sdk_client().with_options(max_retries=0, timeout=self.connect_timeout)
        try:
            await client.models.list()
        except sdk.APIStatusError:
            return
        except sdk.APIConnectionError as exc:
            raise ProviderUnavailable(
                f"cannot reach model server at {self.url}: {_reason(sdk, exc)}", url=self.url
            ) from None

    async def aclose(self) -> None:
        """Close the pooled connections. The provider cannot be used afterwards."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.close()

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        response_format: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
        temperature: float | None = None,
        max_tokens: int | None = None,
        stream: bool = False,
        on_token: Callable[[str], None] | None = None,
    ) -> ChatResult:
        system, turns = _messages(messages)
        request: dict[str, Any] = {
            "model": self.model,
            "max_tokens": max_tokens if max_tokens is not None else self.max_tokens,
            "messages": turns,
        }
        attributes: dict[str, Any] = {
            "gen_ai.provider.name": "anthropic",
            "gen_ai.request.model": self.model,
            "gen_ai.request.max_tokens": request["max_tokens"],
            "server.address": self._host,
            "server.port": self._port,
        }
        # Fields the SDK's signature does not name (temperature among them, in 2.x) go as
        # extra body fields; the call's own beat the provider's params.
        extra = dict(self.params)
        if temperature is not None:
            extra["temperature"] = attributes["gen_ai.request.temperature"] = float(temperature)
        kind = response_format.get("type") if response_format is not None else None
        if kind == "json_schema":
            spec = response_format.get("json_schema") if response_format else None
            schema = spec.get("schema") if isinstance(spec, Mapping) else None
            request["output_config"] = {
                "format": {"type": "json_schema", "schema": dict(schema or {})}
            }
        elif kind == "json_object":
            system = f"{system}\n\n{JSON_ONLY}" if system else JSON_ONLY
        if system:
            request["system"] = system
        if tools:
            request["tools"] = [_tool(t) for t in tools]
        extra = {k: v for k, v in extra.items() if k not in request}
        span = genai_span("chat", self.model, attributes, kind="client")
        json_wanted = kind in ("json_object", "json_schema")
        if span is None:
            result, _ = await self._send(request, extra, stream, on_token, json_wanted)
            return result
        with span as s:
            result, response_id = await self._send(request, extra, stream, on_token, json_wanted)
            _annotate(s, result, response_id)
            return result

    async def _send(
        self,
        request: dict[str, Any],
        extra: dict[str, Any],
        stream: bool,
        on_token: Callable[[str], None] | None,
        json_wanted: bool,
    ) -> tuple[ChatResult, str | None]:
        sdk = _sdk()
        import httpx2  # the SDK's HTTP client, installed with it

        client = self._sdk_client()
        progress = _Progress()
        try:
            if stream:
                async with client.messages.stream(**request, extra_body=extra or None) as events:
                    async for event in events:
                        if event.type == "text":
                            progress.tokens += 1
                            if on_token is not None:
                                on_token(event.text)
                    message = await events.get_final_message()
            else:
                message = await client.messages.create(**request, extra_body=extra or None)
        except sdk.APIStatusError as exc:
            raise ProviderResponseError(
                f"model server at {self.url} answered HTTP {exc.status_code}"
                f"{_after(self.max_retries, exc)}: {_excerpt(_error_text(exc))}",
                url=self.url,
                status=exc.status_code,
            ) from exc
        except (sdk.APIConnectionError, httpx2.TransportError) as exc:
            # The SDK wraps what fails while it sends and waits for the answer; a stream that
            # breaks while it is read raises the HTTP client's own error, and is not retried.
            if progress.tokens or isinstance(exc, httpx2.TransportError):
                raise ProviderUnavailable(
                    f"the stream from {self.url} broke after {progress.tokens} pieces: "
                    f"{_reason(sdk, exc)}",
                    url=self.url,
                ) from exc
            attempts = self.max_retries + 1
            raise ProviderUnavailable(
                f"cannot reach model server at {self.url}: {_reason(sdk, exc)} "
                f"({attempts} attempt{'s' if attempts > 1 else ''})",
                url=self.url,
            ) from exc
        except (sdk.AnthropicError, ValueError) as exc:
            # An answer or a stream event the SDK could not read (a malformed body, tool
            # input fragments that do not make JSON).
            raise ProviderResponseError(
                f"unusable answer from {self.url}: {_excerpt(str(exc))}", url=self.url
            ) from exc
        return self._result(message, json_wanted), getattr(message, "id", None)

    def _result(self, message: Any, json_wanted: bool) -> ChatResult:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for block in message.content or ():
            if block.type == "text":
                texts.append(block.text)
            elif block.type == "tool_use":
                if not isinstance(block.input, dict):
                    raise ToolArgumentsNotJSON(
                        f"{self.url} called tool {block.name!r} with an input that is not a "
                        f"JSON object: {_excerpt(str(block.input))}",
                        url=self.url,
                    )
                calls.append(ToolCall(str(block.id), str(block.name), dict(block.input)))
        content = "".join(texts) if texts or not calls else None
        stop = message.stop_reason
        result = ChatResult(
            content=content,
            tool_calls=tuple(calls),
            usage=_usage(message.usage),
            model=message.model or self.model,
            finish_reason=FINISH_REASONS.get(stop, stop) if stop is not None else None,
        )
        # A turn that calls tools is not the answer yet: text before the calls (Claude
        # often says what it is about to look up) is not the JSON asked for.
        if not json_wanted or calls:
            return result
        try:
            data = json.loads(_strip_fence(content or ""))
        except ValueError as exc:
            raise ProviderResponseError(
                f"JSON was asked of {self.url} but the answer is not JSON: "
                f"{_excerpt(content or '')}",
                url=self.url,
            ) from exc
        return ChatResult(
            result.content, data, result.tool_calls, result.usage, result.model,
            result.finish_reason,
        )  # fmt: skip


# -- translation -------------------------------------------------------------------------------


def _messages(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """The ``system`` prompt and the Messages turns that ask what OpenAI-shaped ``messages``
    ask. Consecutive messages of one role share a turn (the API alternates roles, and every
    ``tool_result`` answering an assistant turn must be in the user turn right after it)."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []

    def add(role: str, blocks: list[dict[str, Any]]) -> None:
        if turns and turns[-1]["role"] == role:
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": role, "content": blocks})

    for n, message in enumerate(messages):
        role = message.get("role")
        content = message.get("content")
        if role in ("system", "developer"):
            system.append(_plain(content, n))
        elif role == "user":
            add("user", _text_blocks(content, n))
        elif role == "assistant":
            blocks = _text_blocks(content, n)
            for call in message.get("tool_calls") or ():
                blocks.append(_tool_use(call, n))
            add("assistant", blocks)
        elif role == "tool":
            result = {"type": "tool_result", "tool_use_id": str(message.get("tool_call_id") or "")}
            text = _plain(content, n)
            if text:
                result["content"] = text
            add("user", [result])
        else:
            raise ProviderError(f"message {n}: role {role!r} has no Messages API equivalent")
    return "\n\n".join(s for s in system if s), turns


def _plain(content: Any, n: int) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(b["text"] for b in _text_blocks(content, n))


def _text_blocks(content: Any, n: int) -> list[dict[str, Any]]:
    if content is None or content == "":
        return []
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, Sequence):
        blocks = []
        for part in content:
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ProviderError(
                    f"message {n}: content part {kind!r} is not supported by the Anthropic "
                    "provider (text parts only)"
                )
            blocks.append({"type": "text", "text": str(part.get("text", ""))})
        return blocks
    raise ProviderError(f"message {n}: content is {type(content).__name__}, not text")


def _tool_use(call: Mapping[str, Any], n: int) -> dict[str, Any]:
    function = call.get("function") or {}
    raw = function.get("arguments")
    arguments: Any = raw
    if isinstance(raw, str):
        try:
            arguments = json.loads(raw) if raw else {}
        except ValueError:
            raise ProviderError(
                f"message {n}: tool call {function.get('name')!r} has arguments that are "
                f"not JSON: {_excerpt(raw)}"
            ) from None
    if not isinstance(arguments, Mapping | None):
        raise ProviderError(
            f"message {n}: tool call {function.get('name')!r} has arguments that are not a "
            f"JSON object: {_excerpt(str(raw))}"
        )
    return {
        "type": "tool_use",
        "id": str(call.get("id") or ""),
        "name": str(function.get("name") or ""),
        "input": dict(arguments or {}),
    }


def _tool(tool: Mapping[str, Any]) -> dict[str, Any]:
    function = tool.get("function")
    if tool.get("type", "function") != "function" or not isinstance(function, Mapping):
        raise ProviderError(f"only function tools can be given to the Anthropic provider: {tool}")
    out: dict[str, Any] = {
        "name": str(function.get("name")),
        "input_schema": dict(function.get("parameters") or {"type": "object", "properties": {}}),
    }
    if function.get("description"):
        out["description"] = str(function["description"])
    return out


def _usage(usage: Any) -> Usage:
    """Input counts what was read fresh plus what was written to and read from the prompt
    cache: the Messages API counts those three apart, and all of them are prompt."""
    if usage is None:
        return Usage()
    read = sum(
        getattr(usage, key, None) or 0
        for key in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    )
    return Usage(int(read), int(usage.output_tokens or 0))


def _after(max_retries: int, exc: Any) -> str:
    """How many times the SDK asked, as its retry rule decides: by status, unless the
    server said otherwise (``x-should-retry``, as the stand-in does for a reply that
    raised: it fails the same way again)."""
    status = exc.status_code
    response = getattr(exc, "response", None)
    said = response.headers.get("x-should-retry", "") if response is not None else ""
    retried = said.lower() == "true" or (
        said.lower() != "false" and (status in (408, 409, 429) or status >= 500)
    )
    return f" after {max_retries + 1} attempts" if retried and max_retries else ""


def _error_text(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if isinstance(body, Mapping):
        error = body.get("error")
        if isinstance(error, Mapping) and error.get("message"):
            return str(error["message"])
    return str(getattr(exc, "message", "") or exc)


def _reason(sdk: Any, exc: BaseException) -> str:
    if isinstance(exc, sdk.APITimeoutError):
        return "timed out"
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        cause = cause.__cause__ or cause.__context__
    return str(exc) or type(exc).__name__
