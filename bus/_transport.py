"""The seam between a bus and the buses it talks to.

A :class:`Transport` moves envelopes between :class:`~bus.Bus` instances. The bus keeps its
own mailboxes, breakers and metrics; a transport answers one question and does three jobs:

* ``has_remote(topic)``: does any *other* bus subscribe to this topic? The bus caches the
  answer per topic with its local routes and drops the cache when ``on_change`` fires.
* ``try_send(envelope)`` / ``send(envelope)``: hand the envelope to every other bus that
  subscribes to its topic. ``try_send`` never waits: it returns ``False`` when the envelope
  would have to wait for credit (a slow receiver), and the bus then awaits ``send``, which
  waits for room. Local subscribers are never sent anything.
* ``advertise(subscriptions)``: tell the others which ``(name, pattern)`` pairs this bus now
  subscribes with. Subscriptions with the same name on several buses are one consumer
  group: a transport that supports groups hands each message to one member only.
  ``subscriptions`` is a one-shot iterable over the bus's live index, not a copy (copying
  made every runtime subscribe O(subscriptions)): read it once, now or at the first time it
  is needed; the bus advertises again after every change, so the latest one read is current.
* ``flush()``: wait until everything handed over so far is settled by its receivers
  (handled or dead-lettered there), so ``Bus.drain`` covers remote work too.
* ``fed_remotely``: subscription names the bus must not serve in memory from its own
  publishes; the transport brings them back (a durable log feeding a group with members in
  several processes), with a receipt marked ``looped`` so the bus counts and observes each
  message once.
* ``sync()``: wait until this bus's subscriptions are visible to every other bus. Across
  processes advertising is eventually consistent; a test or a startup sequence that needs
  "subscribed everywhere before the first publish" awaits this barrier instead of sleeping.

What the bus offers back is a :class:`BusPort`, given to ``start``: ``deliver(env, names)``
puts an inbound envelope into the local mailboxes (only those named, when ``names`` is not
``None``) and returns ``None``, or an awaitable when a ``block`` mailbox is full;
``dead_letter`` lists an envelope a transport could not deliver in the bus's own DLQ;
``session_id`` is the bus's session when it started, for a transport whose peers outlive
one run (a durable log) to keep each session's traffic apart.

A transport that needs to know when a receiving bus has finished with an inbound envelope
puts a :class:`Receipt` in ``envelope.reply`` before ``deliver``: the bus settles it once per
subscription that took the envelope, when that subscription handled it (with the handler's
result) or dead-lettered it (with the error). A closing bus that will not handle it gives it
back instead (``Receipt.release``, or a settle with :class:`~bus.BusClosedError`): a transport
that can redeliver hands it to another member rather than counting it settled. A request's
reply future is the in-process special case of the same slot.

Resource contract: ``start`` is awaited once before anything else; ``aclose`` is awaited
once, after which ``send`` and ``try_send`` raise :class:`~bus.TransportError`. A transport
owns whatever sockets or tasks it opens and releases them in ``aclose``.

:class:`InProcessTransport` is the default: without a hub it has no peers, so every route
is local and ``send`` is never called. Buses sharing an :class:`InProcessHub` see each other
as a broker's nodes would, zero copy, which is what the contract suite checks every
transport against.
"""

from __future__ import annotations

import abc
import asyncio
from collections.abc import Awaitable, Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

from bus._envelope import Envelope
from bus._errors import BusClosedError, TransportError
from bus._topics import GlobIndex

__all__ = ["BusPort", "InProcessHub", "InProcessTransport", "Receipt", "Transport"]

Deliver = Callable[[Envelope, Collection[str] | None], Awaitable[None] | None]
DeadLetter = Callable[[Envelope, str, str, BaseException | None], None]


@dataclass(frozen=True, slots=True)
class BusPort:
    """What a bus hands its transport: the way in for remote envelopes, and its DLQ.

    ``deliver(env, names)`` raises :class:`~bus.BusClosedError` once the bus stopped taking
    messages; the transport must then leave the envelope to its other receivers.
    ``dead_letter(env, subscriber, reason, error)`` records a message the transport could not
    deliver to a remote subscriber (e.g. reason ``node_lost``) in the publishing bus's DLQ.
    ``session_id`` is the bus's session (None without one): a transport whose stream outlives
    a run (NATS) serves each session only its own messages, never an earlier run's leftovers.
    """

    deliver: Deliver
    dead_letter: DeadLetter
    session_id: str | None = None


def wake(waiters: list[asyncio.Future[None]]) -> None:
    """Release every waiter. A transport's waiters (for idle, for a sync, for room) each
    check their own condition again when woken, so waking all of them is always safe."""
    while waiters:
        fut = waiters.pop()
        if not fut.done():
            fut.set_result(None)


class Receipt:
    """Told by the receiving bus when each subscription is done with an inbound envelope.

    A plain base class, not an ABC: the bus tests ``isinstance(env.reply, Receipt)`` per
    remote message, and an ABC's ``__instancecheck__`` costs several times more.
    ``expect`` comes once, after dispatch; ``settle`` calls may come before or after it.
    """

    __slots__ = ()

    #: True when the receiving bus has counted and observed the envelope already, and
    #: only delivers it: it published it itself and it comes back through the transport
    #: (see ``Transport.fed_remotely``), or it arrived before for another subscription.
    looped: bool = False

    def expect(self, count: int) -> None:
        """``count`` subscriptions took the envelope; each will ``settle`` it once."""
        raise NotImplementedError

    def settle(self, result: Any, error: BaseException | None) -> None:
        """One subscription finished: ``result`` is its handler's return value, or ``error``
        says why the message was dead-lettered there instead."""
        raise NotImplementedError

    def release(self) -> None:
        """One subscription gives the envelope back unhandled (a closing or leaving bus), for
        redelivery to another member of its group rather than a dead letter here. A settle
        with :class:`~bus.BusClosedError` means the same to a transport that redelivers (NATS
        naks it with no delay); this default is that settle, for transports that do not."""
        self.settle(None, BusClosedError("released unhandled by a closing bus"))


class Transport(abc.ABC):
    """What a bus needs from the thing that connects it to other buses."""

    #: Called with no arguments when remote interest changes; the bus drops its route cache.
    on_change: Callable[[], None] | None = None
    #: Names of this bus's subscriptions that its own publishes reach only through the
    #: transport, never handed over in memory: a transport with a durable log (NATS) feeds
    #: a group with members in several processes from the log alone, so a member's death
    #: loses nothing it was handed. ``has_remote`` is true for their topics, and the
    #: transport delivers them back like any remote message. Fixed for the transport's life.
    fed_remotely: frozenset[str] = frozenset()

    @abc.abstractmethod
    async def start(self, port: BusPort) -> None: ...

    @abc.abstractmethod
    def advertise(self, subscriptions: Iterable[tuple[str, str]]) -> None: ...

    @abc.abstractmethod
    def has_remote(self, topic: str) -> bool: ...

    def try_send(self, envelope: Envelope) -> bool:
        """Send without waiting; ``False`` means "call :meth:`send`", which may wait."""
        return False

    @abc.abstractmethod
    async def send(self, envelope: Envelope) -> None: ...

    async def flush(self) -> None:  # noqa: B027 - optional hook, nothing to wait for by default
        """Wait until every envelope sent so far is settled by its receivers."""

    async def sync(self) -> None:  # noqa: B027 - in-process advertising is already immediate
        """Wait until this bus's latest subscriptions are visible to every other bus (their
        ``has_remote`` reflects them and messages published from now on reach them).
        Advertising is eventually consistent across processes; this is the barrier."""

    @abc.abstractmethod
    async def aclose(self) -> None: ...


class InProcessHub:
    """Connects the in-process transports of several buses in one event loop."""

    def __init__(self) -> None:
        self._members: list[InProcessTransport] = []

    def _join(self, member: InProcessTransport) -> None:
        self._members.append(member)
        self._changed(member)

    def _leave(self, member: InProcessTransport) -> None:
        if member in self._members:
            self._members.remove(member)
            self._changed(member)

    def _changed(self, origin: InProcessTransport) -> None:
        for member in self._members:
            if member is not origin and member.on_change is not None:
                member.on_change()

    def _peers(self, origin: InProcessTransport, topic: str) -> list[InProcessTransport]:
        return [m for m in self._members if m is not origin and m._interested(topic)]


class InProcessTransport(Transport):
    """The default transport: the bus's own process, zero copy."""

    def __init__(self, hub: InProcessHub | None = None) -> None:
        self._hub = hub
        self._port: BusPort | None = None
        self._closed = False
        # The latest advertisement, read only when a peer first asks about a topic: a bus
        # advertises after every subscribe, and copying its patterns each time made 10,000
        # runtime subscribes quadratic. Without a hub nobody ever asks.
        self._advertised: Iterable[tuple[str, str]] = ()
        self._index: GlobIndex[str] | None = None

    async def start(self, port: BusPort) -> None:
        self._port = port
        if self._hub is not None:
            self._hub._join(self)

    def advertise(self, subscriptions: Iterable[tuple[str, str]]) -> None:
        if self._hub is not None:
            self._advertised = subscriptions
            self._index = None
            self._hub._changed(self)

    def _interested(self, topic: str) -> bool:
        index = self._index
        if index is None:
            index = self._index = GlobIndex()
            for name, pattern in self._advertised:
                index.add(pattern, name)
            self._advertised = ()
        return bool(index.resolve(topic))

    def has_remote(self, topic: str) -> bool:
        return self._hub is not None and bool(self._hub._peers(self, topic))

    async def send(self, envelope: Envelope) -> None:
        if self._closed:
            raise TransportError("transport is closed")
        if self._hub is None:
            return
        for peer in self._hub._peers(self, envelope.topic):
            if peer._port is None or peer._closed:
                continue
            try:
                waiting = peer._port.deliver(envelope, None)
            except BusClosedError:
                continue  # that bus is closing: it is no longer a receiver
            if waiting is not None:
                await waiting

    async def aclose(self) -> None:
        self._closed = True
        if self._hub is not None:
            self._hub._leave(self)
