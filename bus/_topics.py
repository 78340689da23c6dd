"""Glob subscriptions matched without scanning every pattern.

Patterns follow :func:`fnmatch.fnmatchcase` exactly (``*`` crosses dots, ``?``, ``[seq]``,
``[!seq]``). A literal pattern is one dict lookup. A wildcard pattern is filed under its literal
prefix (the text before its first ``*``, ``?`` or ``[``); a topic can only match patterns whose
prefix it starts with, so resolving a topic looks up one slice per *distinct prefix length*
and tests only those candidates. Ten thousand ``tenant42.events.*`` patterns cost a handful of
dict lookups, not ten thousand regex calls. Patterns with an empty prefix (``*.created``) are
tested against every topic; keep them few.
"""

from __future__ import annotations

import bisect
import fnmatch
import re
from collections.abc import Callable, Iterable
from typing import Generic, TypeVar

__all__ = ["GlobIndex", "is_literal", "literal_prefix"]

T = TypeVar("T")
_WILDCARDS = re.compile(r"[*?\[]")


def is_literal(pattern: str) -> bool:
    """True when the pattern has no glob character and so matches only itself."""
    return _WILDCARDS.search(pattern) is None


def literal_prefix(pattern: str) -> str:
    """The text before the pattern's first glob character."""
    m = _WILDCARDS.search(pattern)
    return pattern if m is None else pattern[: m.start()]


class _Wild(Generic[T]):
    __slots__ = ("items", "match")

    def __init__(self, pattern: str) -> None:
        self.match: Callable[[str], object] = re.compile(fnmatch.translate(pattern)).match
        self.items: list[T] = []


class GlobIndex(Generic[T]):
    """Maps glob patterns to items; ``resolve(topic)`` returns the items of every match.

    Items come back in the order they were added, whatever pattern they were filed under, so
    fan-out order is stable and equals subscription order.
    """

    __slots__ = ("_literal", "_order", "_prefix_lengths", "_seq", "_wild")

    def __init__(self) -> None:
        self._literal: dict[str, list[T]] = {}
        self._wild: dict[str, dict[str, _Wild[T]]] = {}
        self._prefix_lengths: list[int] = []
        self._order: dict[int, int] = {}
        self._seq = 0

    def add(self, pattern: str, item: T) -> None:
        self._seq += 1
        self._order[id(item)] = self._seq
        if is_literal(pattern):
            self._literal.setdefault(pattern, []).append(item)
            return
        prefix = literal_prefix(pattern)
        by_pattern = self._wild.setdefault(prefix, {})
        wild = by_pattern.get(pattern)
        if wild is None:
            wild = by_pattern[pattern] = _Wild(pattern)
        wild.items.append(item)
        if len(prefix) not in self._prefix_lengths:
            bisect.insort(self._prefix_lengths, len(prefix))

    def remove(self, pattern: str, item: T) -> None:
        self._order.pop(id(item), None)
        if is_literal(pattern):
            items = self._literal.get(pattern, [])
            if item in items:
                items.remove(item)
            if not items:
                self._literal.pop(pattern, None)
            return
        prefix = literal_prefix(pattern)
        by_pattern = self._wild.get(prefix, {})
        wild = by_pattern.get(pattern)
        if wild is not None and item in wild.items:
            wild.items.remove(item)
            if not wild.items:
                del by_pattern[pattern]
                if not by_pattern:
                    del self._wild[prefix]
                    self._prefix_lengths = sorted({len(p) for p in self._wild})

    def resolve(self, topic: str) -> list[T]:
        found: list[T] = list(self._literal.get(topic, ()))
        wild_index = self._wild
        n = len(topic)
        for length in self._prefix_lengths:
            if length > n:
                break
            by_pattern = wild_index.get(topic[:length])
            if by_pattern is not None:
                for wild in by_pattern.values():
                    if wild.match(topic):
                        found.extend(wild.items)
        if len(found) > 1:
            order = self._order
            found.sort(key=lambda item: order[id(item)])
        return found

    def items(self) -> Iterable[T]:
        for items in self._literal.values():
            yield from items
        for by_pattern in self._wild.values():
            for wild in by_pattern.values():
                yield from wild.items
