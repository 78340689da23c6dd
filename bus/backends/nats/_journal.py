"""Journal parts on the team's stream: opaque bytes a recorder ships, kept durably.

A multi-process run's nodes ship their part of the session's record (bytes this module
does not read) on ``pantheon.<team>.journal.<key>.<node>``, where ``key`` names the
recording (a session id). The team's stream captures the subject like every other, so a
shipment is stored on the server once its publish is acknowledged, and it outlives the
process that would have read it: a driver that dies loses nothing its nodes shipped, and
whoever resumes the session reads the rest from here. No consumer group's filter covers
these subjects (those are ``pantheon.<team>.<lane>.…``), so no agent ever sees them.

A shipment larger than :data:`PART_BYTES` goes as several parts (a server's default
``max_payload`` is 1 MiB). Each part's ``Nats-Msg-Id`` is ``key.node.seq.part``: a part
published twice within the stream's dedup window is stored once, and a reader skips a
shipment number it has already handed on, so a repeat outside the window is harmless too.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from typing import Any

import nats.errors
from nats.js.api import ConsumerConfig, DeliverPolicy

from bus.backends.nats._subjects import check_token

__all__ = ["PART_BYTES", "JournalReader", "append", "journal_subject"]

#: Largest part published (bytes of shipment, headers aside).
PART_BYTES = 512 << 10


def journal_subject(team: str, key: str, node: str = "*") -> str:
    """The subject ``node``'s shipments of recording ``key`` go on (``*``: every node's)."""
    if node != "*":
        check_token(node, "node")
    return f"pantheon.{team}.journal.{check_token(key, 'journal key')}.{node}"


async def append(js: Any, team: str, key: str, node: str, seq: int, data: bytes, end: bool) -> None:
    """Store shipment ``seq`` of ``node``; returns once the stream acknowledged every part."""
    subject = journal_subject(team, key, node)
    parts = [data[i : i + PART_BYTES] for i in range(0, len(data), PART_BYTES)] or [b""]
    for i, part in enumerate(parts):
        headers = {
            "Nats-Msg-Id": f"{key}.{node}.{seq}.{i}",
            "Pantheon-Seq": str(seq),
            "Pantheon-Part": f"{i}/{len(parts)}",
        }
        if end:
            headers["Pantheon-End"] = "1"
        await js.publish(subject, part, headers=headers)


class JournalReader:
    """Reads recording ``key``'s shipments from the team's stream, each node's in order,
    and hands every whole one to ``on_shipment(node, seq, data, end)``.

    :meth:`follow` reads as they come until :meth:`stop`; :meth:`drain` reads what the
    stream holds now and returns. ``done`` is each node's next expected shipment number
    (a reader given the numbers already applied skips those)."""

    def __init__(
        self,
        js: Any,
        team: str,
        key: str,
        on_shipment: Callable[[str, int, bytes, bool], None],
        done: dict[str, int] | None = None,
    ) -> None:
        self._js = js
        self._subject = journal_subject(team, key)
        self._on_shipment = on_shipment
        self.done: dict[str, int] = dict(done or {})
        #: Nodes whose end mark was read.
        self.ended: set[str] = set()
        #: Parts that arrived out of shape (a part number out of order): counted, skipped.
        self.malformed = 0
        self._parts: dict[str, list[bytes]] = {}
        self._stopping = asyncio.Event()
        self.progress = asyncio.Event()

    def stop(self) -> None:
        self._stopping.set()

    async def follow(self, *, poll: float = 0.2) -> None:
        """Read until :meth:`stop` (then return at once)."""
        await self._read(until_empty=False, poll=poll)

    async def drain(self, *, poll: float = 1.0) -> None:
        """Read everything the stream holds for this recording now, then return."""
        await self._read(until_empty=True, poll=poll)

    async def _read(self, *, until_empty: bool, poll: float) -> None:
        sub = await self._js.pull_subscribe(
            self._subject,
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, inactive_threshold=60.0),
        )
        try:
            while not self._stopping.is_set():
                try:
                    msgs = await sub.fetch(256, timeout=poll)
                except (TimeoutError, nats.errors.TimeoutError):
                    if until_empty:
                        return
                    continue
                for msg in msgs:
                    self._take(msg)
                    with contextlib.suppress(Exception):
                        await msg.ack()
                    if until_empty and msg.metadata.num_pending == 0:
                        return
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def _take(self, msg: Any) -> None:
        node = msg.subject.rsplit(".", 1)[-1]
        headers = msg.headers or {}
        try:
            seq = int(headers["Pantheon-Seq"])
            part, _, parts = headers["Pantheon-Part"].partition("/")
            i, n = int(part), int(parts)
        except (KeyError, ValueError):
            self.malformed += 1
            return
        if seq < self.done.get(node, 0):
            return  # handed on already (a repeat past the dedup window)
        pending = self._parts.setdefault(node, [])
        if i != len(pending):
            self.malformed += 1
            pending.clear()
            if i != 0:
                return
        pending.append(msg.data)
        if len(pending) < n:
            return
        data = b"".join(pending)
        pending.clear()
        self.done[node] = seq + 1
        end = headers.get("Pantheon-End") == "1"
        if end:
            self.ended.add(node)
        self._on_shipment(node, seq, data, end)
        self.progress.set()
