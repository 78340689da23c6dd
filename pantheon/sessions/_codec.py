"""How payloads and effect results are stored: msgpack via msgspec, never pickle.

A value msgspec cannot encode (an arbitrary object, an int past 64 bits, a dict with
unhashable-to-msgpack keys) is stored as its ``repr()`` with a flag, so recording never
fails on a payload and never pretends to have kept what it could not.
"""

from __future__ import annotations

import reprlib
import sys
from typing import Any

import msgspec

from bus import UntrustedDecoder

__all__ = ["decode", "encode", "normalize", "safe_repr"]

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder()
# A store file can be damaged or written by anything: what is read back goes through the
# bus's one untrusted path, so every failure is one DecodeError the reader reports. No size
# bound: what was recorded, however large, must read back (SQLite already holds it).
_stored = UntrustedDecoder[Any](what="stored value", max_bytes=sys.maxsize)
_repr = reprlib.Repr()
_repr.maxstring = 10_000
_repr.maxother = 10_000
_repr.maxlevel = 8
_repr.maxdict = _repr.maxlist = _repr.maxtuple = _repr.maxset = 1_000


def safe_repr(value: Any) -> str:
    """``repr(value)``, bounded in size, never raising."""
    try:
        return _repr.repr(value)
    except Exception as exc:  # a broken __repr__ must not break recording
        return f"<unrepresentable {type(value).__qualname__}: {type(exc).__name__}>"


def encode(value: Any) -> tuple[bytes, bool]:
    """``(msgpack bytes, stored_as_repr)``; the bytes decode to the value or to its repr."""
    try:
        return _encoder.encode(value), False
    except Exception:
        return _encoder.encode(safe_repr(value)), True


def decode(blob: bytes | None) -> Any:
    """A stored value; :class:`~bus.DecodeError` when the bytes are damaged."""
    return None if blob is None else _stored.decode(blob)


def normalize(value: Any) -> tuple[Any, bool]:
    """The value as it reads back from the store (tuples become lists, structs maps...), so
    a live payload compares equal to a stored one exactly when their records match."""
    blob, as_repr = encode(value)
    return _decoder.decode(blob), as_repr
