"""Where an input stands in its run's input order, carried in its id to every process.

A fault window bounded in messages (``until: {messages: 400}``) asks, of every message an
agent handles, how many inputs came before the one it comes from. In one process a counter
beside the bus could say; across processes (ZeroMQ nodes, NATS) the agent's process never
sees the input published, only messages it caused, and each of them carries one thing of
it to every transport: its id, as their ``correlation_id``. So whoever publishes the
inputs (the Observer; a re-run's feed) gives each one an id that *is* its number, and any
process reads the number back from any message of its tree (:func:`input_ordinal`). No
field is added to the envelope or to either wire format.

An ordinary envelope id is ``base << 40 | n``: 24 random bits per process, then a counter
from 1 (``bus._envelope``). A stamped input id is ``base << 40 | 1 << 39 | ordinal`` with a
fresh random ``base`` per input stream and topic. The stamp bit tells it from an ordinary
id, whose counter would need 2**39 (5.5e11) messages from one process to reach that bit;
the fresh base keeps stamped ids as unique across runs and processes as ordinary ones
(ids must be: the ZeroMQ receivers and the NATS stream drop a repeated id as a duplicate).
"""

from __future__ import annotations

import os

__all__ = ["MAX_ORDINAL", "InputOrdinals", "input_ordinal"]

_STAMP = 1 << 39
#: The largest ordinal an id carries (5.5e11 inputs on one topic); later inputs are unstamped.
MAX_ORDINAL = _STAMP - 1


def input_ordinal(correlation_id: int) -> int | None:
    """The number of the input whose tree a message with this ``correlation_id`` belongs
    to (0 for the first input on its topic), or ``None`` for a tree that did not start at a
    stamped input (a Monitor's sample, a redriven dead letter, a client's publish).

    Works on an id as SQLite gives it back too (the top half wrapped to negative): the wrap
    is a multiple of 2**64, which leaves the low 40 bits as they were."""
    if correlation_id & _STAMP:
        return correlation_id & MAX_ORDINAL
    return None


class InputOrdinals:
    """Numbers one stream of inputs per topic, in publish order, and gives each input the id
    that carries its number (read back with :func:`input_ordinal`).

    One per Observer (its ``ordinals``); a re-run's feed has its own, which gives every
    recorded input the number it had in the original run. Counting per topic keeps the
    emails' numbers apart from those of any other stream the input has (its malformed
    records), as a scenario's ``messages`` bound says."""

    __slots__ = ("_bases", "_next")

    def __init__(self) -> None:
        self._bases: dict[str, int] = {}
        self._next: dict[str, int] = {}

    def stamp(self, topic: str, ordinal: int | None = None) -> int | None:
        """The id of the next input on ``topic`` or, given ``ordinal``, of the input with
        that number (the next ones on the topic follow it). ``None`` past
        :data:`MAX_ORDINAL`: that input gets an ordinary id and no number.

        A number not past the last one given on the topic (a re-run of a session whose
        inputs came through two Observers, each numbering the topic from 0) may have been
        given already, so its id gets a base of its own: ids never repeat."""
        following = self._next.get(topic, 0)
        n = following if ordinal is None else ordinal
        if not 0 <= n <= MAX_ORDINAL:
            return None
        if n < following:
            return self._fresh_base() << 40 | _STAMP | n
        self._next[topic] = n + 1
        base = self._bases.get(topic)
        if base is None:
            base = self._bases[topic] = self._fresh_base()
        return base << 40 | _STAMP | n

    def _fresh_base(self) -> int:
        taken = set(self._bases.values())
        base = _random_base()
        while base in taken:  # two topics of one stream must never share ids
            base = _random_base()
        return base


def _random_base() -> int:
    return int.from_bytes(os.urandom(3), "big")
