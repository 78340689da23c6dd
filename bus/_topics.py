"""Token topics: what a subscription pattern means, and an index that resolves it fast.

A topic is a dotted name; its *tokens* are the pieces between the dots
(``observation.email.received`` has three). A pattern is a topic whose tokens may be wildcards,
as in seed 001's router, NATS, MQTT (``+``/``#``) and AMQP:

* ``*`` matches exactly one token: ``observation.*.received`` matches
  ``observation.email.received``, not ``observation.received`` nor ``observation.a.b.received``;
* ``>`` as the last token matches one or more tokens: ``observation.>`` matches
  ``observation.email`` and ``observation.email.received``, not ``observation``; ``>`` alone
  matches every topic;
* any other token matches itself, case-sensitively.

Why whole tokens: a topic's tokens name things (a domain, a kind, a tenant), and a wildcard
that stops at a dot can be indexed token by token, so a publish costs the depth of its topic,
never the number of subscriptions; and the same pattern means the same thing on every engine
the bus runs over (NATS subjects use exactly these rules).

What :func:`validate_pattern` refuses, each with a message naming the spelling to use instead
(the first release used shell globs, where ``*`` crossed dots):

* a wildcard inside a token (``email.*-urgent``, ``email*``, ``sys?em``, ``[ab].x``): a token is
  matched whole; subscribe to ``email.*`` and keep the tokens you want with ``filter=``, or use
  ``email.>`` for everything under ``email``. ``?`` and ``[...]`` are not wildcards here, and
  are refused rather than read literally so that an old glob cannot silently match nothing;
* ``*`` alone: under token rules it would match only one-token topics, while the old glob meant
  "everything"; spell everything ``>``;
* ``>`` anywhere but as the whole last token, an empty pattern, and empty tokens (``a..b``,
  ``.a``, ``a.``).

:class:`GlobIndex` files literal patterns in a dict (one lookup) and wildcard patterns in a
token trie: resolving a topic walks at most two branches per token (the token itself and
``*``), and adding or removing a pattern touches only its own path, O(depth).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import lru_cache
from typing import Generic, TypeVar

__all__ = ["GlobIndex", "is_literal", "literal_prefix", "matches", "validate_pattern"]

T = TypeVar("T")

ONE = "*"
REST = ">"


def validate_pattern(pattern: str) -> None:
    """Raise :class:`ValueError` saying why and what to write instead, unless ``pattern`` is a
    valid token pattern (see the module docstring)."""
    _tokens(pattern)


@lru_cache(maxsize=4096)
def _tokens(pattern: str) -> tuple[str, ...]:
    """The validated tokens of ``pattern`` (cached: filters call :func:`matches` per event)."""
    if not isinstance(pattern, str):
        raise TypeError(f"a topic pattern must be a str, got {type(pattern).__name__}")
    if pattern == "":
        raise ValueError("empty topic pattern: use '>' for every topic")
    if pattern == ONE:
        raise ValueError(
            "topic pattern '*' matches only one-token topics ('*' is exactly one token, it no "
            "longer crosses dots): use '>' for every topic"
        )
    tokens = tuple(pattern.split("."))
    last = len(tokens) - 1
    for i, token in enumerate(tokens):
        if token == "":
            raise ValueError(
                f"topic pattern {pattern!r} has an empty token (a leading, trailing or doubled "
                "dot): tokens are the non-empty names between dots"
            )
        if token == REST:
            if i != last:
                raise ValueError(
                    f"topic pattern {pattern!r}: '>' must be the last token (it matches all the "
                    f"remaining tokens); use '*' for exactly one token in the middle"
                )
            continue
        if token == ONE:
            continue
        if "*" in token or ">" in token:
            raise ValueError(_mid_token(pattern, tokens, i))
        if "?" in token or "[" in token:
            raise ValueError(
                f"topic pattern {pattern!r}: '?' and '[...]' are not wildcards (topics have only "
                f"'*' for one token and '>' for one or more); name the token, or use "
                f"{_spelling(tokens)!r} with a filter"
            )
    return tokens


def _spelling(tokens: tuple[str, ...]) -> str:
    """``tokens`` with every glob-like token made ``*``: the nearest valid pattern."""
    spelled = ".".join(
        ONE if t not in (ONE, REST) and any(c in t for c in "*>?[") else t for t in tokens
    )
    return REST if spelled == ONE else spelled  # '*' alone is refused too


def _mid_token(pattern: str, tokens: tuple[str, ...], i: int) -> str:
    token = tokens[i]
    why = (
        f"topic pattern {pattern!r}: a wildcard must be a whole token ('*' is exactly one "
        f"token and no longer crosses dots, '>' as the last token is one or more)"
    )
    stem = token.rstrip("*")
    if i == len(tokens) - 1 and stem and not any(c in stem for c in "*>?["):
        # ``email*`` / ``observation.email*``: the old glob matched everything below.
        below = _spelling((*tokens[:i], stem, REST))
        return f"{why}; use {below!r} for any number of tokens after {stem!r}"
    return (
        f"{why}; subscribe to {_spelling(tokens)!r} and keep the tokens you want "
        f"with filter=, or name each topic"
    )


def is_literal(pattern: str) -> bool:
    """True when the pattern has no wildcard token and so matches only itself."""
    return not any(t in (ONE, REST) for t in pattern.split("."))


def literal_prefix(pattern: str) -> str:
    """The text before the pattern's first wildcard token (``tenant.events.*`` ->
    ``tenant.events.``); the whole pattern when it has none."""
    tokens = pattern.split(".")
    for i, token in enumerate(tokens):
        if token in (ONE, REST):
            return "".join(t + "." for t in tokens[:i])
    return pattern


def matches(pattern: str, topic: str) -> bool:
    """Does ``topic`` match the token ``pattern``? Raises :class:`ValueError` for a pattern
    :func:`validate_pattern` refuses, so a bad filter is reported, never silently empty."""
    tokens = _tokens(pattern)
    parts = topic.split(".")
    n = len(tokens)
    if tokens[-1] == REST:
        n -= 1
        if len(parts) <= n:
            return False
    elif len(parts) != n:
        return False
    for i in range(n):
        token = tokens[i]
        if token != ONE and token != parts[i]:
            return False
    return True


class _Node(Generic[T]):
    """One trie position: the patterns that end here, those whose next token is ``>`` (they
    match any non-empty rest), and the branches for the next token."""

    __slots__ = ("children", "ends", "rest", "star")

    def __init__(self) -> None:
        self.children: dict[str, _Node[T]] = {}
        self.star: _Node[T] | None = None
        self.ends: list[T] = []
        self.rest: list[T] = []

    def empty(self) -> bool:
        return not (self.children or self.star or self.ends or self.rest)


class GlobIndex(Generic[T]):
    """Maps token patterns to items; ``resolve(topic)`` returns the items of every match.

    Patterns must be valid (``add`` validates); a topic is any string, split at its dots.
    Items come back in the order they were added, whatever pattern they were filed under, so
    fan-out order is stable and equals subscription order.
    """

    __slots__ = ("_literal", "_order", "_root", "_seq", "_wild")

    def __init__(self) -> None:
        self._literal: dict[str, list[T]] = {}
        self._root: _Node[T] = _Node()
        self._wild = 0  # wildcard patterns filed in the trie: 0 skips the walk
        self._order: dict[int, int] = {}
        self._seq = 0

    def add(self, pattern: str, item: T) -> None:
        tokens = _tokens(pattern)
        self._seq += 1
        self._order[id(item)] = self._seq
        if ONE not in tokens and REST not in tokens:
            self._literal.setdefault(pattern, []).append(item)
            return
        node = self._root
        for token in tokens[:-1]:
            if token == ONE:
                if node.star is None:
                    node.star = _Node()
                node = node.star
            else:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                node = child
        last = tokens[-1]
        if last == REST:
            node.rest.append(item)
        else:
            if last == ONE:
                if node.star is None:
                    node.star = _Node()
                node = node.star
            else:
                child = node.children.get(last)
                if child is None:
                    child = node.children[last] = _Node()
                node = child
            node.ends.append(item)
        self._wild += 1

    def remove(self, pattern: str, item: T) -> None:
        """Forget ``item`` under ``pattern``; unknown pairs are ignored. Prunes the branches
        the pattern alone kept alive, so churn does not grow the trie."""
        tokens = _tokens(pattern)
        self._order.pop(id(item), None)
        if ONE not in tokens and REST not in tokens:
            items = self._literal.get(pattern, [])
            if item in items:
                items.remove(item)
            if not items:
                self._literal.pop(pattern, None)
            return
        path: list[tuple[_Node[T], str]] = []
        node: _Node[T] | None = self._root
        steps = tokens[:-1] if tokens[-1] == REST else tokens
        for token in steps:
            assert node is not None
            path.append((node, token))
            node = node.star if token == ONE else node.children.get(token)
            if node is None:
                return
        assert node is not None
        bucket = node.rest if tokens[-1] == REST else node.ends
        if item not in bucket:
            return
        bucket.remove(item)
        self._wild -= 1
        while path and node.empty():
            parent, token = path.pop()
            if token == ONE:
                parent.star = None
            else:
                del parent.children[token]
            node = parent

    def resolve(self, topic: str) -> list[T]:
        found: list[T] = list(self._literal.get(topic, ()))
        if self._wild:
            _walk(self._root, topic.split("."), 0, found)
        if len(found) > 1:
            order = self._order
            found.sort(key=lambda item: order[id(item)])
        return found

    def items(self) -> Iterator[T]:
        for items in self._literal.values():
            yield from items
        stack = [self._root]
        while stack:
            node = stack.pop()
            yield from node.ends
            yield from node.rest
            stack.extend(node.children.values())
            if node.star is not None:
                stack.append(node.star)


def _walk(node: _Node[T], tokens: list[str], i: int, found: list[T]) -> None:
    n = len(tokens)
    while True:
        if i == n:
            found.extend(node.ends)
            return
        if node.rest:
            found.extend(node.rest)
        star = node.star
        child = node.children.get(tokens[i]) if node.children else None
        i += 1
        if star is None:
            if child is None:
                return
            node = child
        elif child is None:
            node = star
        else:
            _walk(star, tokens, i, found)
            node = child
