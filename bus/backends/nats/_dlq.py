"""The ``PANTHEON_DLQ`` stream as the operator sees it: list a team's dead letters, redrive.

Nothing here is kept on the node: the stream is the one copy every publisher shares, and a
redrive goes back through the team's stream to the one subscription that failed it (``only``),
under a fresh ``Nats-Msg-Id`` so the stream does not take it for the original.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import nats.js.errors

from bus._dlq import DeadLetter
from bus._errors import DecodeError
from bus.backends.nats._subjects import DLQ_STREAM
from bus.backends.nats._wire import decode_wire, encode, envelope_of

__all__ = ["DeadLetterEntry", "dead_letters", "redrive"]

_log = logging.getLogger("bus.nats")


@dataclass(frozen=True, slots=True)
class DeadLetterEntry(DeadLetter):
    """One message in the DLQ stream: a :class:`~bus.DeadLetter` (reason ``failed``: its
    deliveries ran out) keyed by its stream sequence (``seq``, its ``entry_id``), with the
    node whose consumer gave up and the subject to redrive it on. The stream keeps no
    traceback (the node's own DLQ has it); ``time`` is when the stream stored it."""

    node: str
    subject: str

    @property
    def seq(self) -> int:
        return self.entry_id

    @property
    def deliveries(self) -> int:
        return self.attempts


async def dead_letters(js: Any, team: str, mono_to_wall: int) -> list[DeadLetterEntry]:
    """Every message of ``team`` in the DLQ stream, oldest first."""
    prefix = f"pantheon.dlq.{team}."
    info = await js.stream_info(DLQ_STREAM)
    entries = []
    if not info.state.messages:
        return []
    for seq in range(max(1, info.state.first_seq), info.state.last_seq + 1):
        try:
            raw = await js.get_msg(DLQ_STREAM, seq)
        except nats.js.errors.NotFoundError:
            continue
        if not raw.subject.startswith(prefix):
            continue
        headers = raw.headers or {}
        try:
            wire = decode_wire(raw.data)
        except DecodeError as exc:
            # Not written by a transport (any client may publish there): left in the
            # stream for the operator, never redriven, said once per listing.
            _log.warning("NATS DLQ stream message %d is not a dead letter: %s", seq, exc)
            continue
        envelope = envelope_of(wire, mono_to_wall)
        entries.append(
            DeadLetterEntry(
                entry_id=seq,
                envelope_id=envelope.id,
                topic=envelope.topic,
                subscriber=headers.get("Pantheon-Subscriber", "?"),
                reason="failed",
                error_type=headers.get("Pantheon-Error-Type", ""),
                error=headers.get("Pantheon-Error", ""),
                traceback=None,
                attempts=int(headers.get("Pantheon-Deliveries", "0")),
                envelope=envelope,
                time=raw.time.timestamp() if raw.time is not None else 0.0,
                node=headers.get("Pantheon-Node", ""),
                subject=headers.get("Pantheon-Subject", ""),
            )
        )
    return entries


async def redrive(
    js: Any, team: str, node: str, mono_to_wall: int, seqs: Iterable[int] | None
) -> int:
    """Republish ``team``'s dead letters (all, or those ``seqs``) from ``node``, then remove
    them from the DLQ stream; returns how many went."""
    chosen = None if seqs is None else set(seqs)
    done = 0
    for entry in await dead_letters(js, team, mono_to_wall):
        if chosen is not None and entry.seq not in chosen:
            continue
        raw = await js.get_msg(DLQ_STREAM, entry.seq)
        wire = decode_wire(raw.data)
        wire.only = [entry.subscriber]
        wire.skip = None
        wire.origin = node
        wire.reply = None
        await js.publish(
            entry.subject, encode(wire), headers={"Nats-Msg-Id": f"{wire.id}.r{entry.seq}"}
        )
        await js.delete_msg(DLQ_STREAM, entry.seq)
        done += 1
    return done
