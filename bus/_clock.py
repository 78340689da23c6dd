"""The time source breakers and retries read, injectable so tests can move time by hand."""

from __future__ import annotations

import asyncio
import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    """Monotonic seconds and a sleep that honours them.

    Breakers and retry backoff use only this, never the wall clock, so a test can drive a
    cooldown with :class:`bus.testing.FakeClock` instead of sleeping.
    """

    def now(self) -> float: ...

    async def sleep(self, seconds: float) -> None: ...


class SystemClock:
    """``time.monotonic`` and ``asyncio.sleep``."""

    __slots__ = ()

    def now(self) -> float:
        return time.monotonic()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)
