"""The provider interface: result values, the rule provider, and the support desk's question
(``support.intents.classify``) asked of any provider (the OpenAI one against a real local
server, no mock objects)."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from support.intents import INTENTS, classify

import agents
import pantheon.testing
from agents import (
    ChatResult,
    ModelProvider,
    OpenAIProvider,
    ProviderError,
    ProviderResponseError,
    RuleProvider,
    ToolCall,
    Usage,
)
from pantheon.testing import ModelServer

RULES = {
    "refund": [r"(?i)\brefund"],
    "spam": [r"(?i)\bwinner\b|\blottery\b"],
    "question": [r"(?i)\bhow\b"],
}


def test_public_surfaces_are_exactly_all() -> None:
    for module in (agents, pantheon.testing):
        public = {name for name in dir(module) if not name.startswith("_")}
        assert public == set(module.__all__), module.__name__


# -- values ------------------------------------------------------------------------------------


def test_usage_adds_and_totals() -> None:
    total = Usage(3, 4) + Usage(10, 1)
    assert total == Usage(13, 5) and total.total_tokens == 18
    assert Usage.from_dict(total.to_dict()) == total


def test_chat_result_round_trips_through_msgpack_as_plain_data() -> None:
    result = ChatResult(
        content='{"a": 1}',
        data={"a": 1, "nested": [1.5, None, True]},
        tool_calls=(ToolCall("call_1", "lookup", {"order": "ORD-1", "n": [1, 2]}),),
        usage=Usage(12, 7),
        model="m-2024",
        finish_reason="tool_calls",
    )
    stored = msgspec.msgpack.decode(msgspec.msgpack.encode(result.to_dict()))
    assert ChatResult.from_dict(stored) == result
    assert ChatResult.from_dict({"content": "x"}) == ChatResult("x")


# -- the rule provider -------------------------------------------------------------------------


async def test_rule_provider_chat_answers_json_without_tokens() -> None:
    provider = RuleProvider(RULES)
    assert isinstance(provider, ModelProvider)
    result = await provider.chat(
        [
            {"role": "system", "content": "classify"},
            {"role": "user", "content": "Subject: earlier\n\nlottery winner"},
            {"role": "assistant", "content": "{}"},
            {"role": "user", "content": "Subject: Refund please\n\nhow do I get my money"},
        ]
    )
    # The last user message counts; the subject match weighs double the body's.
    expected = {
        "intent": "refund",
        "confidence": 0.6667,
        "scores": {"question": 0.3333, "refund": 0.6667},
    }
    assert result.data == expected
    assert json.loads(result.content or "") == expected
    assert result.usage == Usage(0, 0) and result.model == "rules"


async def test_rule_provider_streams_its_answer_as_one_piece() -> None:
    tokens: list[str] = []
    result = await RuleProvider(RULES).chat(
        [{"role": "user", "content": "Subject: x\n\nI am a winner"}],
        stream=True,
        on_token=tokens.append,
    )
    assert tokens == [result.content]


async def test_rule_provider_needs_a_user_message() -> None:
    with pytest.raises(ProviderError, match="user message"):
        await RuleProvider(RULES).chat([{"role": "system", "content": "hi"}])


@pytest.mark.parametrize(
    ("subject", "body", "verdict"),
    [
        ("Refund", "how do I", {"intent": "refund", "confidence": 0.6667}),
        ("how", "refund", {"intent": "question", "confidence": 0.6667}),
        ("", "nothing matches", {"intent": "question", "confidence": 0.3, "scores": {}}),
        ("a\nb", "lottery", {"intent": "spam", "confidence": 1.0}),
    ],
)
async def test_rule_provider_classify_keeps_subject_and_body_apart(
    subject: str, body: str, verdict: dict[str, Any]
) -> None:
    got = await classify(RuleProvider(RULES), subject, body)
    assert {k: got[k] for k in verdict} == verdict
    assert got["usage"] == {"input_tokens": 0, "output_tokens": 0} and got["model"] == "rules"


# -- classify over HTTP ------------------------------------------------------------------------


async def test_classifies_through_chat_completions() -> None:
    with ModelServer('```json\n{"intent": "Refund", "confidence": 0.82}\n```') as s:
        async with OpenAIProvider(s.base_url, model="local-model", api_key="sk-test") as p:
            verdict = await classify(p, "Refund please", "ORD-1 was broken")
        [req] = s.requests
    prompt_words = sum(len(m["content"].split()) for m in req.body["messages"])
    assert verdict == {
        "intent": "refund",
        "confidence": 0.82,
        "scores": {"refund": 0.82},
        "usage": {"input_tokens": prompt_words, "output_tokens": 6},
        "model": "local-model",
    }
    assert req.path == "/v1/chat/completions"
    assert req.body["model"] == "local-model" and req.body["temperature"] == 0
    assert req.body["messages"][1]["content"] == "Subject: Refund please\n\nORD-1 was broken"
    schema = req.body["response_format"]["json_schema"]["schema"]
    assert schema["properties"]["intent"]["enum"] == list(INTENTS)
    assert req.headers["Authorization"] == "Bearer sk-test"


async def test_base_url_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with ModelServer({"intent": "spam", "confidence": 1.7}) as s:
        monkeypatch.setenv("OPENAI_BASE_URL", s.base_url)
        async with OpenAIProvider() as p:
            verdict = await classify(p, "win", "lottery")
        assert verdict["intent"] == "spam" and verdict["confidence"] == 1.0  # clamped
        assert "Authorization" not in s.requests[0].headers


@pytest.mark.parametrize(
    ("reply", "error", "message"),
    [
        ({"intent": "poetry", "confidence": 0.9}, ProviderResponseError, "unknown intent 'poetry'"),
        ({"confidence": 0.9}, ProviderResponseError, "gave no intent"),
        ({"intent": "bug", "confidence": "high"}, ProviderResponseError, "no usable confidence"),
        ("I think it is a bug", ProviderResponseError, "not JSON"),
    ],
)
async def test_unusable_classifications_are_response_errors(
    reply: Any, error: type[Exception], message: str
) -> None:
    with ModelServer(reply) as s:
        async with OpenAIProvider(s.base_url, max_retries=0) as p:
            with pytest.raises(error, match=message):
                await classify(p, "s", "b")


async def test_classify_asks_any_chat_model_the_same_question() -> None:
    asked: list[dict[str, Any]] = []

    class Fixed:
        async def chat(self, messages: Any, **kwargs: Any) -> ChatResult:
            asked.append({"messages": messages, **kwargs})
            return ChatResult(None, {"intent": "outage", "confidence": 0.7}, model="fixed")

    verdict = await classify(Fixed(), "Site down", "since 9am")
    assert verdict["intent"] == "outage" and verdict["scores"] == {"outage": 0.7}
    assert asked[0]["response_format"]["type"] == "json_schema"
    assert asked[0]["messages"][-1] == {
        "role": "user",
        "content": "Subject: Site down\n\nsince 9am",
    }


def test_missing_base_url_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    with pytest.raises(ProviderError, match="OPENAI_BASE_URL"):
        OpenAIProvider()


async def test_a_tie_goes_to_the_intent_the_team_lists_first() -> None:
    rules = {"spam": [r"(?i)\bfree\b"], "refund": [r"(?i)\bmoney\b"]}
    asked = [{"role": "user", "content": "Subject: free money\n\n"}]
    by_rules = await RuleProvider(rules).chat(asked)
    by_intents = await RuleProvider(rules, intents=("refund", "spam")).chat(asked)
    assert by_rules.data["scores"] == {"refund": 0.5, "spam": 0.5}
    assert (by_rules.data["intent"], by_intents.data["intent"]) == ("spam", "refund")
    with pytest.raises(ValueError, match=r"rules for unknown intents: \['spam'\]"):
        RuleProvider(rules, intents=("refund", "question"))
