"""Connecting to NATS and making sure the team's streams and directory bucket exist.

Both wait out what a fresh server or cluster does for a while after it starts (refusing
connections, no JetStream meta leader yet) and turn what will not get better (refused
credentials, a JetStream that refuses the config) into one error naming the cause.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.client import Client as NATS
from nats.js.api import KeyValueConfig, RetentionPolicy, StorageType, StreamConfig

from bus.backends.nats._errors import AuthorizationError, ConnectError
from bus.backends.nats._subjects import DLQ_STREAM, DLQ_SUBJECTS, directory_bucket

__all__ = ["connect", "ensure_streams"]

_log = logging.getLogger("bus.nats")


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
    """A client connected to one of ``urls`` as ``node``, reconnecting for ever after."""
    refused: list[BaseException] = []

    async def error_cb(exc: BaseException) -> None:
        if "authorization" in str(exc).lower() or "authentication" in str(exc).lower():
            refused.append(exc)
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
    try:
        async with asyncio.timeout(connect_timeout):
            # The client retries a refused connection like a dropped one: a refusal of
            # the credentials ends the wait at once instead of at the timeout.
            while not connecting.done() and not refused:
                await asyncio.wait({connecting}, timeout=0.05)
            if refused:
                connecting.cancel()
                with contextlib.suppress(BaseException):
                    await connecting
                with contextlib.suppress(Exception):
                    await nc.close()
                raise nats.errors.Error("authorization violation")
            await connecting
            return nc
    except (TimeoutError, OSError, nats.errors.Error) as exc:
        if not connecting.done():
            connecting.cancel()
            with contextlib.suppress(BaseException):
                await connecting
        with contextlib.suppress(Exception):
            await nc.close()
        text = f"{exc} {' '.join(map(str, refused))}".lower()
        if refused or "authorization" in text or "authentication" in text:
            raise AuthorizationError(
                f"NATS at {where} refused node {node!r}: authorization violation "
                "(check transport.credentials: user/password, nkey or creds)"
            ) from None
        raise ConnectError(
            f"cannot connect to NATS at {where} within {connect_timeout}s: "
            f"{type(exc).__name__} {exc}".rstrip()
        ) from None


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
