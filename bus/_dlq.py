"""The dead letter queue: every message the bus could not deliver, with why."""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass

from bus._envelope import Envelope

__all__ = ["DEFAULT_DLQ_SIZE", "DeadLetter", "DeadLetterQueue"]

#: Entries kept in memory. When full the oldest entry is evicted and counted in ``evicted``;
#: a recording session has already persisted it, so eviction bounds memory, not the record,
#: and ``totals`` still counts it.
DEFAULT_DLQ_SIZE = 10_000

REASONS = ("failed", "circuit_open", "shed", "filter_error", "bus_closed", "unsubscribed")


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One undeliverable message: the envelope, the subscription it was meant for and why.

    ``reason`` is one of ``failed`` (retries exhausted), ``circuit_open``, ``shed``,
    ``filter_error``, ``bus_closed`` or ``unsubscribed``. ``time`` is wall-clock seconds.
    """

    entry_id: int
    envelope: Envelope
    subscriber: str
    reason: str
    error_type: str | None
    error: str | None
    traceback: str | None
    attempts: int
    time: float


class DeadLetterQueue:
    """Bounded, ordered store of :class:`DeadLetter` entries; list them, redrive them.

    At most ``max_entries`` are kept: past that the oldest is evicted (``evicted`` counts
    them). ``totals`` counts every entry ever added, by reason, evicted or not, so a report
    of how many messages died does not stop at the cap.
    """

    def __init__(
        self,
        redeliver: Callable[[DeadLetter], Awaitable[bool]],
        max_entries: int = DEFAULT_DLQ_SIZE,
    ) -> None:
        self._entries: OrderedDict[int, DeadLetter] = OrderedDict()
        self._ids = itertools.count(1)
        self._redeliver = redeliver
        self.max_entries = max_entries
        self.evicted = 0
        self.totals: dict[str, int] = {}
        self.listeners: list[Callable[[DeadLetter], None]] = []

    def __len__(self) -> int:
        return len(self._entries)

    def add(
        self,
        envelope: Envelope,
        subscriber: str,
        reason: str,
        exc: BaseException | None = None,
        traceback: str | None = None,
        attempts: int = 0,
    ) -> DeadLetter:
        entry = DeadLetter(
            entry_id=next(self._ids),
            envelope=envelope,
            subscriber=subscriber,
            reason=reason,
            error_type=type(exc).__name__ if exc is not None else None,
            error=str(exc) if exc is not None else None,
            traceback=traceback,
            attempts=attempts,
            time=time.time(),
        )
        self._entries[entry.entry_id] = entry
        self.totals[reason] = self.totals.get(reason, 0) + 1
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self.evicted += 1
        for listener in self.listeners:
            listener(entry)
        return entry

    def entries(
        self, *, subscriber: str | None = None, reason: str | None = None
    ) -> list[DeadLetter]:
        """Entries oldest first, optionally only one subscriber's or one reason's."""
        return [
            e
            for e in self._entries.values()
            if (subscriber is None or e.subscriber == subscriber)
            and (reason is None or e.reason == reason)
        ]

    def get(self, entry_id: int) -> DeadLetter:
        try:
            return self._entries[entry_id]
        except KeyError:
            raise KeyError(f"no dead letter with id {entry_id}") from None

    async def redrive(self, entry_ids: Iterable[int] | None = None) -> int:
        """Re-publish entries to the subscription that failed them; returns how many went.

        An entry leaves the queue only once its subscription took it back; one whose
        subscription is gone stays listed. Redriven messages skip the subscription's filter
        and sampling (they were chosen once already) but not its overflow policy.
        """
        ids = list(self._entries) if entry_ids is None else list(entry_ids)
        done = 0
        for entry_id in ids:
            entry = self.get(entry_id)
            if await self._redeliver(entry):
                self._entries.pop(entry_id, None)
                done += 1
        return done

    def clear(self) -> None:
        self._entries.clear()
