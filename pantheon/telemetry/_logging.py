"""One logging setup for every ``pantheon`` command: structlog in front, stdlib behind.

JSON lines when the stream is not a terminal (a file, a pipe, a collector), a readable
console when it is. Standard-library loggers (the OTel exporters, anything a user's agent
imports) go through the same processors, so one run writes one format.

Library code (``agents``, ``pantheon.sessions``) logs with :func:`get_logger`: a structlog
logger whose lines travel as stdlib records with their key-value pairs as ``extra``. Before
:func:`configure_logging` (a program that imports ``agents`` and never configures logging)
they behave like any library's stdlib logging: warnings to stderr, nothing on stdout, where
structlog's own default would print every line.

Each line gets the run's context without the bus paying per message: the session is bound
once per run with :func:`structlog.contextvars.bind_contextvars`, and :class:`BusContext`
reads the envelope being handled (``bus.current_envelope()``, a context-variable lookup)
only when a line is actually written, adding ``agent``, ``topic``, ``message_id`` and the
envelope's ``session``.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any, TextIO

import structlog

from bus import current_envelope, current_subscription

__all__ = ["LOG_LEVEL_ENV", "BusContext", "configure_logging", "get_logger"]

#: Environment variable for the level when ``configure_logging`` is not given one.
LOG_LEVEL_ENV = "PANTHEON_LOG_LEVEL"
_HANDLER_NAME = "pantheon"


class BusContext:
    """Adds what the running handler is working on: ``agent``, ``topic``, ``message_id``,
    ``session`` (keys the caller bound win).

    ``agent`` is the subscription name up to its first ``:``, which is the agent's name for
    subscriptions made by :class:`agents.Agent` (``name`` and ``name:<pattern>``)."""

    __slots__ = ()

    def __call__(
        self, logger: Any, method: str, event_dict: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        env = current_envelope()
        if env is None:
            return event_dict
        sub = current_subscription()
        if sub is not None:
            event_dict.setdefault("agent", sub.partition(":")[0])
        event_dict.setdefault("topic", env.topic)
        event_dict.setdefault("message_id", env.id)
        if env.session_id is not None:
            event_dict.setdefault("session", env.session_id)
        return event_dict


def _level(level: str | int | None) -> int:
    if level is None:
        level = os.environ.get(LOG_LEVEL_ENV, "WARNING")
    if isinstance(level, int):
        return level
    value = logging.getLevelName(level.strip().upper())
    if not isinstance(value, int):
        raise ValueError(
            f"log level {level!r} (from the argument or ${LOG_LEVEL_ENV}): "
            "want debug, info, warning, error or critical"
        )
    return value


def configure_logging(
    *,
    level: str | int | None = None,
    json: bool | None = None,
    stream: TextIO | None = None,
) -> None:
    """Send every log line (structlog and stdlib) to ``stream`` (stderr) in one format.

    ``json=None`` picks JSON lines unless ``stream`` is a terminal. ``level`` defaults to
    ``$PANTHEON_LOG_LEVEL``, else ``WARNING``. Calling it again replaces the previous setup.
    """
    out = stream if stream is not None else sys.stderr
    tty = out.isatty()
    as_json = not tty if json is None else json
    shared: list[Any] = [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.ExtraAdder(),
        structlog.stdlib.add_log_level,
        structlog.stdlib.add_logger_name,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        BusContext(),
        structlog.processors.StackInfoRenderer(),
    ]
    renderer: Any
    if as_json:
        shared.append(structlog.processors.dict_tracebacks)
        renderer = structlog.processors.JSONRenderer()
    else:
        renderer = structlog.dev.ConsoleRenderer(colors=tty)
    structlog.configure(
        processors=[*shared, structlog.stdlib.ProcessorFormatter.wrap_for_formatter],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(out)
    handler.set_name(_HANDLER_NAME)
    handler.setFormatter(
        structlog.stdlib.ProcessorFormatter(
            foreign_pre_chain=shared,
            processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        )
    )
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.get_name() == _HANDLER_NAME]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(_level(level))


def get_logger(name: str) -> Any:
    """A structlog logger that writes through the stdlib logger ``name`` (see the module
    docstring): ``log.info("event", key=value)``, ``log.bind(...)``."""
    return structlog.wrap_logger(
        logging.getLogger(name),
        processors=[structlog.stdlib.render_to_log_kwargs],
        wrapper_class=structlog.stdlib.BoundLogger,
    )
