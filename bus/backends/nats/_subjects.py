"""How bus topics, priorities and subscriptions become NATS subjects, streams and consumers.

A message on topic ``email.received`` with priority HIGH from team ``support``, published by
a bus of session ``S``, goes on ``pantheon.support.high.S.email.received``: the team's
stream captures ``pantheon.support.>``, the priority is a subject *lane* (``critical``,
``high``, ``normal``) so each lane has its own consumer and a receiver can pull CRITICAL
before the rest, and the session is a *scope* token (:func:`scope_of`; ``_`` for a bus
without one). Topics are dot-separated, as NATS subjects are, so a topic's tokens are the
subject's tokens; a topic that NATS cannot carry (an empty token, whitespace, ``*`` or ``>``
inside it) is refused at publish.

A subscription ``(name, pattern)`` is one consumer group *of its scope*: one durable consumer
per lane, shared by every process of the session hosting that name, filtering the scope's
subjects only. A stream outlives runs: an earlier run of the same team whose processes died
left its messages and its consumers' unacknowledged work there, and a run sharing those
consumers would handle another session's messages (and resume would then do them again).
Scoped, each session's consumers see only what its own processes published, the server does
the separating (no copy of another session's traffic reaches a node), and what a dead
session left stays exactly as it was, counted per session (the consumers' ``description``
names it, :func:`session_of`). The bus's topic patterns are token patterns with NATS's own
rules (``*`` one token, ``>`` one or more, last), so the consumer's filter subject is the
pattern itself under the lane and scope: ``orders.*`` filters ``pantheon.T.normal.S.orders.*``.
A token NATS would read differently (one holding whitespace or a wildcard character inside
it) makes the filter ``>`` from there on, a superset; the receiver matches every message
exactly with :mod:`bus._topics` (the bus's own index) anyway and acknowledges what does not
match without delivering it.
"""

from __future__ import annotations

import hashlib
import re

from bus._errors import EncodeError
from bus._topics import is_literal

__all__ = [
    "DLQ_STREAM",
    "DLQ_SUBJECTS",
    "LANES",
    "NO_SESSION",
    "check_token",
    "consumer_name",
    "directory_bucket",
    "dlq_subject",
    "filter_subject",
    "scope_of",
    "session_description",
    "session_of",
    "stream_name",
    "subject_of",
    "sync_subject",
]

#: Subject lane per priority value (Priority.CRITICAL == 0 is pulled first).
LANES = ("critical", "high", "normal")
#: The publisher-visible dead letter queue: one stream for every team.
DLQ_STREAM = "PANTHEON_DLQ"
DLQ_SUBJECTS = "pantheon.dlq.>"
#: The scope of a bus without a session: team-wide consumer groups, as every such bus shares.
NO_SESSION = "_"
#: How a session's consumers are described on the server (``nats consumer info`` shows it).
_DESCRIPTION = "pantheon session "
#: Longest session id used as it is in a subject and consumer names.
_SCOPE_CHARS = 64

_TOKEN = re.compile(r"[A-Za-z0-9_-]+")  # fullmatch: "$" would accept a final newline
_BAD_SUBJECT_CHARS = re.compile(r"[\s*>]")
_SAFE_NAME = re.compile(r"[^A-Za-z0-9_-]")


def check_token(value: str, what: str) -> str:
    """``value`` as one subject token (a team or node name), or ValueError naming ``what``."""
    if not _TOKEN.fullmatch(value):
        raise ValueError(
            f"NatsTransport: {what} {value!r} must be letters, digits, '_' or '-' "
            "(it is one token of a NATS subject)"
        )
    return value


def stream_name(team: str) -> str:
    return f"PANTHEON_{team}"


def directory_bucket(team: str) -> str:
    return f"pantheon_nodes_{team}"


def scope_of(session: str | None) -> str:
    """The subject token of ``session``'s scope: the id itself when it is a plain token (as
    every ``pantheon`` session id is), else its letters with a digest (still one per
    session); :data:`NO_SESSION` for none."""
    if session is None:
        return NO_SESSION
    if _TOKEN.fullmatch(session) and len(session) <= _SCOPE_CHARS and session != NO_SESSION:
        return session
    digest = hashlib.blake2b(session.encode(), digest_size=6).hexdigest()
    return f"{_SAFE_NAME.sub('_', session)[: _SCOPE_CHARS - 13]}-{digest}"


def session_description(scope: str) -> str | None:
    """What a consumer of ``scope`` is described as: the session it belongs to (None for
    the team-wide ones, which belong to no session)."""
    return None if scope == NO_SESSION else f"{_DESCRIPTION}{scope}"


def session_of(description: str | None) -> str | None:
    """The session scope a consumer's ``description`` names, or None (a team-wide consumer,
    or one this transport did not make)."""
    if not description or not description.startswith(_DESCRIPTION):
        return None
    return description[len(_DESCRIPTION) :]


def subject_of(team: str, scope: str, priority: int, topic: str) -> str:
    """The subject ``topic`` is published on; EncodeError when NATS cannot carry it."""
    if not topic or _BAD_SUBJECT_CHARS.search(topic) or "" in topic.split("."):
        raise EncodeError(
            f"topic {topic!r} cannot be a NATS subject: it needs non-empty dot-separated "
            "tokens without whitespace, '*' or '>'"
        )
    return f"pantheon.{team}.{LANES[priority]}.{scope}.{topic}"


def filter_subject(team: str, scope: str, lane: int, pattern: str) -> str:
    """The consumer filter for ``pattern`` in ``lane`` of ``scope``: the pattern's tokens,
    ``*`` and a final ``>`` as NATS reads them; from a token NATS cannot take as it is,
    ``>`` (a superset: the receiver matches exactly)."""
    head = f"pantheon.{team}.{LANES[lane]}.{scope}"
    out: list[str] = []
    tokens = pattern.split(".")
    for i, token in enumerate(tokens):
        wildcard = token == "*" or (token == ">" and i == len(tokens) - 1)
        if wildcard or (token and is_literal(token) and not _BAD_SUBJECT_CHARS.search(token)):
            out.append(token)
        else:
            return ".".join([head, *out, ">"])
    return ".".join([head, *out])


def consumer_name(scope: str, name: str, pattern: str, lane: int) -> str:
    """The durable consumer of subscription ``name`` (with ``pattern``) for ``lane`` in
    ``scope``: readable (the session first, so an operator sees whose it is) and unique,
    since subscription names may hold characters a consumer name may not and a name
    re-subscribed with another pattern is another group."""
    digest = hashlib.blake2b(f"{scope}\0{name}\0{pattern}".encode(), digest_size=6).hexdigest()
    return f"{scope}_{_SAFE_NAME.sub('_', name)[:48]}_{digest}_{LANES[lane][0]}"


def dlq_subject(team: str, origin: str) -> str:
    """Where a dead letter of a message published by node ``origin`` goes: filed by team
    and publisher, and the publisher listens there (a request waiting on it fails at once)."""
    return f"pantheon.dlq.{team}.{origin}"


def sync_subject(team: str, scope: str, node: str) -> str:
    """Where the other nodes of ``scope`` confirm they have seen ``node``'s latest
    subscriptions."""
    return f"_pantheon.{team}.{scope}.sync.{node}"
