"""Small immutable policy objects, with the module-level defaults the bus uses."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from typing import Literal

__all__ = [
    "DEFAULT_BLOCK_TIMEOUT",
    "DEFAULT_BREAKER",
    "DEFAULT_MAX_QUEUE",
    "DEFAULT_PUBLISHER_BREAKER",
    "NO_RETRY",
    "BreakerPolicy",
    "Overflow",
    "Priority",
    "Retry",
]


class Priority(IntEnum):
    """Lower value is handled first: a waiting CRITICAL always precedes HIGH and NORMAL."""

    CRITICAL = 0
    HIGH = 1
    NORMAL = 2


Overflow = Literal["block", "shed", "reject"]

#: Mailbox bound per subscription. At ~200 bytes of bus overhead per message this caps a
#: stuck subscriber at a few MB instead of letting it eat the heap.
DEFAULT_MAX_QUEUE = 10_000
#: How long ``emit`` waits on a full mailbox under the ``block`` policy before QueueFullError.
DEFAULT_BLOCK_TIMEOUT = 5.0


@dataclass(frozen=True, slots=True)
class Retry:
    """How often a failing handler is retried before its message is dead-lettered.

    ``attempts`` counts every call, the first included (``attempts=1``: no retry). The wait
    before retry *n* (1-based) is ``backoff * multiplier ** (n - 1)``, capped at ``max_backoff``.
    """

    attempts: int = 1
    backoff: float = 0.0
    multiplier: float = 2.0
    max_backoff: float = 30.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"Retry.attempts must be >= 1, got {self.attempts}")
        if self.backoff < 0 or self.multiplier < 1 or self.max_backoff < 0:
            raise ValueError("Retry backoff must be >= 0 and multiplier >= 1")

    def delay(self, retry: int) -> float:
        """Seconds to wait before retry number ``retry`` (1 for the first retry)."""
        return min(self.backoff * self.multiplier ** (retry - 1), self.max_backoff)


NO_RETRY = Retry()


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    """When a circuit breaker opens, how long it stays open and how it probes.

    It opens after ``consecutive_failures`` failures in a row, or when at least ``min_calls``
    of the last ``window`` calls were made and the failure rate among them reaches
    ``failure_rate``. After ``cooldown`` seconds it half-opens and lets ``probes`` calls
    through; they close it if all succeed and reopen it on the first failure. ``cooldown``
    must be positive.

    A probe that has neither succeeded nor failed ``probe_timeout`` seconds after the breaker
    admitted it (a hung handler) counts as failed: the next call the breaker is asked about
    reopens it for another cooldown, instead of finding it half-open with no probe slot left
    forever. The default, 30 s, is well past any healthy handler; lower it for fast ones.
    """

    consecutive_failures: int = 5
    failure_rate: float = 0.5
    window: int = 20
    min_calls: int = 10
    cooldown: float = 5.0
    probes: int = 1
    probe_timeout: float = 30.0

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1 or self.window < 1 or self.min_calls < 1:
            raise ValueError("BreakerPolicy counts must be >= 1")
        if not 0.0 < self.failure_rate <= 1.0:
            raise ValueError(
                f"BreakerPolicy.failure_rate must be in (0, 1], got {self.failure_rate}"
            )
        # A zero cooldown half-opens at once: a breaker that keeps failing then trips as fast
        # as messages arrive and never sheds any load.
        if not self.cooldown > 0:
            raise ValueError(f"BreakerPolicy.cooldown must be > 0, got {self.cooldown}")
        if self.probes < 1:
            raise ValueError(f"BreakerPolicy.probes must be >= 1, got {self.probes}")
        if not self.probe_timeout > 0:
            raise ValueError(f"BreakerPolicy.probe_timeout must be > 0, got {self.probe_timeout}")


DEFAULT_BREAKER = BreakerPolicy()
#: Publisher side: a topic whose emits keep timing out on backpressure fails fast for a while.
DEFAULT_PUBLISHER_BREAKER = BreakerPolicy(
    consecutive_failures=3, failure_rate=1.0, window=3, min_calls=3, cooldown=1.0
)
