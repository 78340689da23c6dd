"""How the outside watches a bus: one observer protocol, the tracer it may carry, sampling.

Recorders, live feeds, metrics and tracers all attach the same way, ``bus.observe(obs)``,
and detach by closing the handle it returns. The bus keeps one tuple of bound methods per
event kind, rebuilt whenever an observer comes or goes, so the hot path loops over a tuple
that is usually empty: a method an observer does not define costs nothing per message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

import msgspec

from bus._dlq import DeadLetter
from bus._envelope import Envelope

__all__ = [
    "UNSAMPLED",
    "BreakerEvent",
    "BusObserver",
    "Delivery",
    "Hooks",
    "ObserverHandle",
    "Tracer",
    "is_sampled",
]

#: Last hex digit of a W3C ``traceparent`` whose ``sampled`` flag (bit 0) is set.
SAMPLED_DIGITS = "13579bdf"
#: The trace context of a message whose root a tracer declined to sample: W3C flags ``00``
#: and no ids (making them would cost every unsampled root what skipping a span saves).
#: Descendants inherit it, and the bus recognises this very object by identity.
UNSAMPLED = "00-00000000000000000000000000000000-0000000000000000-00"


def is_sampled(trace: str | None) -> bool:
    """Whether a W3C ``traceparent`` carries the sampled flag (``None``: no trace context)."""
    return trace is not None and trace is not UNSAMPLED and trace[-1] in SAMPLED_DIGITS


class Delivery(msgspec.Struct, gc=False, array_like=True, frozen=True):
    """One handling of one message by one subscription, as observers see it.

    ``started`` and ``ended`` are ``time.monotonic_ns()``; ``outcome`` is ``delivered``,
    ``failed`` (retries exhausted) or ``circuit_open``. A message retried after a backoff
    is one delivery, from its first attempt's start to its last attempt's end. A C-built
    Struct because a recorder gets one per delivery."""

    subscriber: str
    envelope: Envelope
    started: int
    ended: int
    outcome: str


class BreakerChange(msgspec.Struct, frozen=True):
    """A breaker changed state: ``breaker`` is its name (a subscription's name, or
    ``publish:<topic>`` for a publisher breaker); ``old``/``new`` are ``closed``, ``open`` or
    ``half_open``; ``time`` is wall-clock seconds.

    Defined once, here: observers get a :class:`BreakerEvent` (this and the breaker's counts
    at the change), and a session store reads a recorded one back as this plus its row
    number and the process whose breaker it was."""

    time: float
    breaker: str
    old: str
    new: str
    reason: str | None


class BreakerEvent(BreakerChange, frozen=True):
    """A breaker's change as the bus tells observers: the change, the trips so far and the
    seconds until an open breaker lets a probe through."""

    reason: str  # the bus always says why
    trips: int
    retry_after: float


class BusObserver(Protocol):
    """What ``bus.observe`` accepts. Every method is optional: define only those you need.

    * ``on_publish(env)``: every envelope this bus publishes or receives from another bus,
      before any subscription sees it.
    * ``on_delivery(d)``: after every handling (:class:`Delivery`).
    * ``on_dead_letter(dl)``: every :class:`~bus.DeadLetter` as it is listed.
    * ``on_breaker(ev)``: every breaker transition (:class:`BreakerEvent`); the same change
      is also published as ``system.breaker.<name>``.

    An observer that also has ``start_process`` is a :class:`Tracer` (at most one per bus).
    Observers run inline on the bus's loop: they must be quick and must not raise.
    """


class Tracer(Protocol):
    """What the bus tells the tracer given to ``bus.observe`` (at most one per bus).

    The bus knows nothing of OpenTelemetry; ``pantheon.telemetry`` implements this with the
    SDK. The bus calls the tracer only for messages that need it, so an unsampled message
    costs an identity test and no call:

    * ``skip``: how many upcoming roots (envelopes with ``trace`` ``None``) the tracer has
      already declined. The bus stamps those with :data:`UNSAMPLED` itself, counting
      ``skip`` down, so declining a root costs no call either.
    * ``on_publish(env)`` for each other envelope this bus publishes whose ``trace`` is
      ``None`` (a root: the tracer decides sampling once and must set ``env.trace``; every
      descendant inherits it) or sampled. A sampled envelope arriving from another bus is not
      re-published: its process spans parent to the remote producer.
    * ``start_process(subscription, env)`` before a subscription handles a sampled envelope;
      whatever it returns goes to ``end_process(token, outcome, error)`` after, with the
      outcome a :class:`Delivery` gets and the first exception raised. Both run in the
      worker's task, so the tracer may keep the current span in a context variable that
      emits inside the handler read. One span covers every attempt: an attempt that failed
      and waits for a retry ends with outcome ``retrying`` (deactivate, keep the span open),
      and the next attempt, maybe in another worker, begins with ``resume_process(token)``.
    * ``span(name, attributes, kind)``: a context manager for a child of the current span,
      or ``None`` when there is no sampled span to be a child of (agents use it for their
      GenAI spans; ``kind`` is ``"internal"`` or ``"client"``).
    """

    skip: int

    def on_publish(self, env: Envelope) -> None: ...

    def start_process(self, subscription: str, env: Envelope) -> Any: ...

    def resume_process(self, token: Any) -> None: ...

    def end_process(self, token: Any, outcome: str, error: BaseException | None) -> None: ...

    def span(
        self, name: str, attributes: dict[str, Any], kind: str = "internal"
    ) -> contextlib.AbstractContextManager[Any] | None: ...


class ObserverHandle:
    """Returned by ``bus.observe``: ``close()`` detaches exactly that observer (idempotent).
    ``refresh()`` re-reads the observer's methods, for an observer that rebinds one (a
    recorder pointing ``on_publish`` at a fresh buffer's ``append``)."""

    __slots__ = ("_hooks", "observer")

    def __init__(self, hooks: Hooks, observer: object) -> None:
        self._hooks = hooks
        self.observer = observer

    @property
    def closed(self) -> bool:
        return not any(o is self.observer for o in self._hooks.observers)

    def refresh(self) -> None:
        self._hooks.rebuild()

    def close(self) -> None:
        self._hooks.detach(self.observer)

    def __enter__(self) -> ObserverHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Hooks:
    """The observers of one bus, and the per-event tuples the hot path reads.

    ``changed`` is called after every rebuild (the bus hands the dead-letter tuple to its
    DLQ there)."""

    __slots__ = ("breaker", "changed", "dead_letter", "delivery", "observers", "publish", "tracer")

    def __init__(self, changed: Callable[[Hooks], None]) -> None:
        self.changed = changed
        self.observers: tuple[object, ...] = ()
        self.publish: tuple[Callable[[Envelope], None], ...] = ()
        self.delivery: tuple[Callable[[Delivery], None], ...] = ()
        self.dead_letter: tuple[Callable[[DeadLetter], None], ...] = ()
        self.breaker: tuple[Callable[[BreakerEvent], None], ...] = ()
        self.tracer: Tracer | None = None

    def attach(self, observer: object) -> ObserverHandle:
        if any(o is observer for o in self.observers):
            raise ValueError(f"{observer!r} already observes this bus")
        if hasattr(observer, "start_process") and self.tracer is not None:
            raise ValueError(f"this bus already has a tracer ({self.tracer!r})")
        if not any(
            hasattr(observer, m)
            for m in ("on_publish", "on_delivery", "on_dead_letter", "on_breaker")
        ):
            raise TypeError(
                f"{observer!r} has none of on_publish, on_delivery, on_dead_letter, on_breaker"
            )
        self.observers += (observer,)
        self.rebuild()
        return ObserverHandle(self, observer)

    def detach(self, observer: object) -> None:
        self.observers = tuple(o for o in self.observers if o is not observer)
        self.rebuild()

    def rebuild(self) -> None:
        obs = self.observers
        tracers = [o for o in obs if hasattr(o, "start_process")]
        self.tracer = tracers[0] if tracers else None  # type: ignore[assignment]
        # A tracer's on_publish has its own contract (roots and sampled messages only).
        self.publish = tuple(
            o.on_publish for o in obs if hasattr(o, "on_publish") and o is not self.tracer
        )
        self.delivery = tuple(o.on_delivery for o in obs if hasattr(o, "on_delivery"))
        self.dead_letter = tuple(o.on_dead_letter for o in obs if hasattr(o, "on_dead_letter"))
        self.breaker = tuple(o.on_breaker for o in obs if hasattr(o, "on_breaker"))
        self.changed(self)
