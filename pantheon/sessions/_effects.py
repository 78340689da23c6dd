"""The recording :class:`agents.Effects` runner (a re-run's, ``pantheon.rerun``, builds on it).

An effect is keyed by (session, causing envelope id, subscriber, ordinal): the causing
envelope is ``bus.current_envelope()`` (id 0 outside handlers), the subscriber is the bus
worker running the handler, and the ordinal counts that subscriber's effects for that
envelope (the bus keeps the count with the handling, over its attempts: ``Running.effects``;
outside handlers the runner counts). Keying by subscriber as well as envelope keeps two
subscribers of one message from interleaving their ordinals differently on replay, where
served effects never wait.
"""

from __future__ import annotations

import random
import sys
import time
import types
from collections.abc import Callable, Coroutine
from inspect import isawaitable
from typing import TYPE_CHECKING, Any

import msgspec

from bus import current_handler
from pantheon.sessions._codec import encode
from pantheon.sessions._digest import request_digest
from pantheon.sessions._errors import RecordedError
from pantheon.sessions._store import (
    EFFECT_ERROR,
    EFFECT_OK,
    EFFECT_REPR,
)

__all__ = [
    "EffectsContext",
    "RecordingEffects",
    "rebuild_error",
    "type_name",
]

EffectSink = Callable[[tuple[Any, ...]], None]

#: Result types found not awaitable. ``inspect.isawaitable`` of a plain result (a dict, a
#: list, None: most effects are synchronous tools and lookups) asks the ``Awaitable`` ABC,
#: 385 ns a call (``timeit``, min of 7); a set lookup is ~30. A generator's awaitability is
#: its own (a generator-based coroutine), never its type's, so generators are not kept.
_PLAIN_RESULTS: set[type] = set()


def _awaitable(result: Any) -> bool:
    cls = type(result)
    if cls is types.CoroutineType:
        return True
    if cls in _PLAIN_RESULTS:
        return False
    if isawaitable(result):
        return True
    if cls is not types.GeneratorType and len(_PLAIN_RESULTS) < 1024:
        _PLAIN_RESULTS.add(cls)
    return False


def type_name(exc: BaseException) -> str:
    cls = type(exc)
    if isinstance(exc, RecordedError):
        return exc.type_name
    return (
        cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
    )


_recorded_types: dict[str, type[RecordedError]] = {}


def rebuild_error(qualified: str, message: str) -> Exception:
    """The exception an effect raised in the original run, for re-raising on replay.

    Rebuilt as the same type when that type is already loaded (we never import a module
    named by a store) and takes a single message; otherwise a :class:`RecordedError`
    subclass carrying the same type name and message."""
    module, _, qualname = qualified.rpartition(".") if "." in qualified else ("", "", qualified)
    if not module:
        module, qualname = "builtins", qualified
    obj: Any = sys.modules.get(module)
    # Nested classes: the module part may itself contain class names; walk from the longest
    # loaded module prefix.
    if obj is None:
        parts = qualified.split(".")
        for i in range(len(parts) - 1, 0, -1):
            mod = sys.modules.get(".".join(parts[:i]))
            if mod is not None:
                obj, qualname = mod, ".".join(parts[i:])
                break
    if obj is not None:
        for part in qualname.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, type) and issubclass(obj, Exception):
            try:
                exc = obj(message)
                if str(exc) == message:
                    return exc
            except Exception:
                pass
    short = qualified.rpartition(".")[2] or qualified
    cls = _recorded_types.get(qualified)
    if cls is None:
        cls = type(short, (RecordedError,), {"__module__": __name__})
        _recorded_types[qualified] = cls
    return cls(qualified, message)


class EffectsContext(msgspec.Struct, array_like=True, dict=True):
    """What a recorder puts in ``bus.context`` (so on every envelope): an :class:`Effects`
    that forwards to its ``runner``.

    Why not the runner itself: envelopes are journaled by encoding them whole with msgspec,
    and a msgspec Struct with no fields encodes as ``[]`` in C, while any other object would
    cost a Python hook call per message (a third of the encoding time)."""

    if TYPE_CHECKING:
        # For type checkers only: ``runner`` is no field (a field would be encoded), just an
        # attribute ``wrap`` sets in the instance's ``__dict__`` (``dict=True``).
        def __init__(self) -> None:
            self.runner: RecordingEffects

    @classmethod
    def wrap(cls, runner: RecordingEffects) -> EffectsContext:
        ctx = cls()
        ctx.runner = runner
        # The runner's own bound method in the instance's ``__dict__``, where it shadows the
        # forwarding ``effect`` below: one Python frame less per call (~20,000 calls in a
        # 3,000-email pipeline run; a recorded call's CPU over a live one's went from 2.19
        # to 1.86 µs, min of 7 x 30,000 calls on a loaded machine).
        vars(ctx)["effect"] = runner.effect
        return ctx

    # Plain functions handing back the runner's coroutine: a forwarding ``async def`` is one
    # more coroutine per effect call (~20,000 calls in a 3,000-email pipeline run). With
    # ``_run`` calling ``fn`` itself, a recorded call's loop CPU over a live one's went from
    # 1.66 to 1.39 µs (min of 9 x 50,000 calls).
    def effect(
        self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Coroutine[Any, Any, Any]:
        return self.runner.effect(name, fn, *args, **kwargs)

    def now(self) -> Coroutine[Any, Any, float]:
        return self.runner.now()

    def random(self) -> Coroutine[Any, Any, float]:
        return self.runner.random()

    def __repr__(self) -> str:
        return f"EffectsContext({self.runner!r})"


class RecordingEffects:
    """Calls every effect for real and records its result (or exception) in the session.

    ``now()`` and ``random()`` are effects too (``clock.now``, ``random.random``), drawn from
    a generator seeded with the session's seed. Results are stored as msgpack: return plain
    data (dict, list, str, numbers, bool, None, bytes; tuples come back as lists on replay).
    A result msgspec cannot encode is stored as its repr and cannot be served on replay.
    Each call also records its request's digest (:mod:`pantheon.sessions._digest`), taken
    before the call, so a function that mutates its arguments cannot change it.
    """

    __slots__ = ("_random", "_sink", "calls", "outside")

    def __init__(self, sink: EffectSink, seed: int | None = None) -> None:
        self._sink = sink
        #: Effects made outside any handler so far (position (0, None, n)).
        self.outside = 0
        self._random = random.Random(seed)
        #: Effects actually executed (not served from a record).
        self.calls = 0

    def _key(self) -> tuple[int, str | None, int]:
        # The bus's own context variable, read once (``current_envelope`` and
        # ``current_subscription`` would read it twice; ~20,000 calls a pipeline run).
        running = current_handler.get()
        if running is None or running.env is None:
            n = self.outside
            self.outside = n + 1
            return 0, None, n
        n = running.effects
        running.effects = n + 1
        return running.env.id, running.sub.name, n

    # A plain function handing back ``_run``'s coroutine, as ``EffectsContext`` does: an
    # ``async def`` here is one more coroutine and one more frame on every resumption of
    # the call's await chain (~21,000 calls in a 3,000-email pipeline run). The position
    # is taken when the call is made, as it was at the coroutine's first step.
    def effect(
        self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any
    ) -> Coroutine[Any, Any, Any]:
        env_id, sub, n = self._key()
        return self._run(env_id, sub, n, name, fn, args, kwargs, request_digest(fn, args, kwargs))

    async def _run(
        self,
        env_id: int,
        sub: str | None,
        n: int,
        name: str,
        fn: Callable[..., Any],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        digest: bytes | None,
    ) -> Any:
        self.calls += 1
        started = time.monotonic_ns()
        try:
            # ``call_maybe_async`` inlined: one coroutine less per recorded call.
            result = fn(*args, **kwargs)
            if _awaitable(result):
                result = await result
        except Exception as exc:
            self._sink(
                (env_id, sub, n, name, EFFECT_ERROR, None, type_name(exc), str(exc),
                 time.time(), started, time.monotonic_ns(), digest)
            )  # fmt: skip
            raise
        blob, as_repr = encode(result)
        flag = EFFECT_REPR if as_repr else EFFECT_OK
        self._sink(
            (env_id, sub, n, name, flag, blob, None, None, time.time(), started,
             time.monotonic_ns(), digest)
        )  # fmt: skip
        return result

    async def now(self) -> float:
        return float(await self.effect("clock.now", time.time))

    async def random(self) -> float:
        return float(await self.effect("random.random", self._random.random))
