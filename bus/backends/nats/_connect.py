"""Connecting to NATS and making sure the team's streams and directory bucket exist.

Both wait out what a fresh server or cluster does for a while after it starts (refusing
connections, no JetStream meta leader yet) and turn what will not get better (refused
credentials, a JetStream that refuses the config) into one error naming the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js.api import KeyValueConfig, RetentionPolicy, StorageType, StreamConfig

from bus.backends.nats._errors import AuthorizationError, ConnectError
from bus.backends.nats._subjects import DLQ_STREAM, DLQ_SUBJECTS, directory_bucket

__all__ = ["REFUSED_FOR", "connect", "ensure_streams", "probe"]

_log = logging.getLogger("bus.nats")


#: Seconds a first connection goes on trying while every attempt is refused (nothing
#: listens at any of the URLs) before it fails saying so. A server started beside the run
#: opens its port within this; a wrong URL or a stopped server is one error at once, rather
#: than the whole connect timeout of retries, a warning each.
REFUSED_FOR = 1.0


async def connect(
    urls: list[str],
    node: str,
    credentials: dict[str, Any],
    connect_timeout: float,
    *,
    closed: Callable[[], bool],
    disconnected_cb: Callable[[], Awaitable[None]],
    reconnected_cb: Callable[[], Awaitable[None]],
) -> Any:
    """A client connected to one of ``urls`` as ``node``, reconnecting for ever after.

    Until the first connection is made, the client's errors are not logged but kept: what
    goes wrong then is said once, in the :class:`ConnectError` raised (``connection
    refused`` after :data:`REFUSED_FOR` seconds of nothing but refusals, else the last
    error at ``connect_timeout``); after it, each is a warning."""
    denied: list[BaseException] = []
    attempts: list[BaseException] = []
    up = False

    async def error_cb(exc: BaseException) -> None:
        if "authorization" in str(exc).lower() or "authentication" in str(exc).lower():
            denied.append(exc)
        elif not up:
            attempts.append(exc)
        elif not closed():
            _log.warning("NATS node %s: %s", node, exc)

    where = ", ".join(urls)
    nc = NATS()
    connecting = asyncio.ensure_future(
        nc.connect(
            servers=urls,
            name=node,
            allow_reconnect=True,
            max_reconnect_attempts=-1,
            # nats-py annotates these int; it sleeps and times out on them as floats.
            reconnect_time_wait=0.1,  # type: ignore[arg-type]
            connect_timeout=min(2.0, connect_timeout),  # type: ignore[arg-type]
            error_cb=error_cb,
            disconnected_cb=disconnected_cb,
            reconnected_cb=reconnected_cb,
            **credentials,
        )
    )
    loop = asyncio.get_running_loop()
    give_up = loop.time() + min(REFUSED_FOR, connect_timeout)
    try:
        async with asyncio.timeout(connect_timeout):
            # The client retries a refused connection like a dropped one: a refusal of
            # the credentials, or of every connection for REFUSED_FOR, ends the wait at
            # once instead of at the timeout.
            while not connecting.done() and not denied:
                if attempts and all(map(_refused, attempts)) and loop.time() >= give_up:
                    raise ConnectionRefusedError
                await asyncio.wait({connecting}, timeout=0.05)
            if denied:
                raise nats.errors.Error("authorization violation")
            await connecting
            up = True
            return nc
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        if not connecting.done():
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
        with contextlib.suppress(Exception):
            await nc.close()
        text = f"{exc} {' '.join(map(str, denied))}".lower()
        if denied or "authorization" in text or "authentication" in text:
            raise AuthorizationError(
                f"NATS at {where} refused node {node!r}: authorization violation "
                "(check transport.credentials: user/password, nkey or creds)"
            ) from None
        if isinstance(exc, ConnectionRefusedError):
            raise ConnectError(
                f"cannot connect to NATS at {where}: connection refused (nothing listens there)"
            ) from None
        last = attempts[-1] if attempts else exc
        raise ConnectError(
            f"cannot connect to NATS at {where} within {connect_timeout}s: {_said(last)}"
        ) from None


async def probe(urls: list[str], node: str, credentials: dict[str, Any], timeout: float) -> None:
    """Connect to one of ``urls`` as ``node`` and leave: raises what :func:`connect` does
    when no server can be reached or the credentials are refused, and nothing else."""
    nc = await connect(
        urls,
        node,
        credentials,
        timeout,
        closed=lambda: True,
        disconnected_cb=_nothing,
        reconnected_cb=_nothing,
    )
    with contextlib.suppress(Exception):
        await nc.close()


async def _nothing() -> None:
    return None


def _refused(exc: BaseException) -> bool:
    """Whether an attempt failed because nothing listens at the address (or at every
    address its name resolves to)."""
    if isinstance(exc, ConnectionRefusedError):
        return True
    # asyncio joins the failures of a name's several addresses into one OSError without an
    # errno: "Multiple exceptions: [Errno 111] Connect call failed ..., [Errno 111] ...".
    text = str(exc)
    return (
        isinstance(exc, OSError)
        and text.startswith("Multiple exceptions:")
        and text.count("[Errno ") == text.count(f"[Errno {errno.ECONNREFUSED}]")
    )


def _said(exc: BaseException) -> str:
    """An attempt's error in words: ``connection refused``, ``no answer``, or the error."""
    if _refused(exc):
        return "connection refused"
    if isinstance(exc, TimeoutError | nats.errors.TimeoutError):
        return "no answer"
    return f"{type(exc).__name__}: {exc}".rstrip(": ")


async def ensure_streams(
    js: Any,
    *,
    node: str,
    team: str,
    stream: str,
    storage: str,
    replicas: int,
    dedup_window: float,
    max_age: float,
) -> Any:
    """The team's stream, the DLQ stream and the directory bucket (returned); retried while
    a cluster is still electing its JetStream leader."""
    kind = StorageType.FILE if storage == "file" else StorageType.MEMORY
    configs = [
        StreamConfig(
            name=stream,
            subjects=[f"pantheon.{team}.>"],
            retention=RetentionPolicy.LIMITS,
            storage=kind,
            num_replicas=replicas,
            duplicate_window=dedup_window,
            max_age=max_age,
        ),
        StreamConfig(
            name=DLQ_STREAM,
            subjects=[DLQ_SUBJECTS],
            retention=RetentionPolicy.LIMITS,
            storage=kind,
            num_replicas=replicas,
            duplicate_window=dedup_window,
        ),
    ]
    while True:
        try:
            for config in configs:
                await _add_stream(js, config)
            await js.create_key_value(
                KeyValueConfig(
                    bucket=directory_bucket(team),
                    history=1,
                    storage=kind,
                    replicas=replicas,
                )
            )
            return await js.key_value(directory_bucket(team))
        except (nats.errors.TimeoutError, nats.js.errors.ServiceUnavailableError) as exc:
            _log.info("NATS node %s: JetStream not ready yet (%s)", node, exc)
            await asyncio.sleep(0.2)
        except nats.js.errors.APIError as exc:
            if exc.code in (500, 503):
                await asyncio.sleep(0.2)  # no meta leader yet
                continue
            raise ConnectError(f"NATS refused to set up JetStream for {team!r}: {exc}") from None


async def _add_stream(js: Any, config: StreamConfig) -> None:
    try:
        await js.add_stream(config)
    except nats.js.errors.BadRequestError as exc:
        if exc.err_code != 10058:  # already exists with another config: keep that one
            raise
        await js.stream_info(config.name)
