"""Errors of the NATS transport, all under :class:`bus.TransportError`.

::

    TransportError
    ├── ConnectError              no NATS server answered, or JetStream was not ready in time
    │   └── AuthorizationError    the server refused this client's credentials
    └── RemoteHandlerError        a handler on another node failed for good (DLQ or request)
"""

from __future__ import annotations

from bus._errors import TransportError

__all__ = ["AuthorizationError", "ConnectError", "RemoteHandlerError"]


class ConnectError(TransportError):
    """No NATS server answered within the connect timeout, or JetStream was not ready."""


class AuthorizationError(ConnectError):
    """The NATS server refused this client: missing or wrong user/password, nkey or creds."""


class RemoteHandlerError(TransportError):
    """A handler on another node failed for good; ``error_type`` is its exception's class."""

    def __init__(self, topic: str, error_type: str, message: str) -> None:
        self.topic = topic
        self.error_type = error_type
        super().__init__(f"remote handler for {topic!r} failed: {error_type}: {message}")
