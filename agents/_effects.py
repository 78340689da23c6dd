"""Effects: the one door through which anything non-deterministic enters an agent.

A model call, a tool call, the clock, a random draw: an agent makes each through an
:class:`Effects` runner, never directly. Live, the runner calls the function; recording, it
also stores the result keyed by (session, causing message id, ordinal within that message);
replaying, it serves the stored result without calling anything. That is what makes a failed
session replay exactly. The runtime (``pantheon``) supplies the recording and replaying
runners; this module has only the protocol and the live one.
"""

from __future__ import annotations

import inspect
import random
import time
from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["Effects", "LiveEffects", "call_maybe_async"]


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
