"""The one object every message travels in."""

from __future__ import annotations

import itertools
import os
import time
from typing import Any

import msgspec

from bus._config import Priority

__all__ = ["Envelope", "next_id"]

# Ids are ints, not UUIDs: uuid4() costs more than the rest of an emit. The high bits carry a
# per-process random base so ids from different processes (nodes, replays) do not collide.
_ids = itertools.count((int.from_bytes(os.urandom(3), "big") << 40) | 1)
next_id = _ids.__next__


class Envelope(msgspec.Struct, gc=False, array_like=True):
    """One message: its topic, its payload (passed by reference in-process) and its lineage.

    A msgspec Struct rather than a plain class because building one is what every emit pays
    for: the C constructor costs about a third of a slotted ``__init__``, and the same type
    encodes to msgpack/JSON for the session store and the wire without a hand-written codec.
    ``gc=False`` keeps it out of the cycle collector; an envelope never refers back to itself.

    ``causation_id`` is the message that caused this one (``None`` for outside input);
    ``correlation_id`` is the conversation it belongs to (the root message's id);
    ``source`` names the subscription whose handler emitted it (``None`` for outside input);
    ``created`` is ``time.monotonic_ns()`` at publish; ``hops`` counts causal steps from the root.
    ``context`` is free for the runtime (the session's effect recorder lives there) and
    ``reply`` holds a request's pending reply future; neither is ever serialized.
    """

    topic: str
    payload: Any = None
    priority: int = Priority.NORMAL
    id: int = 0
    session_id: str | None = None
    correlation_id: int = 0
    causation_id: int | None = None
    trace: str | None = None
    created: int = 0
    hops: int = 0
    source: str | None = None
    context: Any = None
    reply: Any = None

    @classmethod
    def new(
        cls,
        topic: str,
        payload: Any = None,
        priority: int = Priority.NORMAL,
        *,
        session_id: str | None = None,
        correlation_id: int | None = None,
        causation_id: int | None = None,
        trace: str | None = None,
        source: str | None = None,
        hops: int = 0,
    ) -> Envelope:
        """A fresh envelope with a new id and the current time, for code outside the bus."""
        id_ = next_id()
        return cls(
            topic,
            payload,
            priority,
            id_,
            session_id,
            id_ if correlation_id is None else correlation_id,
            causation_id,
            trace,
            time.monotonic_ns(),
            hops,
            source,
        )

    def to_dict(self) -> dict[str, Any]:
        """The serializable fields (everything but ``context`` and ``reply``)."""
        return {
            "id": self.id,
            "topic": self.topic,
            "payload": self.payload,
            "priority": int(self.priority),
            "session_id": self.session_id,
            "correlation_id": self.correlation_id,
            "causation_id": self.causation_id,
            "trace": self.trace,
            "created": self.created,
            "hops": self.hops,
            "source": self.source,
        }
