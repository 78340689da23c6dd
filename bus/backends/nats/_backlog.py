"""What waits in the stream for a consumer group: counted, and read without settling it.

A group whose every member died still has its durable consumers: what they were handed
and never acknowledged (``num_ack_pending``) comes back after ``ack_wait``, and what was
never handed out (``num_pending``) stays behind the consumer's delivered sequence. Both
wait there for the next member. :func:`read_waiting` reads them as that member would see
them, without acknowledging anything: the held ones are pulled once they expire (the
server redelivers before it hands out new ones) and left unacknowledged, so they come back
after ``ack_wait`` again; the rest are read by sequence from the stream, not from the
consumer, so they stay undelivered.

Across sessions (:func:`leftovers`, :func:`discard`): every session has its own consumers
(``_subjects``), described with the session's name, so what a run whose processes all died
left is counted per session, and deleted once that session is over, from the consumer list
alone; the stream's messages themselves are never touched here.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, NamedTuple

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg

from bus._envelope import Envelope
from bus._errors import TransportError
from bus.backends.nats._subjects import session_of

__all__ = ["Waiting", "count_waiting", "discard", "leftovers", "read_waiting"]

#: Seconds one pull request waits on the server while reading a dead group's messages.
_PULL = 0.5


class Waiting(NamedTuple):
    """What the stream holds for consumer groups with no live member, per ``(name,
    pattern)``, as envelopes (``NatsTransport.waiting``)."""

    waiting: dict[tuple[str, str], list[Envelope]]
    """Messages for the group, never handled by it: its next member will take them."""
    handed_over: dict[tuple[str, str], list[Envelope]]
    """Messages whose publisher served the group in memory (``skip``): the next member
    passes them over, and whether the publisher's member handled them died with it if its
    process did."""
    complete: bool
    """False when a dead member's messages had not come back within the timeout."""


async def count_waiting(js: Any, stream: str, consumer: str) -> int:
    """Messages ``consumer`` has not had acknowledged: held by a member, or not handed out.
    0 for a consumer that does not exist (nobody ever subscribed that group)."""
    try:
        info = await js.consumer_info(stream, consumer)
    except nats.js.errors.NotFoundError:
        return 0
    return int(info.num_pending) + int(info.num_ack_pending)


async def read_waiting(
    nc: Any, js: Any, stream: str, consumer: str, batch: int, deadline: float
) -> tuple[list[bytes], bool]:
    """The bodies of every message waiting for ``consumer``, in stream order, and whether
    that is all of them: False when what a dead member held had still not come back by
    ``deadline`` (loop time; ``ack_wait`` after its last delivery is enough).

    Meant for a group with no live member: a live one would be taking them meanwhile."""
    try:
        info = await js.consumer_info(stream, consumer)
    except nats.js.errors.NotFoundError:
        return [], True
    if info.num_pending + info.num_ack_pending == 0:
        return [], True
    loop = asyncio.get_running_loop()
    held: dict[int, bytes] = {}
    queue: asyncio.Queue[Msg] = asyncio.Queue()

    async def on_msg(msg: Msg) -> None:
        queue.put_nowait(msg)

    inbox = nc.new_inbox()
    sub = await nc.subscribe(inbox, cb=on_msg)
    api = f"$JS.API.CONSUMER.MSG.NEXT.{stream}.{consumer}"
    complete = True
    try:
        while info.num_ack_pending > len(held):
            if loop.time() >= deadline:
                complete = False
                break
            request = b'{"batch":%d,"expires":%d}' % (batch, int(_PULL * 1e9))
            await nc.publish(api, request, reply=inbox)
            end = loop.time() + _PULL + 0.5
            while (left := end - loop.time()) > 0:
                try:
                    async with asyncio.timeout(left):
                        msg = await queue.get()
                except TimeoutError:
                    break
                if not msg.reply:
                    break  # the request's end (expired, nothing more)
                held[msg.metadata.sequence.stream] = msg.data
            info = await js.consumer_info(stream, consumer)
    finally:
        # Not acknowledged: what was pulled here comes back after ack_wait for whoever
        # joins the group next.
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
    rest: dict[int, bytes] = {}
    seq = info.delivered.stream_seq + 1
    subject = info.config.filter_subject
    for _ in range(info.num_pending):
        try:
            raw = await js.get_msg(stream, seq, subject=subject, next=True)
        except nats.js.errors.NotFoundError:
            break
        rest[raw.seq] = raw.data or b""
        seq = raw.seq + 1
    waiting = held | rest
    return [waiting[s] for s in sorted(waiting)], complete


async def _consumers(js: Any, stream: str) -> list[Any]:
    """Every consumer of ``stream`` (the server lists them a page at a time)."""
    out: list[Any] = []
    try:
        while page := await js.consumers_info(stream, offset=len(out)):
            out += page
    except nats.errors.Error as exc:
        raise TransportError(f"NATS stream {stream}: listing its consumers failed: {exc}") from exc
    return out


async def leftovers(js: Any, stream: str, scope: str) -> dict[str, int]:
    """Per session other than ``scope`` whose consumers hold unacknowledged messages (held
    by a member, or not handed out) and that no member pulls from: how many. A session
    whose members are pulling is a run going on now, not leftovers. The server's count, an
    upper bound of the work left: a consumer also counts copies its publisher served in
    memory (a member would pass them over), and a message a leaving member gave back may
    count twice while it waits to be handed out again."""
    held: dict[str, int] = {}
    pulled: set[str] = set()
    for info in await _consumers(js, stream):
        session = session_of(info.config.description)
        if session is None or session == scope:
            continue
        if info.num_waiting:
            pulled.add(session)
        held[session] = held.get(session, 0) + int(info.num_pending) + int(info.num_ack_pending)
    return {s: n for s, n in sorted(held.items()) if n and s not in pulled}


async def discard(js: Any, stream: str, scope: str) -> int:
    """Delete session ``scope``'s consumers from ``stream``; returns how many went. The
    stream keeps every message (a resume reads them there)."""
    gone = 0
    for info in await _consumers(js, stream):
        if session_of(info.config.description) != scope:
            continue
        try:
            await js.delete_consumer(stream, info.name)
        except nats.js.errors.NotFoundError:
            continue  # gone meanwhile (the server's idle limit)
        except nats.errors.Error as exc:
            raise TransportError(
                f"NATS stream {stream}: deleting consumer {info.name} of session {scope} "
                f"failed: {exc}"
            ) from exc
        gone += 1
    return gone
