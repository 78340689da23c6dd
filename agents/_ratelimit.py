"""Client-side rate limits on model calls: requests and tokens per window, per provider model.

A server that meters a key (requests and tokens per minute) answers 429 past its limit; a
team of concurrent agents reaches it at once and then spends its retries waiting. A
:class:`RateLimiter` keeps the team under the limit instead: each call takes its turn (a
FIFO queue: calls wait on a lock and a timed sleep, never a busy loop) until the last
``window`` seconds hold fewer than ``requests`` calls and fewer than ``tokens`` tokens. The
window is a log of the calls admitted in it (a sliding window, exact: no burst at a window's
edge), bounded by ``requests`` entries, or by the calls one window admits.

Tokens are known only when the answer comes, so a call counts its tokens when it settles
(:meth:`RateLimiter.settle`); calls admitted while others are in flight may pass the token
limit by what those use, as with any client that cannot know an answer's size ahead.

A 429 the server still sends is the provider's to retry: :class:`agents.OpenAIProvider`
honours ``Retry-After`` before trying again.

The limiter waits only live: it runs inside the model call's effect, which a replay serves
from the record without calling anything.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass

from bus import Clock, SystemClock

__all__ = ["RateLimit", "RateLimiter"]


@dataclass(frozen=True, slots=True)
class RateLimit:
    """At most ``requests`` calls and ``tokens`` tokens in any ``window`` seconds (60: per
    minute); ``None``: no limit on that measure."""

    requests: int | None = None
    tokens: int | None = None
    window: float = 60.0

    def __post_init__(self) -> None:
        for what, n in (("requests", self.requests), ("tokens", self.tokens)):
            if n is not None and n < 1:
                raise ValueError(f"a rate limit's {what} must be at least 1, got {n}")
        if not self.window > 0:
            raise ValueError(f"a rate limit's window must be positive, got {self.window}")


class RateLimiter:
    """Admits calls under a :class:`RateLimit`, in the order they asked, on ``clock``."""

    __slots__ = ("_log", "_turn", "admitted", "clock", "limit", "waited")

    def __init__(self, limit: RateLimit, clock: Clock | None = None) -> None:
        self.limit = limit
        self.clock: Clock = clock or SystemClock()
        #: [admitted at, tokens] per call admitted in the last window, oldest first.
        self._log: deque[list[float]] = deque()
        self._turn = asyncio.Lock()
        #: Calls admitted, and how many of them had to wait (queued or slept).
        self.admitted = 0
        self.waited = 0

    def request_identity(self) -> None:
        """Nothing: a limiter decides when a call goes, not what it asks or is answered
        (see :class:`agents.RequestIdentity`)."""
        return None

    def _prune(self, now: float) -> None:
        log = self._log
        horizon = now - self.limit.window
        while log and log[0][0] <= horizon:
            log.popleft()

    def _wait_for(self, now: float) -> float:
        """Seconds until a call may go (0: now)."""
        limit, log = self.limit, self._log
        if not log:
            return 0.0
        delay = 0.0
        if limit.requests is not None and len(log) >= limit.requests:
            delay = log[len(log) - limit.requests][0] + limit.window - now
        if limit.tokens is not None:
            held = sum(entry[1] for entry in log)
            for entry in log:  # oldest first: the wait until enough of them leave the window
                if held < limit.tokens:
                    break
                held -= entry[1]
                delay = max(delay, entry[0] + limit.window - now)
        return max(delay, 0.0)

    async def acquire(self) -> list[float]:
        """Wait for this call's turn; returns its log entry, for :meth:`settle`."""
        waited = self._turn.locked()  # queued behind a call waiting for its turn
        async with self._turn:  # asyncio.Lock wakes waiters first come, first served
            while True:
                now = self.clock.now()
                self._prune(now)
                delay = self._wait_for(now)
                if delay <= 0:
                    break
                waited = True
                await self.clock.sleep(delay)
            entry = [now, 0.0]
            self._log.append(entry)
            self.admitted += 1
            self.waited += waited
            return entry

    def settle(self, entry: list[float], tokens: int) -> None:
        """Count the tokens the call admitted as ``entry`` used."""
        entry[1] = float(tokens)
