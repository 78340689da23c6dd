"""Every error the bus raises, rooted at one class so a caller can catch the family.

::

    BusError
    ├── PublishError                  the message was not accepted for every subscriber
    │   ├── QueueFullError            a mailbox stayed full (reject, or block timed out)
    │   ├── NoRouteError              a request found nobody to answer it
    │   └── EncodeError               the payload cannot be encoded for the wire
    ├── CircuitOpenError              a breaker is open; ``retry_after`` says for how long
    ├── RequestTimeout                no reply arrived within the timeout
    ├── BusClosedError                the bus is closed or not started
    ├── DecodeError                   bytes from outside could not be decoded (also ValueError)
    └── TransportError                a transport failed to move a message
"""

from __future__ import annotations

__all__ = [
    "BusClosedError",
    "BusError",
    "CircuitOpenError",
    "DecodeError",
    "EncodeError",
    "NoRouteError",
    "PublishError",
    "QueueFullError",
    "RequestTimeout",
    "TransportError",
]


class BusError(Exception):
    """Root of every error the bus raises."""


class PublishError(BusError):
    """A message could not be handed to every subscriber it matched."""


class QueueFullError(PublishError):
    """A subscriber's mailbox was full and its overflow policy refused the message.

    ``subscribers`` names every subscription that refused it; subscribers that accepted the
    message still handle it (fan-out is not transactional, as in every broker).
    """

    def __init__(self, topic: str, subscribers: list[str]) -> None:
        self.topic = topic
        self.subscribers = subscribers
        super().__init__(f"mailbox full for topic {topic!r}: {', '.join(subscribers)}")


class NoRouteError(PublishError):
    """A request was made on a topic that no subscription matches."""


class EncodeError(PublishError):
    """A message could not be encoded for another process and was refused, alone.

    Any failure of the encoder counts: a cyclic or too deeply nested payload
    (``RecursionError``), an object msgpack cannot carry (``TypeError``), an integer out of
    its range (``OverflowError``), a bad value (``ValueError``). Raised to the publisher when
    the encoding happens on its call; otherwise the message is dead-lettered with the
    reason ``encode_error``. Other messages, before and after, are not affected.
    """


class CircuitOpenError(BusError):
    """A circuit breaker is open and fails fast.

    ``retry_after`` is the number of seconds until the breaker lets a probe through.
    """

    def __init__(self, name: str, retry_after: float) -> None:
        self.name = name
        self.retry_after = retry_after
        super().__init__(f"circuit {name!r} is open; retry after {retry_after:.3f}s")


class RequestTimeout(BusError, TimeoutError):
    """No reply to a request arrived in time."""


class BusClosedError(BusError):
    """The bus is not running: it was never started or it is closed."""


class DecodeError(BusError, ValueError):
    """Bytes from another process, a client or the store could not be decoded.

    ``reason`` is ``"malformed"`` (not the format, wrong types, not UTF-8, a number out of
    range), ``"too_large"`` or ``"too_deep"``; ``size`` is the input's length in bytes. A
    receiver counts it, dead-letters or refuses that one input, and goes on: it is never a
    reason to stop a link or a run. A ``ValueError`` too, as msgspec's own error is.
    """

    def __init__(self, what: str, reason: str, size: int, detail: str) -> None:
        self.what = what
        self.reason = reason
        self.size = size
        self.detail = detail
        super().__init__(f"{what} of {size} bytes is {reason.replace('_', ' ')}: {detail}")


class TransportError(BusError):
    """A transport failed to move a message between buses."""
