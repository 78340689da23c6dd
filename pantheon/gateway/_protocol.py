"""The gateway's connection limits, enforced in uvicorn's HTTP protocol itself.

uvicorn with httptools has no timeout before a request's headers are complete, none on a
body that trickles in, no bound on a request line or on the headers, and its
``limit_concurrency`` answers 503 without ``Retry-After`` and only once a request's headers
have arrived. Slow or many connections then hold sockets (and file descriptors) until none
is left for a health check. These limits act per connection, before the app sees anything:
a refusal is a complete HTTP answer written by the protocol and one ``info`` line, never a
traceback, and the connection is closed.
"""

from __future__ import annotations

import asyncio
import logging
import resource
from dataclasses import dataclass, replace
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
from uvicorn.protocols.websockets.websockets_sansio_impl import WebSocketsSansIOProtocol

from pantheon.gateway._fanout import CLIENT_BYTES, ENCODED_BYTES

__all__ = ["ServerLimits"]

log = logging.getLogger("pantheon.gateway")

#: Paths answered even past the connection limit: an orchestrator's probes must get an
#: answer while the gateway sheds a flood, or it would restart a healthy process.
_PROBES = (b"/healthz", b"/readyz")
#: File descriptors kept for everything that is not a client socket (the store, the
#: listening socket, logs, the live feed), so a flood never starves them.
_FD_MARGIN = 128
_REASONS = {
    400: b"Bad Request",
    408: b"Request Timeout",
    414: b"URI Too Long",
    431: b"Request Header Fields Too Large",
    503: b"Service Unavailable",
}


@dataclass(frozen=True, slots=True)
class ServerLimits:
    """How long and how much one connection may take, and how many may be open.

    ``header_timeout``: seconds from the connection (or the end of the previous response)
    to the end of a request's headers, else 408 and close (slowloris). ``body_timeout``:
    seconds from the end of the headers to the end of the body, else 408 and close.
    ``idle_timeout``: seconds a kept-alive connection may wait for its next request.
    ``max_request_line``: bytes of the request target (a WebSocket upgrade's too), else
    414. ``max_header_bytes``: bytes of all header names and values, else 431.
    ``max_connections``: open connections (HTTP and WebSocket) before new ones are refused
    with 503 and ``Retry-After: retry_after``; lowered at start to fit the process's file
    descriptor limit. ``probe_reserve`` more connections past it are still read, for
    ``/healthz`` and ``/readyz``; beyond those the 503 is written at once. ``backlog``:
    the listening socket's accept queue. ``client_bytes``: encoded messages waiting for
    one WebSocket or SSE client before the oldest is dropped (as ``send_queue`` counts
    them). ``encoded_bytes``: encoded messages kept for the other subscribers of a
    fan-out.
    """

    header_timeout: float = 10.0
    body_timeout: float = 30.0
    idle_timeout: int = 5
    max_request_line: int = 8 * 1024
    max_header_bytes: int = 16 * 1024
    max_connections: int = 4096
    probe_reserve: int = 32
    backlog: int = 511
    retry_after: int = 1
    client_bytes: int = CLIENT_BYTES
    encoded_bytes: int = ENCODED_BYTES

    def fitted(self) -> ServerLimits:
        """These limits with ``max_connections`` lowered to what the descriptor limit
        allows: refusing with a 503 needs a descriptor, so the cap must come first."""
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        if soft == resource.RLIM_INFINITY:
            return self
        room = max(1, soft - _FD_MARGIN - self.probe_reserve)
        return self if self.max_connections <= room else replace(self, max_connections=room)


class _Stop(Exception):
    """Raised from a parser callback to stop parsing a request already refused."""


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with :class:`ServerLimits` enforced (see the module)."""

    limits: ClassVar[ServerLimits] = ServerLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._head_bytes = 0
        self._over = self._refused = self._in_body = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        limits = self.limits
        open_now = len(self.connections)
        if open_now > limits.max_connections + limits.probe_reserve:
            self._refuse(503, "at the connection limit")
            return
        # Past the cap only a probe is answered, and the head must come at once.
        self._over = open_now > limits.max_connections
        self._arm(min(1.0, limits.header_timeout) if self._over else limits.header_timeout)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        self._unset_keepalive_if_required()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._refuse(400, "an upgrade to something other than a WebSocket")
        except httptools.HttpParserError:
            if not self._refused:  # a callback's _Stop arrives wrapped, after its refusal
                self._refuse(400, "not a valid HTTP request")

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._in_body = False
        if self._timer is None:
            self._arm(self.limits.header_timeout)

    def on_url(self, url: bytes) -> None:
        super().on_url(url)
        if len(self.url) > self.limits.max_request_line:
            self._refuse(414, f"a request target over {self.limits.max_request_line} bytes")
            raise _Stop

    def on_header(self, name: bytes, value: bytes) -> None:
        super().on_header(name, value)
        self._head_bytes += len(name) + len(value)
        if self._head_bytes > self.limits.max_header_bytes:
            self._refuse(431, f"headers over {self.limits.max_header_bytes} bytes")
            raise _Stop

    def on_headers_complete(self) -> None:
        self._disarm()
        if self._over and httptools.parse_url(self.url).path not in _PROBES:
            self._refuse(503, "at the connection limit")
            raise _Stop
        super().on_headers_complete()
        if self.parser.should_upgrade():
            return  # the WebSocket protocol takes the connection over
        if self._over:
            self.cycle.keep_alive = False
        self._in_body = True
        self._arm(self.limits.body_timeout)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def _arm(self, delay: float) -> None:
        self._disarm()
        self._timer = self.loop.call_later(delay, self._expired)

    def _disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expired(self) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if self._in_body and cycle is not None and cycle.response_started:
            self._refused = True  # answered already: only the rest of the body is late
            self.transport.close()
            return
        if self._over:
            self._refuse(503, "at the connection limit")
        else:
            self._refuse(408, "the request did not arrive in time")

    def _refuse(self, status: int, why: str) -> None:
        """Answer ``status`` and close: a refusal is the client's doing, so one info line."""
        self._refused = True
        self._disarm()
        if self.transport.is_closing():
            return
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "?"
        log.info("refused %s: %d, %s", client, status, why)
        body = b'{"error":"%s"}' % why.encode()
        head = [
            b"HTTP/1.1 %d %s" % (status, _REASONS[status]),
            b"content-type: application/json",
            b"content-length: %d" % len(body),
            b"connection: close",
        ]
        if status == 503:
            head.append(b"retry-after: %d" % self.limits.retry_after)
        self.transport.write(b"\r\n".join(head) + b"\r\n\r\n" + body)
        self.transport.close()


class DenialAwareWebSocket(WebSocketsSansIOProtocol):
    """uvicorn's sans-I/O WebSocket protocol, except that a handshake answered with an
    HTTP denial (401, 403, 404) counts as answered: uvicorn logs every such refusal as
    "ASGI callable returned without completing handshake" at error level, which would
    page someone for each bad token."""

    async def send(self, message: Any) -> None:
        await super().send(message)
        if message["type"] == "websocket.http.response.body" and not message.get("more_body"):
            self.handshake_complete = True


def http_protocol(limits: ServerLimits) -> type[GuardedHttpProtocol]:
    """The protocol class uvicorn instantiates per connection, bound to ``limits``."""
    return type("GatewayHttpProtocol", (GuardedHttpProtocol,), {"limits": limits})
