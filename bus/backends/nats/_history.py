"""What a node published that the team's stream still holds: the stream as a history.

A process that dies takes its unwritten records with it, but every message it published to
another process is in the team's stream (limits retention: kept until ``max_age``), exact,
with its id and lineage. :func:`published` reads them back for one publishing node and one
session, so whoever finishes a dead run can tell which messages it had already sent.
"""

from __future__ import annotations

import contextlib
from typing import Any

import nats.errors
from nats.js.api import ConsumerConfig, DeliverPolicy

from bus._envelope import Envelope
from bus._errors import DecodeError
from bus.backends.nats._subjects import LANES
from bus.backends.nats._wire import decode_wire, envelope_of

__all__ = ["published"]


async def published(js: Any, team: str, origin: str, session_id: str) -> list[Envelope]:
    """Every message of ``session_id`` that node ``origin`` published, in stream order per
    priority lane. ``created`` is wall-clock ns (it crossed processes). Messages other
    clients put on the subjects, or that do not decode, are skipped."""
    out: list[Envelope] = []
    for lane in LANES:
        sub = await js.pull_subscribe(
            f"pantheon.{team}.{lane}.>",
            config=ConsumerConfig(deliver_policy=DeliverPolicy.ALL, inactive_threshold=30.0),
        )
        try:
            while True:
                try:
                    msgs = await sub.fetch(512, timeout=1.0)
                except (TimeoutError, nats.errors.TimeoutError):
                    break
                for msg in msgs:
                    with contextlib.suppress(Exception):
                        await msg.ack()
                    try:
                        wire = decode_wire(msg.data)
                    except DecodeError:
                        continue
                    if wire.origin != origin or wire.session_id != session_id or wire.only:
                        continue  # another node's, another run's, or a redrive's copy
                    # ``mono_to_wall`` 0: ``created`` stays wall-clock ns.
                    out.append(envelope_of(wire, 0))
                if msgs and msgs[-1].metadata.num_pending == 0:
                    break
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
    return out
