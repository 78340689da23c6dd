"""Delivering bus messages to WebSocket and SSE clients.

The clients of one pattern share one bus subscription (``bus.on`` with its own mailbox,
a :class:`Hub`) whose handler does no I/O: it appends the message's encoded bytes to each
client's bounded send queue and wakes the senders that sleep. A sender writes whatever
has gathered as one frame, so a client that reads fast gets one message per frame and a
client that falls behind gets them batched instead of one write per message. When the
queue is full the oldest waiting message is dropped and counted; the next frame carries
the count, and past ``max_drops`` the client is closed. Memory per client is therefore
bounded by ``send_queue`` encoded messages and by ``max_bytes`` of them, whichever comes
first, however slow it reads: a count alone lets 4,096 messages of 512 KiB hold 2 GiB for
one client.

A message is encoded once, whichever number of clients receive it: a hub encodes it for
all its clients, and :class:`Encoder` keeps the bytes of recent envelopes by id for the
hubs of other patterns that match it too. The cache is bounded in entries and in bytes,
for the same reason.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from bus import Envelope, Subscription

__all__ = ["Client", "Encoder", "Hub", "WireEnvelope", "release_memory"]

#: Messages one frame carries at most: keeps a frame (and its encode) small for a client
#: that is far behind.
MAX_FRAME_MESSAGES = 512
#: Bytes after which a frame takes no more messages (it has at least one, however large).
MAX_FRAME_BYTES = 1024 * 1024
#: Encoded envelopes remembered for other subscribers of the same message.
_ENCODED = 4096
#: Bytes of encoded envelopes remembered: recent messages stay cached for the other
#: subscribers of a fan-out, large ones do not pile up.
ENCODED_BYTES = 32 * 1024 * 1024
#: Bytes waiting for one client before the oldest message is dropped.
CLIENT_BYTES = 16 * 1024 * 1024


class WireEnvelope(msgspec.Struct, omit_defaults=False):
    """An envelope as clients see it (JSON). Ids are 64-bit integers: JavaScript clients
    should treat them as opaque (``JSON.parse`` rounds them past 2**53)."""

    id: int
    topic: str
    payload: Any
    priority: int
    correlation_id: int
    causation_id: int | None
    source: str | None
    hops: int
    session_id: str | None


def _fallback(obj: Any) -> Any:
    """In-process payloads may hold objects JSON cannot carry; clients get their text."""
    return repr(obj)


class Encoder:
    """JSON bytes of an envelope, made once per envelope however many clients get it.

    Remembers the last 4,096 envelopes and at most ``max_bytes`` of them (the oldest are
    forgotten first; one larger than the bound is encoded and not kept)."""

    __slots__ = ("_cache", "_encode", "encoded", "max_bytes", "size")

    def __init__(self, max_bytes: int = ENCODED_BYTES) -> None:
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self._encode = msgspec.json.Encoder(enc_hook=_fallback).encode
        self.encoded = 0
        self.max_bytes = max_bytes
        self.size = 0

    def clear(self) -> None:
        """Forget every encoded envelope (no client is left to want one)."""
        self._cache.clear()
        self.size = 0

    def __call__(self, env: Envelope) -> bytes:
        cache = self._cache
        data = cache.get(env.id)
        if data is None:
            data = self._encode(
                WireEnvelope(
                    env.id, env.topic, env.payload, int(env.priority), env.correlation_id,
                    env.causation_id, env.source, env.hops, env.session_id,
                )
            )  # fmt: skip
            self.encoded += 1
            size = len(data)
            if size <= self.max_bytes:
                while cache and (len(cache) >= _ENCODED or self.size + size > self.max_bytes):
                    self.size -= len(cache.popitem(last=False)[1])
                cache[env.id] = data
                self.size += size
        return data


class Hub:
    """One bus subscription shared by every client of one pattern; called by the bus with
    each matching message, which it encodes once and appends to each client's queue.

    A subscription per client would make each message cost one mailbox, one worker wake
    and one delivery record per client (a second of CPU for 1,000 clients), and every
    stats snapshot of the bus a latency summary per client even when nothing moves. With
    one per pattern a message costs one delivery, then a ``deque.append`` per client.
    ``shed`` is what the subscription's mailbox shed (a burst larger than it): each
    client counts the part shed while it was attached.
    """

    __slots__ = ("clients", "encode", "name", "pattern", "subscription")

    def __init__(self, name: str, pattern: str, encode: Encoder) -> None:
        self.name = name
        self.pattern = pattern
        self.encode = encode
        self.clients: dict[str, Client] = {}
        self.subscription: Subscription | None = None

    @property
    def shed(self) -> int:
        sub = self.subscription
        return sub.shed if sub is not None else 0

    def add(self, client: Client) -> None:
        client.hub, client.shed_before = self, self.shed
        self.clients[client.name] = client

    async def __call__(self, env: Envelope) -> None:
        # A coroutine function, so the bus awaits it as it is (no wrapper per message); it
        # never suspends.
        data = self.encode(env)
        for client in self.clients.values():
            client.push(data)


class Client:
    """One subscriber's bounded send queue, fed by its pattern's :class:`Hub`.

    ``dropped`` counts every message dropped for this client: from its send queue, and
    those its hub's bus subscription shed while it was attached (a burst larger than the
    mailbox; the bus's own count, also in its DLQ). The queue holds at most ``limit``
    messages and ``max_bytes`` bytes (always the newest message, however large); ``peak``
    is the most it held, in bytes. ``overflowed`` is set once ``max_drops`` is reached
    (0: never), and the sender then closes the connection.
    """

    __slots__ = (
        "_reported",
        "_waiting",
        "_wake",
        "closed",
        "delivered",
        "hub",
        "limit",
        "max_bytes",
        "max_drops",
        "name",
        "overflowed",
        "peak",
        "queue",
        "queue_dropped",
        "shed_before",
        "size",
    )

    def __init__(
        self, name: str, *, limit: int, max_drops: int, max_bytes: int = CLIENT_BYTES
    ) -> None:
        self.name = name
        self.limit = limit
        self.max_drops = max_drops
        self.max_bytes = max_bytes
        self.size = self.peak = self.shed_before = 0
        self.queue: deque[bytes] = deque()
        self.hub: Hub | None = None
        self._reported = self.delivered = self.queue_dropped = 0
        self.overflowed = self.closed = self._waiting = False
        self._wake = asyncio.Event()

    def close(self) -> None:
        """End :meth:`frames` (the connection went away, or the gateway is stopping)."""
        self.closed = True
        self._wake.set()

    def push(self, data: bytes) -> None:
        """Queue one encoded message, dropping the oldest past either bound. The sender is
        woken only when it sleeps, not per message."""
        queue = self.queue
        size = self.size + len(data)
        while queue and (len(queue) >= self.limit or size > self.max_bytes):
            size -= len(queue.popleft())
            self.queue_dropped += 1
        if self.max_drops and self.queue_dropped >= self.max_drops:
            self.overflowed = True
        queue.append(data)
        self.size = size
        if size > self.peak:
            self.peak = size
        if self._waiting:
            self._waiting = False
            self._wake.set()

    @property
    def dropped(self) -> int:
        hub = self.hub
        return self.queue_dropped + (hub.shed - self.shed_before if hub is not None else 0)

    async def frames(self) -> AsyncIterator[bytes]:
        """Frames to send, each ``{"dropped": n, "messages": [...]}`` as JSON bytes, until
        the client overflows or is closed (then the generator ends)."""
        queue = self.queue
        wake = self._wake
        while not (self.overflowed or self.closed):
            if not queue:
                wake.clear()
                self._waiting = True
                await wake.wait()
                continue
            batch = [queue.popleft()]
            taken = len(batch[0])
            while queue and len(batch) < MAX_FRAME_MESSAGES and taken < MAX_FRAME_BYTES:
                data = queue.popleft()
                batch.append(data)
                taken += len(data)
            self.size -= taken
            n = len(batch)
            total = self.dropped
            dropped, self._reported = total - self._reported, total
            if self.max_drops and total >= self.max_drops:
                self.overflowed = True
            self.delivered += n
            yield b'{"dropped":%d,"messages":[%b]}' % (dropped, b",".join(batch))


def _malloc_trim() -> Any:
    name = ctypes.util.find_library("c")
    libc = ctypes.CDLL(name) if name else None
    return getattr(libc, "malloc_trim", None)


_TRIM = _malloc_trim()


def release_memory() -> None:
    """Give the C heap's free pages back to the system (glibc's ``malloc_trim``).

    Encoded messages over 128 KiB come from the C heap, whose high-water mark glibc keeps
    after they are freed: without this, a client that queued a gigabyte leaves the process
    a gigabyte larger after it leaves. Elsewhere than glibc it does nothing."""
    if _TRIM is not None:
        _TRIM(0)
