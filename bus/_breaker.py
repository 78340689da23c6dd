"""Circuit breakers: closed, open, half-open, on an injectable monotonic clock.

The model is resilience4j's count-based breaker. Closed, it watches the last ``window`` calls;
it opens on ``consecutive_failures`` in a row or when the failure rate over a window of at
least ``min_calls`` reaches ``failure_rate``. Open, it refuses every call until ``cooldown``
has passed on the clock; then it half-opens and admits ``probes`` calls (never every waiter:
calls beyond the probe budget are refused as if open). All probes succeeding closes it; one
probe failing reopens it for another cooldown, and so does a probe still unsettled
``probe_timeout`` after it was admitted (checked when a call is refused for want of a probe
slot, so a hung probe costs nothing until it matters). A probe abandoned without an outcome
(its task cancelled) gives its slot back with :meth:`CircuitBreaker.release`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from bus._clock import Clock
from bus._config import BreakerPolicy
from bus._errors import CircuitOpenError

__all__ = ["CLOSED", "HALF_OPEN", "OPEN", "CircuitBreaker"]

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

Listener = Callable[["CircuitBreaker", str, str, str], None]


class CircuitBreaker:
    """One breaker. ``on_change(breaker, old, new, reason)`` is called on every transition.

    The hot path reads ``dirty``: while the breaker is closed and its window holds no failure,
    a success changes nothing, so callers skip :meth:`record_success` entirely.
    """

    __slots__ = (
        "_consecutive",
        "_failures",
        "_half_open_calls",
        "_half_open_ok",
        "_on_change",
        "_opened_at",
        "_outcomes",
        "_probe_deadline",
        "clock",
        "dirty",
        "name",
        "policy",
        "state",
        "trips",
    )

    def __init__(
        self,
        name: str,
        policy: BreakerPolicy,
        clock: Clock,
        on_change: Listener | None = None,
    ) -> None:
        self.name = name
        self.policy = policy
        self.clock = clock
        self.state = CLOSED
        self.dirty = False
        self.trips = 0
        self._on_change = on_change
        self._outcomes: deque[bool] = deque(maxlen=policy.window)  # True = failure
        self._failures = 0
        self._consecutive = 0
        self._opened_at = 0.0
        self._half_open_calls = 0
        self._half_open_ok = 0
        self._probe_deadline = 0.0

    # -- admission -------------------------------------------------------------------------

    def retry_after(self) -> float:
        """Seconds until an open breaker half-opens (0 when it is not open)."""
        if self.state != OPEN:
            return 0.0
        return max(0.0, self._opened_at + self.policy.cooldown - self.clock.now())

    def try_acquire(self) -> bool:
        """Admit one call, moving open to half-open once the cooldown has passed."""
        state = self.state
        if state == CLOSED:
            return True
        if state == OPEN:
            if self.clock.now() < self._opened_at + self.policy.cooldown:
                return False
            self._transition(HALF_OPEN, "cooldown elapsed")
        if self._half_open_calls < self.policy.probes:
            if not self._half_open_calls:
                self._probe_deadline = self.clock.now() + self.policy.probe_timeout
            self._half_open_calls += 1
            return True
        if self.clock.now() >= self._probe_deadline:
            # A probe that hangs would otherwise hold its slot, and the breaker half-open
            # refusing everything, forever.
            self._transition(OPEN, f"probe unsettled after {self.policy.probe_timeout}s")
        return False

    def release(self) -> None:
        """Give back the probe slot of a call that ends with no outcome (it was cancelled):
        neither a success nor a failure, so the next call may probe instead."""
        if self.state == HALF_OPEN and self._half_open_calls > self._half_open_ok:
            self._half_open_calls -= 1
            if not self._half_open_calls:
                self._probe_deadline = 0.0

    def acquire(self) -> None:
        """Like :meth:`try_acquire` but raises :class:`CircuitOpenError` when refused."""
        if not self.try_acquire():
            raise CircuitOpenError(self.name, self.retry_after())

    # -- outcomes --------------------------------------------------------------------------

    def record_success(self) -> None:
        if self.state == HALF_OPEN:
            self._half_open_ok += 1
            if self._half_open_ok >= self.policy.probes:
                self._transition(CLOSED, f"{self._half_open_ok} probe(s) succeeded")
            return
        self._consecutive = 0
        self._push(False)
        self.dirty = self._failures > 0 or self.state != CLOSED

    def record_failure(self, prior_successes: int = 0) -> None:
        """Count a failure. ``prior_successes`` tells a clean breaker how many successes it
        skipped recording, so the failure rate of its first window is not overstated."""
        if self.state == HALF_OPEN:
            self._transition(OPEN, "probe failed")
            return
        if self.state == OPEN:
            return
        if not self.dirty:
            for _ in range(min(prior_successes, self.policy.window - 1)):
                self._push(False)
        self.dirty = True
        self._consecutive += 1
        self._push(True)
        policy = self.policy
        if self._consecutive >= policy.consecutive_failures:
            self._transition(OPEN, f"{self._consecutive} consecutive failures")
        elif (
            len(self._outcomes) >= policy.min_calls
            and self._failures / len(self._outcomes) >= policy.failure_rate
        ):
            rate = self._failures / len(self._outcomes)
            self._transition(OPEN, f"failure rate {rate:.0%} over {len(self._outcomes)} calls")

    def _push(self, failed: bool) -> None:
        outcomes = self._outcomes
        if len(outcomes) == outcomes.maxlen and outcomes[0]:
            self._failures -= 1
        outcomes.append(failed)
        if failed:
            self._failures += 1

    # -- manual control --------------------------------------------------------------------

    def force_open(self, reason: str = "forced open") -> None:
        """Open now and stay open for one cooldown, whatever the window says."""
        self._transition(OPEN, reason)

    def reset(self, reason: str = "reset") -> None:
        """Close now and forget every recorded outcome."""
        self._transition(CLOSED, reason)

    def _transition(self, new: str, reason: str) -> None:
        old = self.state
        self.state = new
        self._half_open_calls = 0
        self._half_open_ok = 0
        if new == OPEN:
            self._opened_at = self.clock.now()
            self.trips += 1
            self.dirty = True
        elif new == CLOSED:
            self._outcomes.clear()
            self._failures = 0
            self._consecutive = 0
            self.dirty = False
        else:
            self.dirty = True
        if old != new and self._on_change is not None:
            self._on_change(self, old, new, reason)
