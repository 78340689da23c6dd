"""One decode path for bytes that came from outside the process.

Every transport frame, gateway body, feed frame and stored payload is decoded through
:class:`UntrustedDecoder`, so a hostile or corrupt input fails the same way everywhere: one
:class:`~bus.DecodeError` naming what was decoded, why, and how many bytes it had. msgspec
alone raises four unrelated types on bad input (``msgspec.DecodeError``, ``RecursionError``
for deep nesting, ``UnicodeDecodeError`` for a string that is not UTF-8, ``OverflowError``
and ``ValidationError`` for numbers out of range); a reader that caught only the first let the
others escape into its loop, which is how one 100,000-deep message hung a NATS run.

Bounds:

* **size**: ``max_bytes``, checked before decoding (a ``len``, free).
* **depth**: msgspec guards its recursion with the interpreter's recursion limit, so no
  input can nest deeper than that (about 1,000 levels) without failing here. That is the
  bound on the hot path: an explicit walk of the decoded value costs 2-4 µs per KB, as much
  as the decode itself. Where the value is passed on through deeper call stacks (a gateway
  body is published, recorded and served), ``max_depth`` sets a tighter bound, checked by a
  walk of the decoded containers only when the input is long enough to reach it.
"""

from __future__ import annotations

from typing import Any, Generic, Literal, TypeVar

import msgspec

from bus._errors import DecodeError

__all__ = ["DEFAULT_MAX_DECODE_BYTES", "UntrustedDecoder"]

#: Largest input decoded by default: 64 MiB, the same order as the transports' frame limits.
DEFAULT_MAX_DECODE_BYTES = 64 * 1024 * 1024

T = TypeVar("T")

# What a decoder raises on bad input besides RecursionError. ``ValueError`` covers msgspec's
# own errors and ``UnicodeDecodeError``; ``TypeError`` a dec_hook given an unexpected value.
_FAILURES = (ValueError, OverflowError, TypeError)


def _depth_exceeds(value: Any, limit: int) -> bool:
    """Whether ``value`` nests containers (dicts, lists, tuples, structs) deeper than
    ``limit``. Walked with an explicit stack, so the check itself cannot recurse."""
    stack: list[tuple[Any, int]] = [(value, 1)]
    pop, push = stack.pop, stack.append
    while stack:
        item, depth = pop()
        if isinstance(item, dict):
            children: Any = (*item.keys(), *item.values())
        elif isinstance(item, (list, tuple)):
            children = item
        elif isinstance(item, msgspec.Struct):
            children = [getattr(item, name) for name in item.__struct_fields__]
        else:
            continue
        if depth > limit:
            return True
        for child in children:
            if isinstance(child, (dict, list, tuple, msgspec.Struct)):
                push((child, depth + 1))
    return False


class UntrustedDecoder(Generic[T]):
    """Decodes untrusted msgpack or JSON into ``type``; any failure is a
    :class:`~bus.DecodeError` with ``reason`` ``"malformed"``, ``"too_large"`` or
    ``"too_deep"``. ``what`` names the input in the error (``"NATS message"``)."""

    __slots__ = ("_decode", "format", "max_bytes", "max_depth", "what")

    def __init__(
        self,
        type: Any = Any,
        *,
        format: Literal["msgpack", "json"] = "msgpack",
        what: str = "message",
        max_bytes: int = DEFAULT_MAX_DECODE_BYTES,
        max_depth: int | None = None,
    ) -> None:
        decoder: msgspec.msgpack.Decoder[Any] | msgspec.json.Decoder[Any]
        if format == "msgpack":
            decoder = msgspec.msgpack.Decoder(type)
        elif format == "json":
            decoder = msgspec.json.Decoder(type)
        else:
            raise ValueError(f"UntrustedDecoder format must be 'msgpack' or 'json', not {format!r}")
        self._decode = decoder.decode
        self.format = format
        self.what = what
        self.max_bytes = max_bytes
        self.max_depth = max_depth

    def decode(self, data: bytes | bytearray | memoryview) -> T:
        size = len(data)
        if size > self.max_bytes:
            raise DecodeError(
                self.what, "too_large", size, f"over the limit of {self.max_bytes} bytes"
            )
        try:
            value: T = self._decode(data)
        except RecursionError as exc:
            limit = self.max_depth
            why = "nested too deep to decode" if limit is None else f"nested over {limit} levels"
            raise DecodeError(self.what, "too_deep", size, why) from exc
        except _FAILURES as exc:
            # Chained, so a reader can tell a schema mismatch (msgspec.ValidationError) from
            # bytes that are not the format at all.
            raise DecodeError(self.what, "malformed", size, _why(exc)) from exc
        limit = self.max_depth
        # Each level of nesting takes at least one byte, so a short input cannot be too deep.
        if limit is not None and size > limit and _depth_exceeds(value, limit):
            raise DecodeError(self.what, "too_deep", size, f"nested over {limit} levels")
        return value

    __call__ = decode


def _why(exc: BaseException) -> str:
    """One line: msgspec's own messages say what is wrong; others need their type."""
    text = str(exc).splitlines()[0][:200] if str(exc) else ""
    if isinstance(exc, msgspec.MsgspecError) and text:
        return text
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
