"""The dead letter queue: every message the bus could not deliver, with why."""

from __future__ import annotations

import itertools
import linecache
import operator
import time
import traceback
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, fields
from types import TracebackType
from typing import Any, Literal, Self, get_args

from bus._envelope import Envelope

__all__ = ["DEFAULT_DLQ_SIZE", "DeadLetter", "DeadLetterQueue", "DeadLetterRecord"]

#: Entries kept in memory. When full the oldest entry is evicted and counted in ``evicted``;
#: a recording session has already persisted it, so eviction bounds memory, not the record,
#: and ``totals`` still counts it.
DEFAULT_DLQ_SIZE = 10_000

_time = time.time


def traceback_text(exc: BaseException) -> str:
    """``exc``'s traceback as text for a dead letter: every frame, source line and chained
    exception, as ``traceback.format_exception`` prints them minus CPython 3.11's ``^^^^``
    markers.

    The standard path costs 100+ µs per dead letter, which alone made 1% poison messages
    take 10% of the other subscribers' throughput: placing the markers parses each frame's
    line, finding a frame's position scans its code object's position table up to the
    failing instruction (long for the worker loop), and ``linecache.checkcache`` stats
    every file. Here a frame is its ``tb_lineno`` and the line comes from linecache's
    cache, as a traceback printed at the time would show it. This runs where a message is
    being dead-lettered, so it never raises: should formatting fail, the standard text, or
    at least the exception's name, is what the dead letter keeps."""
    try:
        return _text(exc)
    except Exception:
        try:
            return "".join(traceback.format_exception(exc))
        except Exception:
            return f"{type(exc).__qualname__} (its traceback could not be formatted)\n"


_CAUSE = "\nThe above exception was the direct cause of the following exception:\n\n"
_CONTEXT = "\nDuring handling of the above exception, another exception occurred:\n\n"


def _text(exc: BaseException) -> str:
    # The chain is walked, not recursed: a client that re-raises ``from`` its last error
    # on every retry builds chains a thousand long.
    chain: list[tuple[BaseException, str]] = []  # newest first, with what links it back
    seen: set[int] = set()
    link: BaseException | None = exc
    while link is not None:
        seen.add(id(link))
        cause, context = link.__cause__, link.__context__
        if cause is not None and id(cause) not in seen:
            chain.append((link, _CAUSE))
            link = cause
        elif context is not None and not link.__suppress_context__ and id(context) not in seen:
            chain.append((link, _CONTEXT))
            link = context
        else:
            chain.append((link, ""))
            link = None
    out: list[str] = []
    for one, joined in reversed(chain):  # oldest first, each link before the newer one
        if joined:
            out.append(joined)
        _one(one, out)
    return "".join(out)


def _one(exc: BaseException, out: list[str]) -> None:
    """One exception of a chain: its frames and its last line."""
    if isinstance(exc, BaseExceptionGroup):
        # Rare in a handler, and its nested tracebacks need the standard layout.
        out.extend(traceback.format_exception(exc, chain=False))
        return
    tb = exc.__traceback__
    if tb is not None:
        out.append("Traceback (most recent call last):\n")
        _frames(tb, out)
    if isinstance(exc, SyntaxError) or getattr(exc, "__notes__", None):
        out.extend(traceback.format_exception_only(exc))
        return
    kind = type(exc)
    name = kind.__qualname__
    module = kind.__module__
    if not isinstance(module, str):
        name = f"<unknown>.{name}"
    elif module not in ("__main__", "builtins"):
        name = f"{module}.{name}"
    try:
        value = str(exc)
    except Exception:
        value = "<exception str() failed>"
    out.append(f"{name}: {value}\n" if value else f"{name}\n")


#: A frame line repeated more often than this in a row (recursion) is summarized, as the
#: standard traceback does.
_REPEATS = 3


def _frames(tb: TracebackType, out: list[str]) -> None:
    last = None
    repeated = 0
    for frame, lineno in traceback.walk_tb(tb):
        code = frame.f_code
        here = (code.co_filename, lineno, code.co_name)
        if here == last:
            repeated += 1
            if repeated >= _REPEATS:
                continue
        else:
            if repeated >= _REPEATS:
                out.append(_repeats(repeated))
            last, repeated = here, 0
        out.append(f'  File "{here[0]}", line {lineno}, in {here[2]}\n')
        if here[0] not in linecache.cache:
            # A module from a zip or another loader: its source comes from the loader.
            linecache.lazycache(here[0], frame.f_globals)
        line = linecache.getline(here[0], lineno).strip()
        if line:
            out.append(f"    {line}\n")
    if repeated >= _REPEATS:
        out.append(_repeats(repeated))


def _repeats(repeated: int) -> str:
    more = repeated - _REPEATS + 1
    return f"  [Previous line repeated {more} more time{'s' if more > 1 else ''}]\n"


#: Why a message is dead-lettered: the bus's reasons, the agents' ``budget`` (a model call
#: refused by a spent budget, a refusal's own reason) and the ZeroMQ transport's
#: ``node_lost``. Defined once, here: a scenario's expectations name these.
DeadLetterReason = Literal[
    "failed",
    "circuit_open",
    "shed",
    "filter_error",
    "bus_closed",
    "unsubscribed",
    "node_lost",
    "budget",
]
REASONS: tuple[DeadLetterReason, ...] = get_args(DeadLetterReason)


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """A dead letter as every layer keeps it: which message (``envelope_id`` on ``topic``),
    the subscription it was meant for, why, and after how many attempts.

    Defined once, here: each layer's dead letter is one of these plus what that layer adds
    (the bus's :class:`DeadLetter` its envelope and wall time, the NATS DLQ stream's its
    node and subject, the session store's the redrive that took it back, the read model's
    and the live feed's the payload and the request), built with :meth:`of`. ``reason``:
    see :class:`DeadLetter`."""

    entry_id: int
    envelope_id: int
    topic: str
    subscriber: str
    reason: str
    error_type: str | None
    error: str | None
    traceback: str | None
    attempts: int

    @classmethod
    def of(cls, record: DeadLetterRecord, **added: Any) -> Self:
        """``record``'s shared fields with the ones ``cls`` adds (``added``, by name)."""
        # The shared fields come first in every subclass, so they go positionally: 2.4 µs
        # a read-model view against 2.1 naming each field (min of 15 interleaved runs).
        return cls(*_shared(record), **added)


_shared = operator.attrgetter(*(f.name for f in fields(DeadLetterRecord)))


@dataclass(frozen=True, slots=True)
class DeadLetter(DeadLetterRecord):
    """One undeliverable message: the envelope, the subscription it was meant for and why.

    ``reason`` is one of ``failed`` (retries exhausted), ``circuit_open``, ``shed``,
    ``filter_error``, ``bus_closed``, ``unsubscribed``, from a transport, ``malformed``
    (bytes no subscriber could decode: the payload is their size and reason) or a refusal's
    own: a handler's exception with a string attribute ``dead_letter_reason`` is not retried
    and is dead-lettered under that reason (the agents' ``BudgetExceeded``: ``budget``). ``time`` is
    wall-clock seconds; ``envelope_id`` and ``topic`` are the envelope's.
    """

    envelope: Envelope
    time: float


#: A shed message as the queue keeps it until someone reads it.
_Shed = tuple[int, Envelope, str, float]  # entry_id, envelope, subscriber, time


class DeadLetterQueue:
    """Bounded, ordered store of :class:`DeadLetter` entries; list them, redrive them.

    At most ``max_entries`` are kept: past that the oldest is evicted (``evicted`` counts
    them). ``totals`` counts every entry ever added, by reason, evicted or not, so a report
    of how many messages died does not stop at the cap.

    Shed messages are the one kind that comes in floods (a runaway publisher against a
    ``shed`` mailbox), and shedding must cost no more than delivering: :meth:`shed` appends
    a bare tuple to a ring of its own (the newest ``max_entries`` sheds), and the
    :class:`DeadLetter` is built only when the entry is read, or at once when an observer
    wants every one. A subscription shedding a flood lists only a sample of it (see
    ``bus._subscription.SHED_SAMPLE``) and counts the rest in ``unlisted_sheds``. The record
    of sheds is thus a bounded sample, while ``totals["shed"]`` and the subscription's
    ``shed`` count stay exact. ``observers`` is set by the bus.
    """

    def __init__(
        self,
        redeliver: Callable[[DeadLetter], Awaitable[bool]],
        max_entries: int = DEFAULT_DLQ_SIZE,
    ) -> None:
        self._entries: OrderedDict[int, DeadLetter] = OrderedDict()
        self._shed: deque[_Shed] = deque(maxlen=max_entries)
        self._shed_total = 0
        self._shed_taken = 0  # sheds moved out of the ring (read, or cleared)
        #: How many sheds were counted but not listed (a subscription lists a sample of a
        #: flood of them); the bus sets this to sum its subscriptions' counts.
        self.unlisted_sheds: Callable[[], int] = _none
        self._next_id = itertools.count(1).__next__
        self._redeliver = redeliver
        self.max_entries = max_entries
        self._evicted = 0
        self._totals: dict[str, int] = {}
        self.observers: tuple[Callable[[DeadLetter], None], ...] = ()

    @property
    def evicted(self) -> int:
        """Entries dropped to keep the bound (sheds included), as if all were one store."""
        pending = len(self._shed)
        return (
            self._evicted
            + self.unlisted_sheds()
            + (self._shed_total - pending - self._shed_taken)  # fell off the ring
            + max(0, len(self._entries) + pending - self.max_entries)  # merging will drop
        )

    @property
    def totals(self) -> dict[str, int]:
        """Entries ever added, by reason (a fresh dict)."""
        totals = dict(self._totals)
        shed = self._shed_total + self.unlisted_sheds()
        if shed:
            totals["shed"] = shed
        return totals

    def __len__(self) -> int:
        return min(len(self._entries) + len(self._shed), self.max_entries)

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
            entry_id=self._next_id(),
            envelope_id=envelope.id,
            topic=envelope.topic,
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
        self._totals[reason] = self._totals.get(reason, 0) + 1
        if len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
            self._evicted += 1
        for observer in self.observers:
            observer(entry)
        return entry

    def shed(self, envelope: Envelope, subscriber: str) -> None:
        """List a shed message: what :meth:`add` does, minus building the record now."""
        self._shed_total += 1
        kept = (self._next_id(), envelope, subscriber, _time())
        self._shed.append(kept)
        if self.observers:
            entry = _built(kept)
            for observer in self.observers:
                observer(entry)

    def _materialize(self) -> None:
        """Move the kept sheds into the ordered store, as records (reading needs them)."""
        if not self._shed:
            return
        sheds = sorted(self._shed)
        self._shed_taken += len(sheds)
        self._shed.clear()
        merged = [*self._entries.values(), *map(_built, sheds)]
        merged.sort(key=_entry_id)
        over = len(merged) - self.max_entries
        if over > 0:
            self._evicted += over
            del merged[:over]
        self._entries = OrderedDict((e.entry_id, e) for e in merged)

    def entries(
        self, *, subscriber: str | None = None, reason: str | None = None
    ) -> list[DeadLetter]:
        """Entries oldest first, optionally only one subscriber's or one reason's."""
        self._materialize()
        return [
            e
            for e in self._entries.values()
            if (subscriber is None or e.subscriber == subscriber)
            and (reason is None or e.reason == reason)
        ]

    def get(self, entry_id: int) -> DeadLetter:
        self._materialize()
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
        self._materialize()
        ids = list(self._entries) if entry_ids is None else list(entry_ids)
        done = 0
        for entry_id in ids:
            entry = self.get(entry_id)
            if await self._redeliver(entry):
                self._entries.pop(entry_id, None)
                done += 1
        return done

    def clear(self) -> None:
        self._shed_taken += len(self._shed)
        self._shed.clear()
        self._entries.clear()


def _none() -> int:
    return 0


def _built(kept: _Shed) -> DeadLetter:
    entry_id, envelope, subscriber, when = kept
    return DeadLetter(
        entry_id, envelope.id, envelope.topic, subscriber, "shed", None, None, None, 0,
        envelope, when,
    )  # fmt: skip


def _entry_id(entry: DeadLetter) -> int:
    return entry.entry_id
