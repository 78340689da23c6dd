"""Running the gateway's ASGI app with uvicorn inside the run's own event loop.

The gateway shares the loop (and the bus) with the team: no thread, no second loop, so a
handler that publishes and the bus that delivers are the same objects the agents use. The
server does not install signal handlers of its own (``pantheon serve`` owns Ctrl-C: it
ends the input, lets the team finish and records the session before stopping).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import socket
import traceback
from collections.abc import Callable, Iterator, Mapping
from types import TracebackType
from typing import Any

import uvicorn

from bus import Bus
from pantheon.gateway._app import GatewayState, build_app
from pantheon.gateway._auth import Tokens, load_tokens, token_digest
from pantheon.gateway._errors import GatewayError
from pantheon.gateway._fanout import Encoder
from pantheon.gateway._protocol import DenialAwareWebSocket, ServerLimits, http_protocol
from pantheon.runner import HttpSource
from pantheon.scenario import GatewayConfig

__all__ = ["Gateway"]

log = logging.getLogger("pantheon.gateway")

#: Where a token can appear in a server's log line: the ``access_token`` parameter of a
#: logged URL, an ``Authorization`` header, a ``Bearer <token>`` credential anywhere (a repr
#: of headers) or a ``bearer.<token>`` subprotocol in what uvicorn and websockets print.
_SECRETS = re.compile(
    r"(access_token=)[^&\s\"']*"
    r"|(?i:(authorization:\s*\S+\s+))[^\s\"']+"
    r"|(?i:(bearer\.))[^\s,\"']+"
    r"|(?i:(bearer\s+))[^\s,\"']+"
)
#: Runs of characters a token can stand in (tokens hold no whitespace), so a token that
#: appears anywhere else (an exception's message, a repr of headers, ``token:...``, a path)
#: is found by value: every window of a token's length in the run is hashed.
_CANDIDATES = re.compile(r"\S{16,}")
#: Longest run searched window by window (a window per character and token length, about
#: 0.5 µs each); a longer one (a payload's repr) is searched between its punctuation only.
MAX_SCANNED = 4096
_WORDS = re.compile(r"[^\s'\"(),;:/.=&<>\[\]{}\\]{16,}")
#: Attributes every LogRecord has; anything else was passed as ``extra`` and is redacted too.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def _hide(m: re.Match[str]) -> str:
    return (m.group(1) or m.group(2) or m.group(3) or m.group(4)) + "***"


class _RedactTokens(logging.Filter):
    """Replace any token in a log record by ``***`` before a handler sees it: in the
    message and its arguments, in ``extra`` values, and in a traceback.

    A traceback is rendered here, as text without local variables, and the exception
    removed from the record: a formatter that renders frames with their locals (structlog's
    ``dict_tracebacks`` does) would print a request's headers, token included, from every
    frame that holds the request. Tokens are found by where they stand (``Bearer ...``,
    ``access_token=...``) and by value: every window of a token's length in a run of
    non-blank characters is compared, as a SHA-256 digest, with the configured tokens'
    digests, so punctuation around a token (``token:...``, ``.../<token>``, base64 ``=``)
    does not hide it.
    """

    def __init__(self) -> None:
        super().__init__()
        self.digests: set[bytes] = set()
        #: Token lengths to try, longest first (see :attr:`Tokens.lengths`).
        self.lengths: tuple[int, ...] = ()

    def redact(self, text: str) -> str:
        text = _SECRETS.sub(_hide, text)
        if self.digests:
            text = _CANDIDATES.sub(self._by_value, text)
        return text

    def _by_value(self, m: re.Match[str]) -> str:
        run = m.group()
        if len(run) > MAX_SCANNED:
            return _WORDS.sub(self._whole, run)
        digests, lengths = self.digests, self.lengths
        out: list[str] = []
        i = start = 0
        while i < len(run):
            for n in lengths:
                if i + n <= len(run) and token_digest(run[i : i + n]) in digests:
                    out += (run[start:i], "***")
                    i = start = i + n
                    break
            else:
                i += 1
        out.append(run[start:])
        return "".join(out)

    def _whole(self, m: re.Match[str]) -> str:
        word = m.group()
        return "***" if token_digest(word) in self.digests else word

    def scrub(self, value: Any) -> Any:
        """``value`` with every token in it replaced, containers rebuilt as needed."""
        if isinstance(value, str):
            return self.redact(value)
        if isinstance(value, dict):
            return {k: self.scrub(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [self.scrub(v) for v in value]
        if value is None or isinstance(value, bool | int | float):
            return value
        shown = repr(value)
        hidden = self.redact(shown)
        return value if hidden == shown else hidden

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, dict):  # structlog's own record: its event dict
            record.msg = self.scrub(record.msg)
        else:
            try:
                text = record.getMessage()
            except (TypeError, ValueError):  # a malformed call: its parts are redacted
                text = f"{record.msg} {record.args}"
            record.msg, record.args = self.redact(text), None
        if record.exc_info:
            if record.exc_info[1] is not None:
                rendered = "".join(traceback.format_exception(record.exc_info[1]))
                record.msg = f"{record.msg}\n{self.redact(rendered)}"
            record.exc_info = None
            record.exc_text = None
        for key, value in list(vars(record).items()):
            if key not in _STANDARD:
                setattr(record, key, self.scrub(value))
        return True


_REDACT = _RedactTokens()
_LOGGERS = (
    "uvicorn",
    "uvicorn.error",
    "uvicorn.access",
    "websockets",
    "websockets.server",
    "websockets.protocol",
    "pantheon.gateway",
)


class Gateway:
    """The HTTP/WebSocket gateway over ``bus``. ``async with Gateway(bus, config)``; the bus
    must be started first. ``inboxes`` maps Observer names to their :class:`HttpSource`
    (``POST /v1/inbox/<name>``); ``live()`` gives the run's :class:`~pantheon.live.LiveFeed`
    (or ``None``), served at ``/v1/live`` for a remote ``pantheon monitor --url``.
    ``limits`` bounds each connection's time and size and the number of connections."""

    def __init__(
        self,
        bus: Bus,
        config: GatewayConfig | None = None,
        *,
        inboxes: Mapping[str, HttpSource] | None = None,
        tokens: Tokens | None = None,
        live: Callable[[], Any] | None = None,
        limits: ServerLimits | None = None,
    ) -> None:
        config = config if config is not None else GatewayConfig()
        if tokens is None:
            tokens = load_tokens(config.tokens_file, config.tokens_env)
        self.config = config
        self.limits = (limits if limits is not None else ServerLimits()).fitted()
        self.state = GatewayState(
            bus,
            config,
            tokens,
            dict(inboxes or {}),
            live,
            encoder=Encoder(self.limits.encoded_bytes),
            client_bytes=self.limits.client_bytes,
        )
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self.port = config.port

    @property
    def url(self) -> str:
        host = self.config.host
        return f"http://{f'[{host}]' if ':' in host else host}:{self.port}"

    async def start(self) -> None:
        limits = self.limits
        config = uvicorn.Config(
            build_app(self.state),
            host=self.config.host,
            port=self.config.port,
            loop="none",
            http=http_protocol(limits),
            ws=DenialAwareWebSocket,
            timeout_keep_alive=limits.idle_timeout,
            backlog=limits.backlog,
            ws_max_size=self.config.max_body,
            ws_per_message_deflate=self.config.compression,
            lifespan="off",
            access_log=False,  # ours (pantheon.gateway) never prints a query string
            log_config=None,
            server_header=False,
            timeout_graceful_shutdown=5,
        )
        # A logger's filters see only its own records, not its children's: every logger the
        # server writes through is listed, and the root's handlers get the filter too.
        _REDACT.digests |= self.state.tokens.digests
        _REDACT.lengths = tuple(
            sorted(set(_REDACT.lengths) | set(self.state.tokens.lengths), reverse=True)
        )
        for name in _LOGGERS:
            logger = logging.getLogger(name)
            if _REDACT not in logger.filters:
                logger.addFilter(_REDACT)
        for handler in logging.getLogger().handlers:
            if _REDACT not in handler.filters:
                handler.addFilter(_REDACT)
        # The listening socket is ours: a port in use is a GatewayError naming it, where
        # uvicorn would call sys.exit(3) from inside the run's event loop.
        host, port = self.config.host, self.config.port
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError as exc:
            sock.close()
            raise GatewayError(
                f"the gateway cannot listen on {host}:{port}: {exc.strerror or exc}"
            ) from None
        self.port = sock.getsockname()[1]
        server = _Server(config)
        self._server = server
        self._task = asyncio.get_running_loop().create_task(
            server.serve(sockets=[sock]), name="gateway"
        )
        while not server.started:
            if self._task.done():
                sock.close()
                raise GatewayError(f"the gateway could not start on {host}:{self.port}")
            await asyncio.sleep(0.01)
        self.state.ready = True
        log.info("gateway listening on %s", self.url)

    async def aclose(self) -> None:
        """Stop: not ready, every subscriber's stream ended, then the server shut down."""
        self.state.ready = False
        for client in list(self.state.clients.values()):
            client.close()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.gather(self._task, return_exceptions=True)
            if self._task.done() and not self._task.cancelled() and self._task.exception():
                log.error("the gateway stopped with an error", exc_info=self._task.exception())

    async def __aenter__(self) -> Gateway:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


class _Server(uvicorn.Server):
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield  # the run owns signals, not the server
