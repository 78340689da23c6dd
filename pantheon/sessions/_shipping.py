"""Journal shipments: how a node of a multi-process run sends its record to the session.

A session is the union of per-process journals (``RECORD.md`` §1). The driver's recorder
writes its own straight into the store; every node runs the same recorder in *ship* mode: its
writer thread encodes the same journal chunks (envelopes the node published, deliveries it
handled, effects its agents performed, each with its request digest) plus its dead letters
and breaker changes into one :class:`Shipment` per commit and hands the bytes to a ``ship``
callable (over a ZeroMQ run's control link, or a NATS run's, to the driver). The driver's
writer *ingests* a shipment: it gives the chunks the session's next positions, tags every
row with the node, and counts the node's progress in ``session_nodes``, in one transaction
with its own commit.

Ordering: shipments are numbered per node, gap-free from 0 (``seq``); the store applies each
once (a shipment at or below the node's count is a duplicate and is skipped), so a channel
may deliver twice. Nothing needs a global order or a wall clock: envelopes carry their causes,
and replay aligns trees. A node that ends cleanly sends a last shipment with ``end`` set; a
node whose journal stops without one died, and ``session_nodes`` says after how many
shipments and records.

Envelopes that reached the node from another process are not shipped again: every envelope is
journaled by the process that published it (its delivery elsewhere is that process's delivery
row), so a merged session holds each message once.
"""

from __future__ import annotations

from typing import Any

import msgspec

__all__ = ["MAX_SHIPMENT_BYTES", "Shipment", "decode_shipment", "encode_shipment"]

#: Chunks of one commit go out in shipments of at most about this many bytes (a chunk is
#: never split), so one control-link line stays far below the driver's line limit.
MAX_SHIPMENT_BYTES = 4 << 20


class Shipment(msgspec.Struct, array_like=True, frozen=True):
    """One commit of a node's journal.

    ``chunks``: (kind, count, wall, blob) as the ``journal`` table holds them, minus the
    positions the driver assigns. ``dead_letters``: rows of the ``dead_letters`` table from
    ``entry_id`` to ``attempts, time`` (the node's own entry ids). ``breakers``: (time, name,
    old, new, reason)."""

    seq: int
    chunks: list[tuple[str, int, float, bytes]] = []
    dead_letters: list[tuple[Any, ...]] = []
    breakers: list[tuple[float, str, str, str, str | None]] = []
    end: bool = False

    @property
    def records(self) -> int:
        return sum(c[1] for c in self.chunks) + len(self.dead_letters) + len(self.breakers)


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Shipment)


def encode_shipment(shipment: Shipment) -> bytes:
    return _encoder.encode(shipment)


def decode_shipment(data: bytes) -> Shipment:
    """Raises :class:`msgspec.DecodeError` (a ``ValueError``) on bytes that are not one."""
    return _decoder.decode(data)
