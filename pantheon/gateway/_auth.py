"""Bearer tokens and their topic ACLs.

A tokens document (a file, or an environment variable holding the same text) is YAML or
JSON::

    tokens:
      - name: ops                 # what logs and metrics show; never the token itself
        token: "9f2c...e1"        # at least 16 characters
        publish: ["observation.>"]
        subscribe: ["action.*", "guardian.decision"]

Patterns are the bus's own token patterns (:func:`bus.matches`: ``*`` is one token, ``>`` as
the last token one or more). A publish needs a pattern matching its topic; a subscription
needs a pattern that *covers* the requested one, token by token: a literal covers only
itself, ``*`` covers a literal or ``*``, and ``>`` covers whatever rest (one token or more,
wildcards included). So ``guardian.>`` allows ``guardian.*`` and ``guardian.>``, and
``guardian.*`` does not allow ``guardian.>`` (which reaches deeper topics).

Lookups compare the SHA-256 of the presented token with every known token's digest using
:func:`hmac.compare_digest`, all of them every time, so neither the position of a match nor
a common prefix shows in the timing; the token itself is held only as its digest.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bus import matches, validate_pattern
from pantheon.gateway._errors import TokenError

__all__ = ["ANONYMOUS", "MIN_TOKEN_LENGTH", "Grant", "Tokens", "covers", "load_tokens"]

#: Shorter tokens are refused at load: they can be guessed.
MIN_TOKEN_LENGTH = 16
#: Topics whose ACL answer a grant remembers; past this the memory is cleared.
_ACL_CACHE = 4096


@dataclass(eq=False, slots=True)
class Grant:
    """What one token may do: publish to topics matching ``publish``, subscribe with
    patterns lying within ``subscribe``."""

    name: str
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    _topics: dict[str, bool] = field(default_factory=dict, repr=False)

    def may_publish(self, topic: str) -> bool:
        known = self._topics.get(topic)
        if known is not None:
            return known
        allowed = any(matches(p, topic) for p in self.publish)
        if len(self._topics) >= _ACL_CACHE:
            self._topics.clear()
        self._topics[topic] = allowed
        return allowed

    def may_subscribe(self, pattern: str) -> bool:
        """Whether ``pattern`` (a valid token pattern) lies within one of the grant's."""
        return any(covers(p, pattern) for p in self.subscribe)


def covers(grant: str, pattern: str) -> bool:
    """Whether every topic ``pattern`` matches is matched by ``grant`` (both valid token
    patterns)."""
    have = grant.split(".")
    want = pattern.split(".")
    for i, token in enumerate(have):
        if token == ">":
            return len(want) > i  # one token or more left, whatever they are
        if i >= len(want):
            return False
        asked = want[i]
        if asked == ">":
            return False  # only '>' covers a '>'
        if token != "*" and token != asked:
            return False  # a literal covers only itself
    return len(want) == len(have)


#: The grant of every request when no tokens are configured (a loopback-only gateway).
ANONYMOUS = Grant("anonymous", (">",), (">",))


class Tokens:
    """The configured tokens; :meth:`check` finds the grant of a presented token."""

    __slots__ = ("_entries", "lengths")

    def __init__(self, entries: Iterable[tuple[str, Grant]] = ()) -> None:
        entries = list(entries)
        self._entries = [(token_digest(token), grant) for token, grant in entries]
        #: The tokens' lengths in characters, longest first: where a log line is searched
        #: for a token by value, the windows it hashes (the tokens themselves are not kept).
        self.lengths: tuple[int, ...] = tuple(
            sorted({len(token) for token, _ in entries}, reverse=True)
        )

    def __bool__(self) -> bool:
        return bool(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def digests(self) -> frozenset[bytes]:
        """The tokens' digests, for finding a token by value in a log line."""
        return frozenset(digest for digest, _ in self._entries)

    def check(self, token: str) -> Grant | None:
        """The grant of ``token``, or ``None``; constant time in the token's content."""
        presented = token_digest(token)
        found: Grant | None = None
        for digest, grant in self._entries:  # no early exit: every entry costs the same
            if hmac.compare_digest(presented, digest) and found is None:
                found = grant
        return found


def token_digest(token: str) -> bytes:
    """The SHA-256 digest tokens are kept and compared as."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).digest()


def load_tokens(path: Path | None = None, env: str | None = None) -> Tokens:
    """The tokens of the file at ``path`` and of the variable named ``env`` (both, if
    both are given). Raises :class:`TokenError` naming the source and the field."""
    entries: list[tuple[str, Grant]] = []
    if path is not None:
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise TokenError(f"{path}: cannot read the tokens file: {exc.strerror}") from None
        entries += _parse(text, str(path))
    if env is not None:
        text_env = os.environ.get(env)
        if text_env is None:
            raise TokenError(f"${env}: the tokens variable is not set")
        entries += _parse(text_env, f"${env}")
    seen: set[bytes] = set()
    names: set[str] = set()
    for i, (token, grant) in enumerate(entries):
        d = token_digest(token)
        if d in seen:
            raise TokenError(f"token {grant.name!r} (entry {i}) repeats another entry's token")
        if grant.name in names:
            raise TokenError(f"two tokens are named {grant.name!r}: names must be unique")
        seen.add(d)
        names.add(grant.name)
    return Tokens(entries)


def _parse(text: str, where: str) -> list[tuple[str, Grant]]:
    try:
        data: Any = json.loads(text)
    except ValueError:
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = f":{mark.line + 1}" if mark is not None else ""
            raise TokenError(f"{where}{line}: neither JSON nor YAML") from None
    if not isinstance(data, Mapping) or not isinstance(data.get("tokens"), list):
        raise TokenError(f"{where}: expected a mapping with a 'tokens' list")
    out = []
    for i, entry in enumerate(data["tokens"]):
        at = f"{where}: tokens[{i}]"
        if not isinstance(entry, Mapping):
            raise TokenError(f"{at}: expected a mapping with name, token, publish, subscribe")
        unknown = set(entry) - {"name", "token", "publish", "subscribe"}
        if unknown:
            raise TokenError(f"{at}: unknown field {sorted(unknown)[0]!r}")
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            raise TokenError(f"{at}.name: a non-empty string is required")
        token = entry.get("token")
        if not isinstance(token, str) or len(token) < MIN_TOKEN_LENGTH:
            # The value is never echoed, not even a wrong one: it may be a real secret.
            raise TokenError(
                f"{at}.token: a string of at least {MIN_TOKEN_LENGTH} characters is required"
            )
        if any(c.isspace() for c in token):
            raise TokenError(f"{at}.token: must not contain whitespace")
        grant = Grant(
            name,
            _patterns(entry.get("publish", []), f"{at}.publish"),
            _patterns(entry.get("subscribe", []), f"{at}.subscribe"),
        )
        out.append((token, grant))
    return out


def _patterns(value: Any, at: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(p, str) and p for p in value):
        raise TokenError(f"{at}: expected a list of topic patterns")
    for j, p in enumerate(value):
        try:
            validate_pattern(p)
        except ValueError as exc:
            raise TokenError(f"{at}[{j}]: {exc}") from None
    return tuple(value)
