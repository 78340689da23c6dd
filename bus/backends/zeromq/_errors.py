"""Errors of the ZeroMQ transport, all under :class:`bus.TransportError`.

::

    TransportError
    ├── ConnectError              the broker did not answer the handshake in time
    │   └── AuthenticationFailed  ... and the socket reported a CURVE handshake refusal
    ├── PeerLost                  the node holding a message died before settling it
    ├── RemoteHandlerError        a request's remote handler failed; names its error type
    └── FrameTooLarge             a message does not fit in one frame (``max_frame``)

and :class:`bus.EncodeError` (a :class:`bus.PublishError`), re-exported here: a payload msgpack
cannot carry (never pickle on the wire), refused alone, the link left clean.
"""

from __future__ import annotations

from bus._errors import EncodeError, TransportError

__all__ = [
    "AuthenticationFailed",
    "ConnectError",
    "EncodeError",
    "FrameTooLarge",
    "PeerLost",
    "RemoteHandlerError",
]


class ConnectError(TransportError):
    """No handshake with the broker within the connect timeout."""


class AuthenticationFailed(ConnectError):
    """The broker refused this node's CURVE key (or the node has the wrong server key)."""


class PeerLost(TransportError):
    """A node died with the message in flight and no other member could take it."""


class RemoteHandlerError(TransportError):
    """The handler of a request on another node failed; ``error_type`` is its class name."""

    def __init__(self, topic: str, error_type: str, message: str) -> None:
        self.topic = topic
        self.error_type = error_type
        super().__init__(f"remote handler for {topic!r} failed: {error_type}: {message}")


class FrameTooLarge(TransportError):
    """An encoded message is larger than the frame limit."""
