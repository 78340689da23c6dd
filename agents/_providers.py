"""Model providers: what the Reasoner asks to classify an email, always through an effect.

Two kinds. :class:`RuleProvider` scores intents with the scenario's regular expressions:
offline, deterministic, and honest about its accuracy. :class:`OpenAIProvider` speaks the
OpenAI chat-completions protocol over HTTP to any compatible server (OpenAI, Ollama, vLLM,
llama.cpp). Both return a plain dict so the result can be recorded and served on replay.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from agents._effects import genai_span

__all__ = ["INTENTS", "ModelProvider", "OpenAIProvider", "ProviderError", "RuleProvider"]

INTENTS = ("question", "complaint", "refund", "bug", "spam", "outage")


class ProviderError(RuntimeError):
    """The model provider failed or answered something unusable."""


class ModelProvider(Protocol):
    """Classifies a text into one of :data:`INTENTS`.

    Returns ``{"intent": str, "confidence": float in [0, 1], "scores": {intent: float}}``.
    """

    name: str

    async def classify(self, subject: str, body: str) -> dict[str, Any]: ...


class RuleProvider:
    """Scores each intent by how many of its patterns match; confidence is the winner's share.

    A subject match counts double (subjects are short and deliberate). With no match at all
    the ``default_intent`` wins at confidence 0.3, low enough that the Guardian escalates.
    """

    name = "rules"

    def __init__(self, rules: Mapping[str, Sequence[str]], default_intent: str = "question"):
        unknown = set(rules) - set(INTENTS)
        if unknown:
            raise ValueError(f"rules for unknown intents: {sorted(unknown)}")
        self._rules = {
            intent: [re.compile(p) for p in patterns] for intent, patterns in rules.items()
        }
        self.default_intent = default_intent

    async def classify(self, subject: str, body: str) -> dict[str, Any]:
        span = genai_span(
            "chat",
            self.name,
            {"gen_ai.provider.name": "pantheon.rules", "gen_ai.request.model": self.name},
        )
        if span is None:
            return self._classify(subject, body)
        with span as s:
            result = self._classify(subject, body)
            s.set_attribute("gen_ai.response.model", self.name)
            s.set_attribute("pantheon.intent", result["intent"])
            return result

    def _classify(self, subject: str, body: str) -> dict[str, Any]:
        scores: dict[str, float] = {}
        for intent, patterns in self._rules.items():
            score = 0.0
            for pattern in patterns:
                if pattern.search(subject):
                    score += 2.0
                if pattern.search(body):
                    score += 1.0
            if score:
                scores[intent] = score
        if not scores:
            return {"intent": self.default_intent, "confidence": 0.3, "scores": {}}
        total = sum(scores.values())
        intent = max(scores, key=lambda k: (scores[k], -INTENTS.index(k)))
        return {
            "intent": intent,
            "confidence": round(scores[intent] / total, 4),
            "scores": {k: round(v / total, 4) for k, v in sorted(scores.items())},
        }


_SYSTEM_PROMPT = (
    "You classify customer support emails. Answer with one JSON object only: "
    '{"intent": one of ' + ", ".join(INTENTS) + ', "confidence": number between 0 and 1}.'
)


class OpenAIProvider:
    """Chat-completions over HTTP. ``base_url`` ends before ``/chat/completions``
    (e.g. ``http://127.0.0.1:11434/v1`` for Ollama); the key is sent as a Bearer token when set.

    Uses the standard library's HTTP client in a worker thread: one request per email does not
    justify another dependency, and the event loop never blocks on the network.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str | None = None,
        model: str = "gpt-4o-mini",
        api_key: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        base = base_url or os.environ.get("OPENAI_BASE_URL")
        if not base:
            raise ProviderError("OpenAI provider needs base_url or OPENAI_BASE_URL")
        self.url = base.rstrip("/") + "/chat/completions"
        parts = urllib.parse.urlsplit(self.url)
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self.model = model
        self.api_key = api_key
        self.timeout = timeout

    async def classify(self, subject: str, body: str) -> dict[str, Any]:
        request = {
            "model": self.model,
            "temperature": 0,
            "messages": [
                {"role": "system", "content": _SYSTEM_PROMPT},
                {"role": "user", "content": f"Subject: {subject}\n\n{body}"},
            ],
        }
        span = genai_span(
            "chat",
            self.model,
            {
                "gen_ai.provider.name": "openai",
                "gen_ai.request.model": self.model,
                "gen_ai.request.temperature": 0.0,
                "server.address": self._host,
                "server.port": self._port,
            },
            kind="client",
        )
        if span is None:
            reply = await asyncio.to_thread(self._post, request)
        else:
            with span as s:
                reply = await asyncio.to_thread(self._post, request)
                _annotate(s, reply)
        try:
            content = reply["choices"][0]["message"]["content"]
            answer = json.loads(_strip_fence(content))
            intent = str(answer["intent"]).strip().lower()
            confidence = float(answer.get("confidence", 0.5))
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise ProviderError(f"unusable answer from {self.url}: {reply!r:.200}") from exc
        if intent not in INTENTS:
            raise ProviderError(f"model answered unknown intent {intent!r}")
        confidence = min(max(confidence, 0.0), 1.0)
        return {"intent": intent, "confidence": confidence, "scores": {intent: confidence}}

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        req = urllib.request.Request(
            self.url, data=json.dumps(body).encode(), headers=headers, method="POST"
        )
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())  # type: ignore[no-any-return]
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:200].decode(errors="replace")
            raise ProviderError(f"{self.url} answered HTTP {exc.code}: {detail}") from exc
        except (urllib.error.URLError, TimeoutError, json.JSONDecodeError) as exc:
            raise ProviderError(f"{self.url}: {exc}") from exc


def _annotate(span: Any, reply: Any) -> None:
    """GenAI response attributes from a chat-completions reply, where it has them."""
    if not isinstance(reply, dict):
        return
    if isinstance(reply.get("model"), str):
        span.set_attribute("gen_ai.response.model", reply["model"])
    if isinstance(reply.get("id"), str):
        span.set_attribute("gen_ai.response.id", reply["id"])
    usage = reply.get("usage")
    if isinstance(usage, dict):
        for ours, theirs in (("input", "prompt"), ("output", "completion")):
            if isinstance(usage.get(f"{theirs}_tokens"), int):
                span.set_attribute(f"gen_ai.usage.{ours}_tokens", usage[f"{theirs}_tokens"])
    choices = reply.get("choices")
    if isinstance(choices, list):
        reasons = [c.get("finish_reason") for c in choices if isinstance(c, dict)]
        span.set_attribute("gen_ai.response.finish_reasons", [r for r in reasons if r])


def _strip_fence(text: str) -> str:
    text = text.strip()
    if text.startswith("```"):
        text = text.strip("`")
        text = text.removeprefix("json").strip()
    return text
