"""Scripted stand-ins for what an agent asks outside itself: a model that gives the answers a
test wrote, and an approval desk whose person is a script.

Both plug in where the real thing does (an agent's ``provider`` and ``desk``), so the agent
under test runs its own code unchanged, and both go through the agent's effects like the
real ones: the harness records each call, and a run records and replays them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agents import ApprovalUnavailable, ChatResult, Decision, ProviderError

__all__ = ["Answer", "ChatRequest", "Ruling", "ScriptedDesk", "ScriptedModel"]

#: One scripted model answer: text (the answer's ``content``), a mapping (its ``data``, sent
#: as JSON text), a whole :class:`agents.ChatResult`, or an exception to raise.
Answer = str | Mapping[str, Any] | ChatResult | BaseException

#: One scripted approval: ``True``/``False``, or ``(approved, note)``.
Ruling = bool | tuple[bool, str]


@dataclass(frozen=True, slots=True)
class ChatRequest:
    """What an agent asked a model: the messages and the call's options (``response_format``,
    ``tools``, ``temperature``...)."""

    messages: list[dict[str, Any]]
    options: dict[str, Any]


def _script(answers: Any, what: str) -> Callable[..., Any]:
    """The answer to call number ``n`` (0-based) from a script: one answer for every call, a
    sequence with one per call in order, or a callable of the call's arguments."""
    if callable(answers):
        return lambda n, *args: answers(*args)
    if isinstance(answers, Sequence) and not isinstance(answers, str | tuple):
        script = list(answers)

        def nth(n: int, *args: Any) -> Any:
            if n >= len(script):
                raise AssertionError(
                    f"the test scripted {len(script)} {what}(s) but was asked for number {n + 1}"
                )
            return script[n]

        return nth
    return lambda n, *args: answers


class ScriptedModel:
    """A model provider that answers from a script instead of a server.

    ``answers`` is one :data:`Answer` for every call, a list of them (one per call, in
    order; a call past the end fails the test), or a callable ``(messages, options) ->
    Answer``. Every request is kept in :attr:`requests`. The effect name is
    ``model.scripted.chat``; answers use no tokens."""

    name = "scripted"
    model = "scripted"

    def __init__(
        self,
        answers: Answer
        | Sequence[Answer]
        | Callable[[list[dict[str, Any]], dict[str, Any]], Answer],
    ) -> None:
        self._answer = _script(answers, "model answer")
        self.requests: list[ChatRequest] = []

    async def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        **options: Any,
    ) -> ChatResult:
        request = ChatRequest([dict(m) for m in messages], dict(options))
        self.requests.append(request)
        answer = self._answer(len(self.requests) - 1, request.messages, request.options)
        if isinstance(answer, BaseException):
            raise answer
        if isinstance(answer, ChatResult):
            return answer
        if isinstance(answer, str):
            return ChatResult(answer, model=self.model, finish_reason="stop")
        if isinstance(answer, Mapping):
            data = dict(answer)
            return ChatResult(json.dumps(data), data, model=self.model, finish_reason="stop")
        raise ProviderError(
            f"a scripted model answer is text, a mapping, a ChatResult or an exception, "
            f"not {type(answer).__name__}"
        )

    async def aclose(self) -> None:
        """Nothing to release."""


class ScriptedDesk:
    """An approval desk (:class:`agents.ApprovalDesk`) whose person is a script.

    ``rulings`` is one :data:`Ruling` for every request, a list of them (one per request, in
    order; a request past the end fails the test), or a callable ``(agent, request) ->
    Ruling``. Each request is kept in :attr:`requests` as ``(agent name, request)``; each
    decision is ``by`` the given name."""

    def __init__(
        self,
        rulings: Ruling | Sequence[Ruling] | Callable[[str, dict[str, Any]], Ruling],
        *,
        by: str = "test",
    ) -> None:
        self._ruling = _script(rulings, "approval")
        self.by = by
        self.requests: list[tuple[str, dict[str, Any]]] = []

    async def ask(self, agent: str, request: Mapping[str, Any]) -> Mapping[str, Any]:
        self.requests.append((agent, dict(request)))
        ruling = self._ruling(len(self.requests) - 1, agent, dict(request))
        approved, note = ruling if isinstance(ruling, tuple) else (ruling, "")
        if not isinstance(approved, bool):
            raise ApprovalUnavailable(
                f"a scripted approval is True, False or (approved, note), not {ruling!r}"
            )
        decision = Decision(len(self.requests), approved, note, self.by, time.time())
        return decision.to_dict()
