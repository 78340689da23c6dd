"""Attaching to a running session's feed from another process: through its Unix socket
(:func:`connect`) or, from another machine, through the gateway's ``/v1/live`` WebSocket
(:func:`connect_url`). Both carry the same msgpack frames; only the framing differs."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Protocol

from pantheon.live._errors import FeedClosed, FeedNotFound, LiveError, ProtocolError
from pantheon.live._feed import SnapshotStream
from pantheon.live._snapshot import (
    PROTOCOL_VERSION,
    Hello,
    Redrive,
    RedriveResult,
    Snapshot,
)
from pantheon.live._wire import decode_server, encode, read_frame, socket_path
from pantheon.sessions import SessionInfo, SessionStore

__all__ = ["LiveClient", "connect", "connect_url", "live_sessions"]


class _Link(Protocol):
    """What a client reads frames from and writes them to."""

    async def recv(self) -> bytes:
        """The next frame's body; :class:`FeedClosed` at a clean end."""
        ...

    async def send(self, body: bytes) -> None: ...

    async def aclose(self) -> None: ...


class _SocketLink:
    """The feed's Unix socket: length-prefixed frames."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer

    async def recv(self) -> bytes:
        return await read_frame(self.reader)

    async def send(self, body: bytes) -> None:
        self.writer.write(len(body).to_bytes(4, "big") + body)
        await self.writer.drain()

    async def aclose(self) -> None:
        self.writer.close()
        with contextlib.suppress(ConnectionError):
            await self.writer.wait_closed()


class _WebSocketLink:
    """The gateway's ``/v1/live``: one frame per WebSocket message."""

    def __init__(self, ws: Any) -> None:
        self.ws = ws

    async def recv(self) -> bytes:
        from websockets.exceptions import ConnectionClosed

        try:
            data = await self.ws.recv()
        except ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code in (1000, 1001):
                raise FeedClosed("the feed closed the connection") from None
            raise ConnectionError(f"the gateway closed the live feed: {exc}") from None
        if not isinstance(data, bytes):
            raise ProtocolError("a text frame on the live feed")
        return data

    async def send(self, body: bytes) -> None:
        from websockets.exceptions import ConnectionClosed

        try:
            await self.ws.send(body)
        except ConnectionClosed as exc:
            raise ConnectionError(str(exc)) from None

    async def aclose(self) -> None:
        await self.ws.close()


class LiveClient:
    """One connection to a feed. ``async for snap in client`` yields the newest snapshot
    each time (a slow reader skips some, never falls behind) until the feed closes; the
    last one carries the session's final status. :meth:`redrive` asks the running process
    to re-publish a dead letter. Use ``async with await connect(path)`` or :meth:`aclose`.
    """

    def __init__(self, link: _Link, hello: Hello) -> None:
        self.session_id = hello.session_id
        self.scenario = hello.scenario
        self._link = link
        self._stream = SnapshotStream()
        self._requests = itertools.count(1)
        self._pending: dict[int, asyncio.Future[RedriveResult]] = {}
        self._error: LiveError | None = None
        self._task = asyncio.get_running_loop().create_task(self._read())

    def __repr__(self) -> str:
        return f"LiveClient({self.session_id!r})"

    async def __aenter__(self) -> LiveClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __aiter__(self) -> AsyncIterator[Snapshot]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[Snapshot]:
        while True:
            try:
                yield await self.next()
            except FeedClosed:
                return

    async def next(self, timeout: float | None = None) -> Snapshot:
        """The newest snapshot not yet returned; :class:`FeedClosed` once the feed ended
        (:class:`ProtocolError` if it ended by sending garbage)."""
        try:
            async with asyncio.timeout(timeout):
                return await self._stream.get()
        except FeedClosed:
            if self._error is not None:
                raise self._error from None
            raise

    async def redrive(self, entry_id: int, *, timeout: float = 10.0) -> RedriveResult:
        """Re-publish dead letter ``entry_id`` in the running process; the result says
        whether its subscription took it back."""
        if self._task.done():
            raise FeedClosed(f"the feed of {self.session_id} has closed")
        request = next(self._requests)
        fut: asyncio.Future[RedriveResult] = asyncio.get_running_loop().create_future()
        self._pending[request] = fut
        try:
            await self._link.send(encode(Redrive(request, entry_id))[4:])
            async with asyncio.timeout(timeout):
                return await fut
        except ConnectionError as exc:
            raise FeedClosed(f"the feed of {self.session_id} has closed: {exc}") from None
        finally:
            self._pending.pop(request, None)

    async def _read(self) -> None:
        try:
            while True:
                frame = decode_server(await self._link.recv())
                if isinstance(frame, Snapshot):
                    self._stream.put(frame)
                elif isinstance(frame, RedriveResult):
                    fut = self._pending.get(frame.request)
                    if fut is not None and not fut.done():
                        fut.set_result(frame)
                else:
                    raise ProtocolError(f"unexpected {type(frame).__name__} frame mid-stream")
        except (FeedClosed, ConnectionError):
            pass
        except ProtocolError as exc:
            self._error = exc
        finally:
            self._stream.close()
            for fut in self._pending.values():
                if not fut.done():
                    fut.set_exception(self._error or FeedClosed("the feed has closed"))

    async def aclose(self) -> None:
        await self._link.aclose()
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


async def connect(path: str | os.PathLike[str], *, timeout: float = 5.0) -> LiveClient:
    """Attach to the feed listening on ``path``; :class:`FeedNotFound` when nothing does."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_unix_connection(str(path))
            try:
                hello = decode_server(await read_frame(reader))
            except BaseException:
                writer.close()
                raise
    except (FileNotFoundError, ConnectionRefusedError) as exc:
        raise FeedNotFound(f"no live feed at {path} ({exc.strerror})") from None
    except FeedClosed:
        raise FeedNotFound(
            f"the live feed at {path} closed on connect (too many clients?)"
        ) from None
    except TimeoutError:
        raise FeedNotFound(f"no answer from the live feed at {path} within {timeout}s") from None
    link = _SocketLink(reader, writer)
    return LiveClient(link, await _greeted(hello, path, link))


async def _greeted(hello: Any, where: object, link: _Link) -> Hello:
    problem = None
    if not isinstance(hello, Hello):
        problem = f"{where}: expected a hello frame, got {type(hello).__name__}"
    elif hello.version != PROTOCOL_VERSION:
        problem = f"{where}: feed speaks protocol {hello.version}, this client {PROTOCOL_VERSION}"
    if problem is not None:
        await link.aclose()
        raise ProtocolError(problem)
    return hello


async def connect_url(url: str, *, token: str | None = None, timeout: float = 5.0) -> LiveClient:
    """Attach to a feed through a gateway: ``ws://host:8787/v1/live`` (``http://`` is taken
    as ``ws://``), with a bearer ``token`` when the gateway has tokens. Needs the
    ``websockets`` package (the ``gateway`` extra installs it)."""
    try:
        import websockets
    except ImportError:
        raise ImportError(
            "a remote live feed needs websockets: pip install 'pantheon[gateway]'"
        ) from None
    if url.startswith(("http://", "https://")):
        url = "ws" + url[4:]
    headers = {"Authorization": f"Bearer {token}"} if token else None
    try:
        async with asyncio.timeout(timeout):
            ws = await websockets.connect(
                url, additional_headers=headers, compression=None, max_size=None
            )
            link = _WebSocketLink(ws)
            hello = decode_server(await link.recv())
    except websockets.InvalidStatus as exc:
        status = exc.response.status_code
        raise FeedNotFound(f"{url}: the gateway answered {status}") from None
    except (OSError, websockets.InvalidURI, websockets.InvalidHandshake) as exc:
        raise FeedNotFound(f"no live feed at {url} ({exc})") from None
    except FeedClosed:
        raise FeedNotFound(f"the live feed at {url} closed on connect") from None
    except TimeoutError:
        raise FeedNotFound(f"no answer from the live feed at {url} within {timeout}s") from None
    return LiveClient(link, await _greeted(hello, url, link))


def live_sessions(store: SessionStore) -> list[tuple[SessionInfo, Path]]:
    """Running sessions of ``store`` with a feed socket, newest first (the socket may still
    be stale if its process just died: :func:`connect` says so)."""
    out = []
    for info in store.sessions():
        if info.status != "running":
            continue
        path = socket_path(store.path, info.id)
        if path.exists():
            out.append((info, path))
    return out
