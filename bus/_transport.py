"""The seam between a bus and the buses it talks to.

A :class:`Transport` moves envelopes between :class:`~bus.Bus` instances. The bus keeps its
own mailboxes, breakers and metrics; a transport only answers two questions and does one job:

* ``has_remote(topic)``: does any *other* bus subscribe to this topic? The bus caches the
  answer per topic with its local routes and drops the cache when ``on_change`` fires.
* ``send(envelope)``: hand the envelope to every other bus that subscribes to its topic,
  waiting when a receiver applies backpressure. Local subscribers are never sent anything.
* ``advertise(patterns)``: tell the others which patterns this bus now subscribes to.

Resource contract: ``start`` is awaited once before anything else, with the coroutine
function the transport calls to hand an inbound envelope to the bus; ``aclose`` is awaited
once, after which ``send`` raises :class:`~bus.TransportError`. A transport owns whatever
sockets or tasks it opens and releases them in ``aclose``.

:class:`InProcessTransport` is the default: without a hub it has no peers, so every route
is local and ``send`` is never called. Buses sharing an :class:`InProcessHub` see each other
as a broker's nodes would, zero copy, which is what the contract suite checks every
transport against.
"""

from __future__ import annotations

import abc
import fnmatch
from collections.abc import Awaitable, Callable, Iterable

from bus._envelope import Envelope
from bus._errors import TransportError

__all__ = ["InProcessHub", "InProcessTransport", "Inbound", "Transport"]

Inbound = Callable[[Envelope], Awaitable[None]]


class Transport(abc.ABC):
    """What a bus needs from the thing that connects it to other buses."""

    #: Called with no arguments when remote interest changes; the bus drops its route cache.
    on_change: Callable[[], None] | None = None

    @abc.abstractmethod
    async def start(self, inbound: Inbound) -> None: ...

    @abc.abstractmethod
    def advertise(self, patterns: Iterable[str]) -> None: ...

    @abc.abstractmethod
    def has_remote(self, topic: str) -> bool: ...

    @abc.abstractmethod
    async def send(self, envelope: Envelope) -> None: ...

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
        return [
            m
            for m in self._members
            if m is not origin and any(fnmatch.fnmatchcase(topic, p) for p in m.patterns)
        ]


class InProcessTransport(Transport):
    """The default transport: the bus's own process, zero copy."""

    def __init__(self, hub: InProcessHub | None = None) -> None:
        self._hub = hub
        self._inbound: Inbound | None = None
        self._closed = False
        self.patterns: frozenset[str] = frozenset()

    async def start(self, inbound: Inbound) -> None:
        self._inbound = inbound
        if self._hub is not None:
            self._hub._join(self)

    def advertise(self, patterns: Iterable[str]) -> None:
        self.patterns = frozenset(patterns)
        if self._hub is not None:
            self._hub._changed(self)

    def has_remote(self, topic: str) -> bool:
        return self._hub is not None and bool(self._hub._peers(self, topic))

    async def send(self, envelope: Envelope) -> None:
        if self._closed:
            raise TransportError("transport is closed")
        if self._hub is None:
            return
        for peer in self._hub._peers(self, envelope.topic):
            if peer._inbound is not None and not peer._closed:
                await peer._inbound(envelope)

    async def aclose(self) -> None:
        self._closed = True
        if self._hub is not None:
            self._hub._leave(self)
