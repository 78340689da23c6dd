"""Model providers: the one interface an agent's model calls go through.

A provider answers OpenAI-shaped chat messages with a :class:`ChatResult`, a frozen value that
:meth:`ChatResult.to_dict` turns into plain data. That plain data is what a session records
(:meth:`agents.Agent.chat` runs every call as an effect), so a replay rebuilds the same result
from the record and never calls the model.

Two providers ship. :class:`RuleProvider` scores intents with the scenario's regular
expressions: offline, deterministic, free, and honest about its accuracy. :class:`OpenAIProvider`
speaks the chat-completions protocol to any compatible server (OpenAI, Ollama, vLLM, llama.cpp)
over one pooled ``httpx`` client, with bounded retries. What a team asks is its own (the support
desk's intent question is ``support.intents.classify``, in ``scenarios/support/``).
:class:`agents.AnthropicProvider` (``agents/_anthropic.py``) speaks the Messages API.

Why the OpenAI provider has its own client rather than the official ``openai`` SDK, measured
(``benchmarks/provider_bench.py --clients``, ``benchmarks/RESULTS.md``): the SDK costs
2.2-2.5x the client CPU per call (1.6-2.0 ms against 0.7-0.8 ms; streamed 2.4-2.8 against
1.0-1.1), on the core the pipeline runs on, and 4-5x the import time; its retries cannot cap
``Retry-After`` at ``max_backoff``. What it would save, the SSE reading and tool-call
assembly below, is ~100 lines of a stable protocol, tested against the stand-in server.

Errors (a branch of :class:`agents.AgentError`)::

    ProviderError                  the provider failed or answered something unusable
    ├── ProviderUnavailable        the server could not be reached, after retries
    └── ProviderResponseError      an HTTP error status (after retries), or an unusable answer
        └── ToolArgumentsNotJSON   the model called a tool with arguments that are no JSON object
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import re
import socket
import urllib.parse
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, Self, runtime_checkable

from agents._effects import genai_span
from agents._errors import AgentError

if TYPE_CHECKING:
    import httpx

__all__ = [
    "ChatResult",
    "ModelProvider",
    "OpenAIProvider",
    "ProviderError",
    "ProviderResponseError",
    "ProviderUnavailable",
    "RuleProvider",
    "SupportsChat",
    "ToolArgumentsNotJSON",
    "ToolCall",
    "Usage",
]

#: HTTP statuses worth another attempt: rate limiting and the server-side failures that are
#: usually transient (an overloaded or restarting model server, a proxy in front of it).
RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})

#: Characters of an unusable answer or error body quoted in an exception message.
EXCERPT = 200


# -- values ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens one call (or a sum of calls) consumed, as the server counted them."""

    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: object) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens
        )

    def to_dict(self) -> dict[str, int]:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Usage:
        return cls(int(data.get("input_tokens", 0)), int(data.get("output_tokens", 0)))


@dataclass(frozen=True, slots=True)
class ToolCall:
    """A function call the model asked for; ``arguments`` already decoded from the protocol's
    JSON string, so a malformed call fails in the provider, not in the tool."""

    id: str
    name: str
    arguments: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "name": self.name, "arguments": self.arguments}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ToolCall:
        return cls(str(data["id"]), str(data["name"]), dict(data.get("arguments") or {}))


@dataclass(frozen=True, slots=True)
class ChatResult:
    """One model answer. ``data`` is the parsed JSON when JSON output was asked for.

    Frozen and built only of plain values, so :meth:`to_dict` and :meth:`from_dict`
    round-trip through msgpack: a session records the dict, a replay rebuilds an equal result.
    """

    content: str | None
    data: Any = None
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage = Usage()
    model: str = ""
    finish_reason: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "content": self.content,
            "data": self.data,
            "tool_calls": [c.to_dict() for c in self.tool_calls],
            "usage": self.usage.to_dict(),
            "model": self.model,
            "finish_reason": self.finish_reason,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ChatResult:
        return cls(
            content=data.get("content"),
            data=data.get("data"),
            tool_calls=tuple(ToolCall.from_dict(c) for c in data.get("tool_calls") or ()),
            usage=Usage.from_dict(data.get("usage") or {}),
            model=str(data.get("model") or ""),
            finish_reason=data.get("finish_reason"),
        )


# -- errors ------------------------------------------------------------------------------------


class ProviderError(AgentError, RuntimeError):
    """The model provider failed or answered something unusable."""


class ProviderUnavailable(ProviderError):
    """The model server could not be reached (refused, DNS, timeout) after every retry.

    Usually an operator's problem (the server is down or the URL is wrong), which is why the
    message always names the URL."""

    def __init__(self, message: str, *, url: str | None = None) -> None:
        super().__init__(message)
        self.url = url


class ProviderResponseError(ProviderError):
    """The server answered, but not usefully: an HTTP error status after every retry
    (``status`` set), or an answer the caller cannot use (JSON asked for, prose given)."""

    def __init__(self, message: str, *, url: str | None = None, status: int | None = None):
        super().__init__(message)
        self.url = url
        self.status = status


class ToolArgumentsNotJSON(ProviderResponseError):
    """The model called a tool with arguments that are not a JSON object (no JSON at all, as
    ``host=web1``, or JSON of another kind): the answer cannot be used. A model agent tells
    the model so and asks again, as for an answer that does not fit its output type; a
    separate type so that, past the bound, it says which of the two it was (on replay too:
    a recorded error is rebuilt by its type's name)."""


# -- the interface -----------------------------------------------------------------------------


@runtime_checkable
class ModelProvider(Protocol):
    """A chat model. ``messages`` are OpenAI chat messages (``role``/``content``, assistant
    ``tool_calls``, ``tool`` messages with ``tool_call_id``); ``response_format`` is
    ``{"type": "json_object"}`` or ``{"type": "json_schema", "json_schema": {...}}``;
    ``tools`` are OpenAI function tools. With ``stream`` the answer's text reaches
    ``on_token`` piece by piece as it is generated; the returned result is the same.

    ``name`` names the kind of provider (it is part of the recorded effect's name); ``model``
    the model asked for. ``aclose()`` releases connections; the runtime calls it after a run.
    """

    name: str
    model: str

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
    ) -> ChatResult: ...

    async def aclose(self) -> None: ...


class SupportsChat(Protocol):
    """Anything a team's question can be asked of: a :class:`ModelProvider`, or an agent,
    whose :meth:`~agents.Agent.chat` records the call and counts its tokens."""

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        response_format: Mapping[str, Any] | None = None,
        temperature: float | None = None,
    ) -> ChatResult: ...


# -- the rules provider's reading of a message --------------------------------------------------

_SUBJECT = "Subject: "


def _split_email(text: str) -> tuple[str, str]:
    """Subject and body of a message written ``Subject: <subject>``, a blank line, then the
    body; a text not in that shape is all body. A subject that itself holds a blank line is
    split at it."""
    if not text.startswith(_SUBJECT):
        return "", text
    subject, _, body = text[len(_SUBJECT) :].partition("\n\n")
    return subject, body


class _Provider:
    """What the shipped providers share: ``async with`` closing and :meth:`check`."""

    async def check(self) -> None:
        """Raise :class:`ProviderUnavailable` now if the model cannot be reached, so a run
        says so once, before any input flows, instead of dead-lettering every one."""

    async def aclose(self) -> None:
        """Nothing to release unless a subclass holds connections."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


# -- rules -------------------------------------------------------------------------------------


class RuleProvider(_Provider):
    """Scores each intent by how many of its patterns match; confidence is the winner's share.

    It answers one kind of question, which intent a message is: the last user message is
    read as ``Subject: <subject>``, a blank line, then the body, because a subject match
    counts double (subjects are short and deliberate). With no match at all the
    ``default_intent`` wins at confidence 0.3, low enough that the Guardian escalates. The
    answer is the JSON ``{"intent", "confidence", "scores"}``; it uses no tokens and reports
    none. ``intents`` (the team's, e.g. ``support.intents.INTENTS``) are the intents the
    rules may name, in the order a tie is broken (the first wins); without them, the rules'
    own order.
    """

    name = "rules"
    model = "rules"

    def __init__(
        self,
        rules: Mapping[str, Sequence[str | re.Pattern[str]]],
        default_intent: str = "question",
        *,
        intents: Sequence[str] | None = None,
    ) -> None:
        if intents is not None:
            unknown = set(rules) - set(intents)
            if unknown:
                raise ValueError(f"rules for unknown intents: {sorted(unknown)}")
        #: Intent -> its rank in a tie (lower wins).
        self._rank = {
            intent: n for n, intent in enumerate(intents if intents is not None else rules)
        }
        self._rules = {
            intent: [re.compile(p) for p in patterns] for intent, patterns in rules.items()
        }
        self._intents = tuple(i for i, ps in self._rules.items() for _ in ps)
        self._matcher = _PatternSet(p for ps in self._rules.values() for p in ps)
        self.default_intent = default_intent
        self._identity = (
            default_intent,
            list(self._rank),
            [(i, [(p.pattern, p.flags) for p in ps]) for i, ps in self._rules.items()],
        )

    def request_identity(self) -> Any:
        """The rules, their tie order and the default: everything its answers depend on
        (see :class:`agents.RequestIdentity`)."""
        return self._identity

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
        refusal = self.refusal(response_format, tools)
        if refusal is not None:
            raise ProviderError(refusal)
        text = _last_user_text(messages)
        if text is None:
            raise ProviderError("the rule provider classifies a user message; there is none")
        span = genai_span(
            "chat",
            self.name,
            {"gen_ai.provider.name": "pantheon.rules", "gen_ai.request.model": self.model},
        )
        if span is None:
            return self._answer(text, on_token if stream else None)
        with span as s:
            result = self._answer(text, on_token if stream else None)
            s.set_attribute("gen_ai.response.model", self.model)
            s.set_attribute("gen_ai.usage.input_tokens", 0)
            s.set_attribute("gen_ai.usage.output_tokens", 0)
            s.set_attribute("pantheon.intent", result.data["intent"])
            return result

    @staticmethod
    def refusal(
        response_format: Mapping[str, Any] | None = None,
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> str | None:
        """Why this provider cannot give what a call asks for (``None`` when it can).

        It answers one question, which intent a message is, with ``{"intent", "confidence",
        "scores"}``. Tools, or a JSON schema requiring any other field, would get that answer
        regardless, and the caller would fail later and far away (a ``KeyError`` on the
        missing field, then an open breaker); saying so at the call names the cause."""
        if tools:
            names = ", ".join(repr(_tool_name(t)) for t in tools)
            return f"the offline rules provider cannot call tools ({names}): it only classifies"
        if response_format is None or response_format.get("type") != "json_schema":
            return None
        spec = response_format.get("json_schema")
        spec = spec if isinstance(spec, Mapping) else {}
        schema = spec.get("schema")
        schema = schema if isinstance(schema, Mapping) else {}
        # The fields it requires or describes: an answer without a described field would
        # fail the caller just the same, at the first read of it.
        fields = dict.fromkeys([*schema.get("required", ()), *schema.get("properties", {})])
        missing = [str(f) for f in fields if f not in _RULES_ANSWER]
        if not missing:
            return None
        return (
            f"the offline rules provider cannot answer JSON schema {spec.get('name', '?')!r}: "
            f"it gives only {', '.join(_RULES_ANSWER)}, not {', '.join(missing)}"
        )

    def _answer(self, text: str, on_token: Callable[[str], None] | None) -> ChatResult:
        verdict = self._classify(*_split_email(text))
        content = json.dumps(verdict)
        if on_token is not None:
            on_token(content)
        return ChatResult(content, verdict, model=self.model, finish_reason="stop")

    def _classify(self, subject: str, body: str) -> dict[str, Any]:
        # The same scores as _classify_reference: 2 for each pattern found in the subject, 1
        # for each found in the body. Every score is a small whole number, so the order the
        # floats are added in cannot change a total.
        scores: dict[str, float] = {}
        for intent, in_subject, in_body in zip(
            self._intents, self._matcher(subject), self._matcher(body), strict=True
        ):
            if in_subject or in_body:
                scores[intent] = scores.get(intent, 0.0) + 2.0 * in_subject + 1.0 * in_body
        return self._verdict(scores)

    def _classify_reference(self, subject: str, body: str) -> dict[str, Any]:
        """The definition :meth:`_classify` must equal, kept for its tests and benchmark:
        every pattern searched separately in the subject and in the body."""
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
        return self._verdict(scores)

    def _verdict(self, scores: dict[str, float]) -> dict[str, Any]:
        if not scores:
            return {"intent": self.default_intent, "confidence": 0.3, "scores": {}}
        total = sum(scores.values())
        intent = max(scores, key=lambda k: (scores[k], -self._rank[k]))
        return {
            "intent": intent,
            "confidence": round(scores[intent] / total, 4),
            "scores": {k: round(v / total, 4) for k, v in sorted(scores.items())},
        }


#: The fields of every :class:`RuleProvider` answer.
_RULES_ANSWER = ("intent", "confidence", "scores")


def _tool_name(tool: Mapping[str, Any]) -> str:
    function = tool.get("function")
    return str(function.get("name", "?")) if isinstance(function, Mapping) else "?"


# -- matching many patterns at once -------------------------------------------------------------

#: Non-ASCII characters that a case-insensitive pattern matches to an ASCII letter (all of
#: them, as ``re`` folds case in CPython 3.11+; a test scans every code point), mapped to it.
_ASCII_FOLD = str.maketrans({"\u0130": "i", "\u0131": "i", "\u017f": "s", "\u212a": "k"})

#: Most needle strings one pattern's prefilter may hold; a pattern that would need more is
#: always searched (a bound on the prefilter's cost, not on what patterns may say).
MAX_NEEDLES = 64

#: Needles are cut to this many characters (a prefix of a needle is a needle too), which
#: bounds the depth of the scanning regex built from them.
NEEDLE_CHARS = 24


class _PatternSet:
    """Which of some patterns occur in a text: ``[p.search(text) is not None for p in
    patterns]``, computed cheaply.

    Most support-desk patterns are alternations of words, and most texts contain few of them,
    yet each search runs the regex engine at every position of the text. So each pattern
    gets, when its syntax allows, a prefilter: a few lower-case ASCII strings ("needles") at
    least one of which every match of the pattern contains. A text is folded once (lower
    case, plus the four non-ASCII characters ``re`` matches to ASCII letters ignoring case)
    and scanned once, by one regex: a trie of every pattern's needles, searched again from
    one character past each hit, so it visits every position where some needle starts and
    there reports the longest one (any shorter needle starting there is its prefix, mapped in
    ``__init__``). A pattern is searched only if one of its needles occurs. A needle is only
    ever a reason to search, never a verdict, so the answer is the plain searches'. Patterns
    without a usable needle (no literal text, a back-reference, a non-ASCII literal, too many
    alternatives) are searched every time.
    """

    __slots__ = ("_always", "_by_needle", "_scan", "_searches")

    def __init__(self, patterns: Iterable[re.Pattern[str]]) -> None:
        compiled = tuple(patterns)
        self._searches = tuple(p.search for p in compiled)
        needles = [_needles(p) for p in compiled]
        self._always = frozenset(i for i, n in enumerate(needles) if n is None)
        owners: dict[str, set[int]] = {}
        for i, ns in enumerate(needles):
            for n in ns or ():
                owners.setdefault(n, set()).add(i)
        every = set(owners)
        # Each needle the scan can report -> the patterns with a needle that is a prefix of it.
        self._by_needle = {
            found: frozenset().union(*(owners.get(found[:k], ()) for k in range(1, len(found) + 1)))
            for found in every
        }
        self._scan = re.compile(_trie(every)).search if every else None

    def __call__(self, text: str) -> list[bool]:
        candidates = set(self._always)
        scan = self._scan
        if scan is not None:
            folded = text.lower() if text.isascii() else text.translate(_ASCII_FOLD).lower()
            by_needle = self._by_needle
            pos = 0
            while (m := scan(folded, pos)) is not None:
                candidates.update(by_needle[m.group()])
                pos = m.start() + 1
        hits = [False] * len(self._searches)
        for i in candidates:
            hits[i] = self._searches[i](text) is not None
        return hits


def _trie(words: Iterable[str]) -> str:
    """A regex matching exactly ``words``, factored as a trie so that at each position the
    engine follows one branch per character, and the longest word wins (greedy ``?``)."""
    root: dict[str, Any] = {}
    for word in words:
        node = root
        for ch in word:
            node = node.setdefault(ch, {})
        node[""] = {}

    def alternation(node: dict[str, Any]) -> str:
        branches = [re.escape(ch) + alternation(child) for ch, child in sorted(node.items()) if ch]
        if not branches:
            return ""
        group = "(?:" + "|".join(branches) + ")"
        return group + "?" if "" in node else group

    return alternation(root)


def _needles(pattern: re.Pattern[str]) -> tuple[str, ...] | None:
    """Strings one of which every match of ``pattern`` contains (once lower-cased), or None
    when no such short list is known."""
    if not isinstance(pattern.pattern, str):
        return None
    try:
        from re import _parser  # type: ignore[attr-defined]  # re.compile's; private

        tree = _parser.parse(pattern.pattern, pattern.flags)
    except Exception:  # an unknown parser version: search every time
        return None
    exact, needed = _literals(list(tree))
    found = exact if exact is not None else needed
    if found is None or "" in found:
        return None
    cut = {n[:NEEDLE_CHARS] for n in found}
    # A needle that holds another is redundant: a text with it has the shorter one too.
    return tuple(sorted(n for n in cut if not any(m != n and m in n for m in cut)))


_Lits = tuple[frozenset[str] | None, frozenset[str] | None]


def _literals(items: list[tuple[Any, Any]]) -> _Lits:
    """``(exact, needed)`` for a parsed sequence: ``exact`` the strings its every match is one
    of (lower-cased), ``needed`` strings one of which its every match contains; either may be
    None (unknown). Zero-width assertions match the empty string, which keeps literals on
    either side of them adjacent in the match."""
    # re's own parser and opcodes (private, stable since 3.11); unknown opcodes give None.
    from re import _constants as sre  # type: ignore[attr-defined]

    def element(op: Any, av: Any) -> _Lits:
        if op is sre.LITERAL:
            ch = chr(av)
            return (frozenset({ch.lower()}), None) if ch.isascii() else (None, None)
        if op is sre.IN:
            chars: set[str] = set()
            for kind, value in av:
                if kind is sre.LITERAL:
                    chars.add(chr(value))
                elif kind is sre.RANGE and value[1] - value[0] < MAX_NEEDLES:
                    chars.update(map(chr, range(value[0], value[1] + 1)))
                else:  # NEGATE, CATEGORY, a wide range
                    return None, None
            if not chars or not all(ch.isascii() for ch in chars):
                return None, None
            return frozenset(ch.lower() for ch in chars), None
        if op in (sre.AT, sre.ASSERT, sre.ASSERT_NOT):
            return frozenset({""}), None
        if op is sre.SUBPATTERN:
            return _literals(list(av[-1]))
        if op is sre.ATOMIC_GROUP:
            return _literals(list(av))
        if op is sre.BRANCH:
            alts = [_literals(list(alt)) for alt in av[1]]
            exacts = [e for e, _ in alts]
            exact = None
            if all(e is not None for e in exacts):
                exact = frozenset().union(*exacts)  # type: ignore[arg-type]
                exact = exact if len(exact) <= MAX_NEEDLES else None
            neededs = [e if e is not None else n for e, n in alts]
            needed = None
            if all(n is not None for n in neededs):
                needed = frozenset().union(*neededs)  # type: ignore[arg-type]
                needed = needed if len(needed) <= MAX_NEEDLES else None
            return exact, needed
        if op in (sre.MAX_REPEAT, sre.MIN_REPEAT, sre.POSSESSIVE_REPEAT):
            low, high, item = av
            inner = _literals(list(item))
            if low == high == 1:
                return inner
            if low >= 1:  # every match holds at least one match of the item
                return None, inner[0] if inner[0] is not None else inner[1]
        return None, None  # ANY, NOT_LITERAL, GROUPREF, GROUPREF_EXISTS, ...

    candidates: list[frozenset[str]] = []
    run: frozenset[str] = frozenset({""})
    all_exact = True
    for op, av in items:
        exact, needed = element(op, av)
        if exact is not None and len(run) * len(exact) <= MAX_NEEDLES:
            run = frozenset(a + b for a in run for b in exact)
            continue
        all_exact = False
        candidates.append(run)
        if exact is not None:  # too many combinations: a new run starts here
            run = exact
        else:
            run = frozenset({""})
            if needed is not None:
                candidates.append(needed)
    if all_exact:
        return run, run
    candidates.append(run)
    best = max(candidates, key=lambda c: (min(map(len, c)), -len(c)))
    return None, (best if min(map(len, best)) > 0 else None)


def _last_user_text(messages: Sequence[Mapping[str, Any]]) -> str | None:
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, Sequence):  # content parts: keep the text ones
            return "".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping))
        return ""
    return None


# -- OpenAI-compatible servers -----------------------------------------------------------------


class _Progress:
    """How much of a streamed answer was handed out: after the first token a retry would
    repeat text the caller has already shown, so a broken stream is final."""

    __slots__ = ("tokens",)

    def __init__(self) -> None:
        self.tokens = 0


class OpenAIProvider(_Provider):
    """Chat-completions over HTTP. ``base_url`` ends before ``/chat/completions``
    (e.g. ``http://127.0.0.1:11434/v1`` for Ollama); the key is sent as a Bearer token when set.

    One ``httpx.AsyncClient``, made on first use and closed by :meth:`aclose`, carries every
    call: concurrent calls share up to ``max_connections`` kept-alive connections instead of
    paying a TCP (and TLS) handshake each. ``timeout`` bounds each read and write,
    ``connect_timeout`` the connection.

    A refused or timed-out connection and the statuses in :data:`RETRY_STATUSES` are tried
    again, up to ``max_retries`` more times, after ``backoff * 2**n`` seconds (n = 0, 1, ...;
    at most ``max_backoff``) with jitter between half and all of it, so a crowd of agents
    that failed together does not return together. A ``Retry-After`` in seconds replaces
    that wait, still capped at ``max_backoff``. Any other error status fails at once. So a
    dead server costs at most the backoff schedule (1.4 s with the defaults) when refused,
    plus ``connect_timeout`` per attempt when it does not answer at all.
    """

    name = "openai"

    def __init__(
        self,
        base_url: str | None = None,
        model: str = "gpt-4o-mini",
        api_key: str | None = None,
        timeout: float = 30.0,
        *,
        max_retries: int = 3,
        backoff: float = 0.2,
        max_backoff: float = 5.0,
        connect_timeout: float = 5.0,
        max_connections: int = 32,
    ) -> None:
        base = base_url or os.environ.get("OPENAI_BASE_URL")
        if not base:
            raise ProviderError("OpenAI provider needs base_url or OPENAI_BASE_URL")
        if max_retries < 0 or backoff < 0 or max_backoff < 0:
            raise ValueError("max_retries, backoff and max_backoff must not be negative")
        if timeout <= 0 or connect_timeout <= 0 or max_connections < 1:
            raise ValueError("timeouts must be positive and max_connections at least 1")
        self.url = base.rstrip("/") + "/chat/completions"
        parts = urllib.parse.urlsplit(self.url)
        self._host = parts.hostname or ""
        self._port = parts.port or (443 if parts.scheme == "https" else 80)
        self.model = model
        self.api_key = api_key
        self.timeout = timeout
        self.max_retries = max_retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self.connect_timeout = connect_timeout
        self.max_connections = max_connections
        self._client: httpx.AsyncClient | None = None
        self._closed = False
        self._jitter = random.Random()

    def _http(self) -> httpx.AsyncClient:
        if self._closed:
            raise ProviderError(f"the provider for {self.url} is closed")
        if self._client is None:
            import httpx  # 0.1 s to import: only runs that talk to a server pay it

            headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
            self._client = httpx.AsyncClient(
                headers=headers,
                timeout=httpx.Timeout(self.timeout, connect=self.connect_timeout),
                limits=httpx.Limits(
                    max_connections=self.max_connections,
                    max_keepalive_connections=self.max_connections,
                ),
            )
        return self._client

    async def check(self) -> None:
        """One ``GET {base_url}/models``: any HTTP answer means the server is there (no tokens
        spent, no key needed). It also sets up the client (TLS context, HTTP machinery, a
        pooled connection), so the first model call of a run does not pay ~0.1 s for it."""
        import httpx

        models = self.url.removesuffix("/chat/completions") + "/models"
        try:
            await self._http().get(models, timeout=self.connect_timeout)
        except httpx.TimeoutException:
            raise ProviderUnavailable(
                f"cannot reach model server at {self.url}: no answer in {self.connect_timeout:g} s",
                url=self.url,
            ) from None
        except httpx.TransportError as exc:
            raise ProviderUnavailable(
                f"cannot reach model server at {self.url}: {_reason(exc)}", url=self.url
            ) from None

    def request_identity(self) -> Any:
        """The server and the model asked (see :class:`agents.RequestIdentity`)."""
        return (self.url, self.model)

    async def aclose(self) -> None:
        """Close the pooled connections. The provider cannot be used afterwards."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

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
        body: dict[str, Any] = {"model": self.model, "messages": [dict(m) for m in messages]}
        attributes: dict[str, Any] = {
            "gen_ai.provider.name": "openai",
            "gen_ai.request.model": self.model,
            "server.address": self._host,
            "server.port": self._port,
        }
        if temperature is not None:
            body["temperature"] = attributes["gen_ai.request.temperature"] = float(temperature)
        if max_tokens is not None:
            body["max_tokens"] = attributes["gen_ai.request.max_tokens"] = max_tokens
        if response_format is not None:
            body["response_format"] = dict(response_format)
        if tools:
            body["tools"] = [dict(t) for t in tools]
        if stream:
            body["stream"] = True
            body["stream_options"] = {"include_usage": True}
        json_wanted = response_format is not None and response_format.get("type") in (
            "json_object",
            "json_schema",
        )
        span = genai_span("chat", self.model, attributes, kind="client")
        if span is None:
            result, _ = await self._send(body, json_wanted, on_token)
            return result
        with span as s:
            result, response_id = await self._send(body, json_wanted, on_token)
            _annotate(s, result, response_id)
            return result

    async def _send(
        self, body: dict[str, Any], json_wanted: bool, on_token: Callable[[str], None] | None
    ) -> tuple[ChatResult, str | None]:
        import httpx

        client = self._http()
        attempts = self.max_retries + 1
        progress = _Progress()
        attempt = 0
        while True:
            last = attempt == attempts - 1
            try:
                if body.get("stream"):
                    async with client.stream("POST", self.url, json=body) as response:
                        if response.is_success:
                            return await self._read_stream(
                                response, json_wanted, on_token, progress
                            )
                        await response.aread()
                else:
                    response = await client.post(self.url, json=body)
                    if response.is_success:
                        return self._read_reply(response.content, json_wanted)
            except (httpx.TimeoutException, httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                if progress.tokens:
                    raise ProviderUnavailable(
                        f"the stream from {self.url} broke after {progress.tokens} pieces: "
                        f"{_reason(exc)}",
                        url=self.url,
                    ) from exc
                if last:
                    raise ProviderUnavailable(
                        f"cannot reach model server at {self.url}: {_reason(exc)} "
                        f"({attempts} attempt{'s' if attempts > 1 else ''})",
                        url=self.url,
                    ) from exc
                await asyncio.sleep(self._delay(attempt, None))
                attempt += 1
                continue
            status = response.status_code
            # A server that knows the same request fails the same way says so.
            retryable = (
                status in RETRY_STATUSES
                and response.headers.get("x-should-retry", "").lower() != "false"
            )
            if last or not retryable:
                after = f" after {attempts} attempts" if retryable and attempts > 1 else ""
                raise ProviderResponseError(
                    f"model server at {self.url} answered HTTP {status}{after}: "
                    f"{_excerpt(_error_message(response.text))}",
                    url=self.url,
                    status=status,
                )
            await asyncio.sleep(self._delay(attempt, _retry_after(response)))
            attempt += 1

    def _delay(self, attempt: int, retry_after: float | None) -> float:
        if retry_after is not None:
            return min(retry_after, self.max_backoff)
        full = min(self.max_backoff, self.backoff * 2**attempt)
        return full * (0.5 + self._jitter.random() / 2)

    def _read_reply(self, raw: bytes, json_wanted: bool) -> tuple[ChatResult, str | None]:
        try:
            reply = json.loads(raw)
            choice = reply["choices"][0]
            message = choice["message"]
            content = message.get("content")
            calls = tuple(
                self._tool_call(c.get("id"), c["function"]["name"], c["function"].get("arguments"))
                for c in message.get("tool_calls") or ()
            )
            finish = choice.get("finish_reason")
        except (ValueError, KeyError, IndexError, TypeError, AttributeError) as exc:
            raise ProviderResponseError(
                f"unusable answer from {self.url}: {_excerpt(raw.decode(errors='replace'))}",
                url=self.url,
            ) from exc
        result = self._result(content, calls, reply.get("usage"), reply.get("model"), finish)
        return self._with_data(result, json_wanted), _str_or_none(reply.get("id"))

    async def _read_stream(
        self,
        response: httpx.Response,
        json_wanted: bool,
        on_token: Callable[[str], None] | None,
        progress: _Progress,
    ) -> tuple[ChatResult, str | None]:
        """Server-sent events: each ``data:`` line a chunk with a ``delta``; tool calls come
        in fragments keyed by ``index`` whose ``arguments`` concatenate; with
        ``include_usage`` the last chunk before ``[DONE]`` has no choices and the usage."""
        parts: list[str] = []
        calls: dict[int, dict[str, Any]] = {}
        seen: dict[str, Any] = {}
        done = False
        async for line in response.aiter_lines():
            if not line.startswith("data:"):
                continue  # blank separators, ": keep-alive" comments, event names
            data = line[5:].strip()
            if data == "[DONE]" or done:
                # Read on to the end of the body even so: a response left unread closes
                # its connection instead of returning it to the pool.
                done = True
                continue
            try:
                pieces = _apply_chunk(json.loads(data), calls, seen)
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                raise ProviderResponseError(
                    f"unusable stream chunk from {self.url}: {_excerpt(data)}", url=self.url
                ) from exc
            for text in pieces:
                parts.append(text)
                progress.tokens += 1
                if on_token is not None:
                    on_token(text)
        tool_calls = tuple(
            self._tool_call(c["id"], c["name"], "".join(c["arguments"]))
            for _, c in sorted(calls.items())
        )
        content = "".join(parts) if parts or not tool_calls else None
        result = self._result(
            content, tool_calls, seen.get("usage"), seen.get("model"), seen.get("finish")
        )
        return self._with_data(result, json_wanted), _str_or_none(seen.get("id"))

    def _result(
        self,
        content: Any,
        tool_calls: tuple[ToolCall, ...],
        usage: Any,
        model: Any,
        finish: Any,
    ) -> ChatResult:
        return ChatResult(
            content=content if isinstance(content, str) else None,
            tool_calls=tool_calls,
            usage=_usage(usage),
            model=model if isinstance(model, str) and model else self.model,
            finish_reason=_str_or_none(finish),
        )

    def _with_data(self, result: ChatResult, json_wanted: bool) -> ChatResult:
        if not json_wanted or (result.content is None and result.tool_calls):
            return result
        try:
            data = json.loads(_strip_fence(result.content or ""))
        except ValueError as exc:
            raise ProviderResponseError(
                f"JSON was asked of {self.url} but the answer is not JSON: "
                f"{_excerpt(result.content or '')}",
                url=self.url,
            ) from exc
        return ChatResult(
            result.content, data, result.tool_calls, result.usage, result.model,
            result.finish_reason,
        )  # fmt: skip

    def _tool_call(self, call_id: Any, name: Any, arguments: Any) -> ToolCall:
        if arguments is None or arguments == "":
            args: Any = {}
        elif isinstance(arguments, Mapping):  # some servers send the object itself
            args = dict(arguments)
        else:
            try:
                args = json.loads(arguments)
            except (TypeError, ValueError) as exc:
                raise ToolArgumentsNotJSON(
                    f"{self.url} called tool {name!r} with arguments that are not JSON: "
                    f"{_excerpt(str(arguments))}",
                    url=self.url,
                ) from exc
        if not isinstance(args, dict):
            raise ToolArgumentsNotJSON(
                f"{self.url} called tool {name!r} with arguments that are not a JSON object: "
                f"{_excerpt(str(arguments))}",
                url=self.url,
            )
        return ToolCall(str(call_id or ""), str(name), args)


def _apply_chunk(
    chunk: Mapping[str, Any], calls: dict[int, dict[str, Any]], seen: dict[str, Any]
) -> list[str]:
    """Fold one stream chunk into ``calls`` (tool-call fragments by index) and ``seen``
    (the latest model, id, usage and finish reason seen); return its text pieces."""
    for key in ("model", "id", "usage"):
        if chunk.get(key):
            seen[key] = chunk[key]
    pieces = []
    for choice in chunk.get("choices") or ():
        if choice.get("index", 0) != 0:
            continue
        delta = choice.get("delta") or {}
        if delta.get("content"):
            pieces.append(str(delta["content"]))
        for frag in delta.get("tool_calls") or ():
            slot = calls.setdefault(
                int(frag.get("index", 0)), {"id": "", "name": "", "arguments": []}
            )
            function = frag.get("function") or {}
            slot["id"] = frag.get("id") or slot["id"]
            slot["name"] = slot["name"] or function.get("name") or ""
            if function.get("arguments"):
                slot["arguments"].append(function["arguments"])
        if choice.get("finish_reason"):
            seen["finish"] = choice["finish_reason"]
    return pieces


def _usage(raw: Any) -> Usage:
    if not isinstance(raw, Mapping):
        return Usage()

    def count(key: str) -> int:
        value = raw.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) else 0

    return Usage(count("prompt_tokens"), count("completion_tokens"))


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds (fractions accepted); an HTTP date is ignored and the
    backoff schedule used instead."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and seconds >= 0 else None


def _reason(exc: Exception) -> str:
    import httpx

    if isinstance(exc, httpx.ConnectTimeout):
        return "connection timed out"
    if isinstance(exc, httpx.TimeoutException):
        return "timed out waiting for the answer"
    # httpx wraps the socket's error in its own and anyio's ("All connection attempts
    # failed"): the useful words are at the bottom of the chain.
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ConnectionRefusedError):
            return "connection refused"
        if isinstance(cause, socket.gaierror):
            return f"cannot resolve the host name ({cause.strerror})"
        cause = cause.__cause__ or cause.__context__
    return str(exc) or type(exc).__name__


def _error_message(text: str) -> str:
    """An error body's own message (``{"error": {"message": ...}}``, as OpenAI-compatible
    and Anthropic servers send it), else the body: the JSON around it says nothing and
    would take the excerpt's room."""
    try:
        body = json.loads(text)
    except ValueError:
        return text
    error = body.get("error") if isinstance(body, dict) else None
    message = error.get("message") if isinstance(error, dict) else None
    return message if isinstance(message, str) and message else text


def _excerpt(text: str) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= EXCERPT else flat[:EXCERPT] + "..."


def _str_or_none(value: Any) -> str | None:
    return value if isinstance(value, str) else None


_FENCE = re.compile(r"\A```[a-zA-Z]*\s*\n?(.*?)\n?```\Z", re.DOTALL)


def _strip_fence(text: str) -> str:
    """The JSON inside a Markdown code fence, which chat models add even in JSON mode."""
    text = text.strip()
    fenced = _FENCE.match(text)
    return fenced.group(1).strip() if fenced else text


def _annotate(span: Any, result: ChatResult, response_id: str | None) -> None:
    """GenAI response attributes of the ``chat {model}`` span."""
    span.set_attribute("gen_ai.response.model", result.model)
    if response_id is not None:
        span.set_attribute("gen_ai.response.id", response_id)
    span.set_attribute("gen_ai.usage.input_tokens", result.usage.input_tokens)
    span.set_attribute("gen_ai.usage.output_tokens", result.usage.output_tokens)
    if result.finish_reason is not None:
        span.set_attribute("gen_ai.response.finish_reasons", [result.finish_reason])
