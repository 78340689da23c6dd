"""The request digest: a 16-byte hash of what an effect call asked, stored with its record.

A what-if serves a recorded answer to the call that asks what the recorded call asked
(:class:`~pantheon.rerun.WhatIf`); the digest is how it knows, without keeping the
arguments. It covers the function and its arguments: the function is as much a part of the
request as the arguments, and a bound method or a closure carries hidden inputs (a
Learner's ``observe`` answers from the learner's state, a closure from its cells), so
calls that differ only there must not look equal.

Encoding: msgpack (msgspec) with dict keys sorted, so two equal requests encode alike
whatever order their dicts were built in. What msgspec encodes natively (plain data,
Structs, dataclasses, enums...) is itself. Anything else stands for itself only when it
can say so stably:

* a named function with no closure cells, a builtin function of a module, a class: its
  ``module:qualname``;
* a bound method: its function and the object it is bound to, encoded in turn;
* ``functools.partial``: its function, arguments and keywords;
* an object with a ``request_identity()`` method (:class:`agents.RequestIdentity`): what it
  returns (a model provider says which model behind which server, a tool which function;
  None, as a rate limiter says, encodes as None: an agent given a limiter asks the same);

anything else (an agent, a random generator, a closure, a lambda: every lambda of a
function shares one qualname) gives no digest at all, never one
built from a ``repr`` with an address in it. No digest makes a what-if decide that call by
the older rule, on the agent's whole configuration.

The marks that keep these apart from data that happens to look the same are msgpack
extension values, which no plain argument is.
"""

from __future__ import annotations

import functools
import hashlib
import types
from collections.abc import Callable
from typing import Any

import msgspec

from pantheon.sessions._journal import _array_header

__all__ = ["DIGEST_BYTES", "request_digest"]

#: Bytes of blake2b kept: 128 bits, so two different requests at one position collide with
#: probability 2**-128.
DIGEST_BYTES = 16

_FUNCTION = 1
_BOUND = 2
_PARTIAL = 3
_IDENTITY = 4


def _name(obj: Any) -> msgspec.msgpack.Ext:
    return msgspec.msgpack.Ext(_FUNCTION, f"{obj.__module__}:{obj.__qualname__}".encode())


#: Stand-ins already worked out, by the object's id, the object kept so that id is not reused:
#: the functions, classes and identity objects a team calls effects with are few and live as
#: long as it does, and working one out again was most of a digest (a rules provider's
#: identity, every pattern of its rules, encoded anew per model call). An identity is kept
#: encoded (``msgspec.Raw``: the very bytes it encodes to, so digests are unchanged). Emptied
#: when full. What is made anew at each use (a bound method, a builtin bound to an object,
#: a ``functools.partial``) is never kept: its parts are.
_known: dict[int, tuple[Any, Any]] = {}
_KNOWN_MAX = 4096
#: Kept for an object found to have no stable encoding (it stays so while it lives).
_UNSTABLE = object()


def _stand_in(obj: Any) -> Any:
    """What ``obj``, which msgspec cannot encode, is encoded as; TypeError: nothing stable."""
    hit = _known.get(id(obj))
    if hit is not None and hit[0] is obj:
        if hit[1] is _UNSTABLE:
            raise TypeError(f"{type(obj).__qualname__} has no stable encoding")
        return hit[1]
    if isinstance(obj, types.MethodType):
        return (msgspec.msgpack.Ext(_BOUND, b""), obj.__func__, obj.__self__)
    if isinstance(obj, functools.partial):
        return (msgspec.msgpack.Ext(_PARTIAL, b""), obj.func, obj.args, obj.keywords)
    if isinstance(obj, types.BuiltinFunctionType):
        bound = obj.__self__
        if bound is not None and not isinstance(bound, types.ModuleType):
            return (msgspec.msgpack.Ext(_BOUND, obj.__name__.encode()), bound)
    try:
        out = _lasting(obj)
    except TypeError:
        out = _UNSTABLE  # an agent bound to its own method: as long-lived, as often asked
        raise
    finally:
        if len(_known) >= _KNOWN_MAX:
            _known.clear()
        _known[id(obj)] = (obj, out)
    return out


def _lasting(obj: Any) -> Any:
    """The stand-in of an object that lives as long as the team: a function, a class, an
    object saying what stands for it (read once: :class:`agents.RequestIdentity` says it
    does not change)."""
    if isinstance(obj, types.FunctionType):
        if obj.__closure__:
            raise TypeError("a closure's cells are inputs the digest cannot see")
        if "<lambda>" in obj.__qualname__:
            raise TypeError("a lambda's name does not say which one it is")
        return _name(obj)
    if isinstance(obj, types.BuiltinFunctionType | type):
        return _name(obj)
    identity = getattr(type(obj), "request_identity", None)
    if callable(identity):
        said = identity(obj)
        if said is None:  # decides nothing: as if the argument were None
            return None
        cls = type(obj)
        mark = msgspec.msgpack.Ext(_IDENTITY, f"{cls.__module__}:{cls.__qualname__}".encode())
        # Encoded on its own (re-entering the shared encoder is not allowed), to the bytes
        # the pair would encode to in place.
        return msgspec.Raw(
            msgspec.msgpack.encode((mark, said), enc_hook=_stand_in, order="deterministic")
        )
    raise TypeError(f"{type(obj).__qualname__} has no stable encoding")


_encoder = msgspec.msgpack.Encoder(enc_hook=_stand_in, order="deterministic")

#: The encoding of a request's function (``msgspec.Raw``: encoded in place, the same bytes),
#: by the function (a bound method: by its function and object; the objects are kept so their
#: ids are not reused), or ``_UNSTABLE`` for a function with no stable encoding. Kept only
#: when every part of the function stands in through ``_known`` (lasting, or known
#: unstable): a method of an object msgspec encodes as data is encoded anew at each call, as
#: that data may change. In a 3,000-email pipeline run ~15,000 of ~21,000 effect calls are
#: methods of agents (no stable encoding), and each raised and caught a TypeError inside the
#: encoder: 2.9 µs a call, now 0.6 (a lookup; ``timeit``, min of 9). A stable call skips the
#: hook call for its function.
_prefixes: dict[Any, tuple[Any, Any]] = {}


def _lasting_part(obj: Any) -> Any:
    """What ``_known`` holds for ``obj`` (its stand-in or ``_UNSTABLE``), None when it holds
    nothing for it (it was never asked, or msgspec encodes it as data)."""
    hit = _known.get(id(obj))
    return hit[1] if hit is not None and hit[0] is obj else None


def _prefix(fn: Callable[..., Any]) -> Any:
    """The encoding of ``fn`` (``_UNSTABLE``: it has no stable encoding), kept in
    ``_prefixes`` when every part of ``fn`` lasts."""
    if type(fn) is types.MethodType:
        func, owner = fn.__func__, fn.__self__
        key: Any = (id(func), id(owner))
        hit = _prefixes.get(key)
        if hit is not None and hit[0][0] is func and hit[0][1] is owner:
            return hit[1]
        parts: tuple[Any, ...] = (func, owner)
    else:
        hit = _prefixes.get(id(fn))
        if hit is not None and hit[0][0] is fn:
            return hit[1]
        parts, key = (fn,), id(fn)
    try:
        out: Any = msgspec.Raw(_encoder.encode(fn))
    except Exception:
        out = _UNSTABLE
    kept = [_lasting_part(p) for p in parts]
    if any(k is _UNSTABLE for k in kept) or (out is not _UNSTABLE and None not in kept):
        if len(_prefixes) >= _KNOWN_MAX:
            _prefixes.clear()
        _prefixes[key] = (parts, out)
    return out


#: The hash state after a call's lasting lead: its function and its first argument, when that
#: argument stands for a lasting object (a model call's provider), by the function's encoding,
#: the object's id (the object kept, so the id is not reused) and the number of arguments.
#: The bytes hashed are exactly the call's whole encoding (a msgpack array is a header and
#: its items one after another), so the digest is the one a cold computation gives; what is
#: saved is encoding and hashing the lead again. In the nine-agent pipeline a model call's
#: provider is 2,010 of its request's 2,713 bytes (a rules provider's every pattern), and
#: blake2b was 38,000 of the 244,000 instructions recording added to the loop's thread per
#: email (callgrind; benchmarks/RESULTS.md, "Session 13").
_leads: dict[tuple[bytes, int, int], tuple[Any, Any]] = {}


def _lead_state(head: Any, lead: Any, n: int) -> Any:
    """A copy of blake2b after ``[function, [lead`` of an ``n``-argument call's encoding."""
    key = (bytes(head), id(lead), n)
    hit = _leads.get(key)
    if hit is None or hit[0] is not lead:
        state = hashlib.blake2b(b"\x93", digest_size=DIGEST_BYTES)  # (function, args, kwargs)
        state.update(head)
        state.update(_array_header(n) + _encoder.encode(lead))
        if len(_leads) >= _KNOWN_MAX:
            _leads.clear()
        hit = _leads[key] = (lead, state)
    return hit[1].copy()


def request_digest(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> bytes | None:
    """The digest of calling ``fn(*args, **kwargs)``, or None when some part of it has no
    stable encoding (see the module docstring). Never raises."""
    try:
        head = _prefix(fn)
        if head is _UNSTABLE:
            return None
        if 0 < len(args) < 16:
            lead = args[0]
            known = _known.get(id(lead))
            if known is not None and known[0] is lead and known[1] is not _UNSTABLE:
                state = _lead_state(head, lead, len(args))
                # The rest of the arguments and the keywords as a pair, without the pair's
                # header and the rest's: the bytes that follow the lead in the whole.
                state.update(memoryview(_encoder.encode((args[1:], kwargs)))[2:])
                return state.digest()
        blob = _encoder.encode((head, args, kwargs))
    except Exception:
        return None
    return hashlib.blake2b(blob, digest_size=DIGEST_BYTES).digest()
