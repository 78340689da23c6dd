"""The NATS JetStream transport: the same bus, durable and clustered, on a server operators run.

::

    async with Bus(transport=NatsTransport("nats://127.0.0.1:4222", team="support")) as bus:
        ...

ZeroMQ (``bus.backends.zeromq``) stays the fast, dependency-free path; this one keeps
messages in JetStream streams (file storage by default), so a node that dies loses nothing
it had not acknowledged. Needs nats-py (``pip install 'pantheon[nats]'``) and a
``nats-server -js`` (:class:`NatsServer` starts a throwaway one).
"""

try:
    import nats as _nats  # noqa: F401 - imported here to fail early with a useful message
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "bus.backends.nats needs nats-py: install the 'nats' extra (pip install 'pantheon[nats]')"
    ) from exc

from bus.backends.nats._dlq import DeadLetterEntry
from bus.backends.nats._errors import AuthorizationError, ConnectError, RemoteHandlerError
from bus.backends.nats._server import (
    NatsServer,
    NatsServerError,
    find_nats_server,
    free_port,
    nats_cluster,
    start_cluster,
    stop_cluster,
)
from bus.backends.nats._transport import NatsTransport

__all__ = [
    "AuthorizationError",
    "ConnectError",
    "DeadLetterEntry",
    "NatsServer",
    "NatsServerError",
    "NatsTransport",
    "RemoteHandlerError",
    "find_nats_server",
    "free_port",
    "nats_cluster",
    "start_cluster",
    "stop_cluster",
]
