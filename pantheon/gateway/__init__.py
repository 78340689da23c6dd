"""The HTTP and WebSocket gateway: the bus reachable from anything that speaks the web.

``pantheon serve SCENARIO`` (or a ``gateway:`` section and ``pantheon run``) exposes the
run's bus: publish one message or a batch over HTTP, subscribe over a WebSocket or
Server-Sent Events, ask a request and wait for the reply, feed an ``http`` input (the
webhook inbox), and scrape ``/metrics``. See docs/gateway.md.

Needs the ``gateway`` extra (starlette, uvicorn, prometheus-client).
"""

try:
    import prometheus_client  # noqa: F401
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"the gateway needs the gateway extra ({exc.name} is missing): "
        "pip install 'pantheon[gateway]'"
    ) from None

from pantheon.gateway._app import GatewayState, build_app
from pantheon.gateway._auth import ANONYMOUS, Grant, Tokens, load_tokens
from pantheon.gateway._errors import GatewayError, TokenError
from pantheon.gateway._fanout import Client, Encoder, Hub, WireEnvelope
from pantheon.gateway._protocol import ServerLimits
from pantheon.gateway._server import Gateway

__all__ = [
    "ANONYMOUS",
    "Client",
    "Encoder",
    "Gateway",
    "GatewayError",
    "GatewayState",
    "Grant",
    "Hub",
    "ServerLimits",
    "TokenError",
    "Tokens",
    "WireEnvelope",
    "build_app",
    "load_tokens",
]
