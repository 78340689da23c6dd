"""Requests across nodes: the futures waiting here for an answer, and answers sent back.

A request published from this node names an inbox under this node's reply prefix (the
envelope id as its last token); the receiving node's receipt answers there once, with the
handler's result, or with the error once the message is dead-lettered. A dead letter of a
message this node published also arrives on this node's DLQ subject, so a request whose
answer will never come fails then rather than at its timeout.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from nats.aio.msg import Msg

from bus._errors import DecodeError
from bus.backends.nats._errors import RemoteHandlerError
from bus.backends.nats._wire import Answer, decode_answer, decode_wire, encode, envelope_of

__all__ = ["Replies"]


class Replies:
    """The requests this node published that wait for an answer (``requests``: envelope id
    to the asker's future, one dict for the node's life), and the answering of others'."""

    __slots__ = ("counts", "mono_to_wall", "requests", "send")

    def __init__(
        self, *, counts: dict[str, int], send: Callable[[str, bytes], None], mono_to_wall: int
    ) -> None:
        self.counts = counts
        self.send = send
        self.mono_to_wall = mono_to_wall
        self.requests: dict[int, asyncio.Future[Any]] = {}

    def forget(self, env_id: int, _fut: asyncio.Future[Any]) -> None:
        self.requests.pop(env_id, None)

    def answer(self, reply_to: str, answer: Answer) -> None:
        try:
            body = encode(answer)
        except Exception as exc:
            body = encode(
                Answer(False, None, "EncodeError", f"reply is not msgpack-encodable: {exc}")
            )
        self.counts["replies_sent"] += 1
        self.send(reply_to, body)

    async def on_answer(self, msg: Msg) -> None:
        fut = self.requests.pop(int(msg.subject.rsplit(".", 1)[1]), None)
        if fut is None or fut.done():
            return
        self.counts["replies_received"] += 1
        try:
            answer = decode_answer(msg.data)
        except DecodeError:
            self.counts["malformed"] += 1
            return
        if answer.ok:
            fut.set_result(answer.value)
        else:
            fut.set_exception(
                RemoteHandlerError(
                    answer.topic, answer.error_type or "Exception", answer.error or ""
                )
            )

    async def on_dead(self, msg: Msg) -> None:
        """A message this node published went to the DLQ stream: a request waiting for it
        fails now rather than at its timeout. (It is not added to this bus's DLQ: the
        receiving bus lists the failure with its traceback, as on any transport, and the
        stream is where every publisher sees and redrives it.)"""
        headers = msg.headers or {}
        try:
            env = envelope_of(decode_wire(msg.data), self.mono_to_wall)
        except DecodeError:
            self.counts["malformed"] += 1
            return
        self.counts["dlq_received"] += 1
        fut = self.requests.pop(env.id, None)
        if fut is not None and not fut.done():
            fut.set_exception(
                RemoteHandlerError(
                    env.topic,
                    headers.get("Pantheon-Error-Type", "Exception"),
                    f"{headers.get('Pantheon-Error', '')} (after "
                    f"{headers.get('Pantheon-Deliveries', '?')} deliveries, last on node "
                    f"{headers.get('Pantheon-Node', '?')!r})",
                )
            )
