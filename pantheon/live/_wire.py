"""Framing of the feed's Unix socket: a 4-byte big-endian length, then one msgpack value.

msgpack through msgspec, never pickle: a client may be any process that can open the
socket, and decoding its frames must not run its code. A payload the encoder cannot
represent (an arbitrary object in an envelope) goes as its ``repr``.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

import msgspec

from bus import DecodeError, UntrustedDecoder
from pantheon.live._errors import FeedClosed, ProtocolError
from pantheon.live._snapshot import ClientFrame, ServerFrame

__all__ = [
    "MAX_FRAME",
    "decode_client",
    "decode_server",
    "encode",
    "read_frame",
    "socket_path",
]

#: Largest frame either side accepts. A snapshot is bounded by the feed's limits (recent
#: dead letters and traces); a peer announcing more is not speaking this protocol.
MAX_FRAME = 64 * 1024 * 1024
#: Linux limits a socket path (``sun_path``) to 107 bytes.
_MAX_SOCKET_PATH = 107


def _fallback(obj: Any) -> Any:
    return repr(obj)


_encoder = msgspec.msgpack.Encoder(enc_hook=_fallback)
_server = UntrustedDecoder[ServerFrame](ServerFrame, what="feed frame", max_bytes=MAX_FRAME)
_client = UntrustedDecoder[ClientFrame](ClientFrame, what="client frame", max_bytes=MAX_FRAME)


def encode(frame: Any) -> bytes:
    """One frame, length prefix included."""
    body = _encoder.encode(frame)
    return len(body).to_bytes(4, "big") + body


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    """The next frame's body; :class:`FeedClosed` at a clean end of stream."""
    try:
        head = await reader.readexactly(4)
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise ProtocolError("connection closed inside a frame header") from None
        raise FeedClosed("the feed closed the connection") from None
    size = int.from_bytes(head, "big")
    if size > MAX_FRAME:
        raise ProtocolError(f"frame of {size} bytes exceeds the {MAX_FRAME}-byte limit")
    try:
        return await reader.readexactly(size)
    except asyncio.IncompleteReadError:
        raise ProtocolError(f"connection closed inside a {size}-byte frame") from None


def decode_server(body: bytes) -> ServerFrame:
    try:
        return _server.decode(body)
    except DecodeError as exc:
        raise ProtocolError(f"not a feed frame: {exc}") from None


def decode_client(body: bytes) -> ClientFrame:
    try:
        return _client.decode(body)
    except DecodeError as exc:
        raise ProtocolError(f"not a client frame: {exc}") from None


def socket_path(store_path: str | os.PathLike[str], session_id: str) -> Path:
    """Where the feed of ``session_id`` listens: ``live/<session>.sock`` beside the store
    file, so a monitor finds it from the store path alone.

    A store deep enough that this passes the 107 bytes a Unix socket path may have (a team
    in a long project path) gets a folder of its own under the temporary directory instead,
    named by a hash of the store's path, so the monitor still finds it from the store."""
    store = Path(store_path).resolve()
    path = store.parent / "live" / f"{session_id}.sock"
    if len(os.fsencode(path)) <= _MAX_SOCKET_PATH:
        return path
    digest = hashlib.sha1(os.fsencode(store)).hexdigest()[:16]
    short = Path(tempfile.gettempdir()) / f"pantheon-{os.getuid()}" / digest / f"{session_id}.sock"
    if len(os.fsencode(short)) > _MAX_SOCKET_PATH:
        raise ValueError(
            f"live feed socket path {path} is longer than the {_MAX_SOCKET_PATH} bytes a Unix "
            "socket allows, and so is the temporary directory's; set TMPDIR to a short path"
        )
    return short
