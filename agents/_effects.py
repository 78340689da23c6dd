"""Effects: the one door through which anything non-deterministic enters an agent.

A model call, a tool call, the clock, a random draw: an agent makes each through an
:class:`Effects` runner, never directly. Live, the runner calls the function; recording, it
also stores the result keyed by (session, causing message id, ordinal within that message);
replaying, it serves the stored result without calling anything. That is what makes a failed
session replay exactly. The runtime (``pantheon``) supplies the recording and replaying
runners; this module has only the protocol and the live one.
"""

from __future__ import annotations

import contextlib
import inspect
import random
import time
from collections.abc import Callable
from contextvars import ContextVar
from typing import Any, Protocol, runtime_checkable

from bus import Tracer, current_envelope

__all__ = ["Effects", "LiveEffects", "RequestIdentity", "call_maybe_async", "genai_span"]

#: The bus's tracer while an agent handles a traced (sampled) message, else ``None``: set by
#: ``Agent`` around such a handling only, so untraced work pays one lookup per span site.
active_tracer: ContextVar[Tracer | None] = ContextVar("pantheon_agent_tracer", default=None)


def genai_span(
    operation: str, target: str, attributes: dict[str, Any], kind: str = "internal"
) -> contextlib.AbstractContextManager[Any] | None:
    """A GenAI span ``{operation} {target}`` (``invoke_agent``, ``execute_tool``, ``chat``)
    under the current one, carrying ``gen_ai.conversation.id`` = the session id; ``None``
    when the message being handled is not traced. Entering it yields an object with
    ``set_attribute(key, value)``; an exception leaving it marks the span failed."""
    tracer = active_tracer.get()
    if tracer is None:
        return None
    attrs: dict[str, Any] = {"gen_ai.operation.name": operation}
    env = current_envelope()
    if env is not None and env.session_id is not None:
        attrs["gen_ai.conversation.id"] = env.session_id
    attrs.update(attributes)
    return tracer.span(f"{operation} {target}", attrs, kind)


@runtime_checkable
class Effects(Protocol):
    """Runs a named side effect on behalf of the message being handled."""

    async def effect(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run ``fn(*args, **kwargs)`` (awaiting it if it is async) and return its result;
        a raised exception is part of the result and is raised again on replay."""
        ...

    async def now(self) -> float:
        """Wall-clock seconds, as an effect."""
        ...

    async def random(self) -> float:
        """A uniform float in [0, 1), as an effect."""
        ...


@runtime_checkable
class RequestIdentity(Protocol):
    """An object that can stand, in a recorded effect's request digest, for what about it
    decides the call's answer: a model provider for its server and model, a tool for its
    function. The recorder digests each effect's function and arguments; an argument or
    a bound object with no stable encoding leaves the call without a digest, and a what-if
    then decides it on the agent's whole configuration instead of on the request."""

    def request_identity(self) -> Any:
        """Plain data (or objects that have a request identity) naming what decides the
        answer; None: nothing does (a rate limiter changes when a call goes, not what it
        asks). Leave credentials out: they do not change the answer. Read once per object
        and kept while it lives (the recorder digests every call): it must not change."""


async def call_maybe_async(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


class LiveEffects:
    """Calls every effect for real and records nothing (plain runs and unit tests)."""

    def __init__(self, seed: int | None = None) -> None:
        self._random = random.Random(seed)

    async def effect(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return await call_maybe_async(fn, *args, **kwargs)

    async def now(self) -> float:
        return await self.effect("clock.now", time.time)

    async def random(self) -> float:
        return await self.effect("random.random", self._random.random)
