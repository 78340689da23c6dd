"""Approval requests in the session store: asked by a run, decided by a person anywhere.

A request is a row of the ``approvals`` table in the same SQLite file as the session, so
everything that can open the store can see and decide it: the terminal monitor, the web
dashboard, ``pantheon approve`` in another terminal, and a resumed run after the asking
process died. Why the store and not the live feed's socket: the socket exists only while the
run's process does, and a decision must outlive that process (made while it was down, it
is found by ``pantheon resume``); the store is also the one place every dashboard already
reads. The running team polls for decisions (every ``approvals.poll`` seconds, only while
something is pending): one indexed read.

Rows are numbered per *origin*: the session that first asked. A session resumed from a
crashed one (kind ``resume``) shares its original's origin, so request 3 is request 3
whichever of the two a person names, and a resumed run asking again for a request it asked
before the crash (same key) gets that row back, decided or still pending, never a second one;
a row that was only cancelled, not decided (see :meth:`ApprovalBook.ask`), comes back
reopened, pending.

A request asked by an agent on another process of a multi-process run (a ZeroMQ or NATS
node) names that process in ``node`` (None: the process that runs the scenario); the
driver writes the row on the node's behalf (``pantheon.approvals._relay``). Tables made
before ``node`` existed get the column, empty, the first time a book opens them.

Deciding is one conditional ``UPDATE ... WHERE status = 'pending'``: when a person and the
timeout (or two people) decide at once, exactly one wins and every reader sees that one.
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from agents import Decision
from pantheon.sessions._errors import SessionError
from pantheon.sessions._store import SessionInfo, SessionStore

__all__ = [
    "AlreadyDecided",
    "Approval",
    "ApprovalBook",
    "ApprovalError",
    "ApprovalNotFound",
]

_SCHEMA = """
CREATE TABLE IF NOT EXISTS approvals (
    origin TEXT NOT NULL,
    id INTEGER NOT NULL,
    key TEXT NOT NULL,
    session TEXT NOT NULL,
    agent TEXT NOT NULL,
    summary TEXT NOT NULL,
    request TEXT NOT NULL,
    asked REAL NOT NULL,
    deadline REAL NOT NULL,
    default_approve INTEGER NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'rejected')),
    note TEXT NOT NULL DEFAULT '',
    decided_by TEXT,
    decided REAL,
    node TEXT,
    PRIMARY KEY (origin, id),
    UNIQUE (origin, key)
)
"""

_COLS = (
    "origin, id, key, session, agent, summary, request, asked, deadline, default_approve, "
    "status, note, decided_by, decided, node"
)

#: Characters at most in a decision's note and in who decided.
MAX_NOTE = 2000
MAX_BY = 100
#: Approval numbers are SQLite integers: 1 up to this. A number outside is no approval,
#: checked before SQLite sees it (it raises OverflowError past 64 bits).
MAX_ID = 2**63 - 1


class ApprovalError(SessionError):
    """An approval cannot be read or decided as asked."""


class ApprovalNotFound(ApprovalError, KeyError):
    """No approval with that number in that session."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


class AlreadyDecided(ApprovalError):
    """The approval was decided before (``approval`` is it, as decided)."""

    def __init__(self, approval: Approval) -> None:
        self.approval = approval
        super().__init__(
            f"approval {approval.id} of session {approval.origin} was already "
            f"{approval.status} by {approval.decided_by} "
            f"at {time.strftime('%H:%M:%S', time.localtime(approval.decided or 0))}"
        )


@dataclass(frozen=True, slots=True)
class Approval:
    """One request, as the store holds it. ``status`` is ``pending``, ``approved`` or
    ``rejected``; ``session`` is the session that last asked it (the original, or the run
    that resumed it); ``deadline`` is when ``default_approve`` applies by itself."""

    origin: str
    id: int
    key: str
    session: str
    agent: str
    summary: str
    request: dict[str, Any]
    asked: float
    deadline: float
    default_approve: bool
    status: str
    note: str
    decided_by: str | None
    decided: float | None
    #: Why the stored row cannot be trusted (a column not of its type, a request that is
    #: not a JSON object), or None. A corrupt row is listed and reported, never decided on.
    corrupt: str | None = None
    #: The node of a multi-process run whose agent asked; None for the driver's own agents
    #: and in-process runs.
    node: str | None = None

    @property
    def asker(self) -> str:
        """Who asked, as every reader shows it: the agent, with its node in a multi-process
        run (``guardian@action``)."""
        return self.agent if self.node is None else f"{self.agent}@{self.node}"

    @property
    def pending(self) -> bool:
        return self.status == "pending"

    @property
    def default(self) -> str:
        return "approve" if self.default_approve else "reject"

    def decision(self) -> Decision:
        """The decision, for a decided approval (what the effect records)."""
        if self.corrupt is not None:
            raise ApprovalError(self.corrupt_message())
        if self.pending:
            raise ApprovalError(f"approval {self.id} of session {self.origin} is still pending")
        return Decision(
            self.id, self.status == "approved", self.note, self.decided_by or "", self.decided or 0
        )

    def corrupt_message(self) -> str:
        """The one line every reader says of a corrupt row (CLI, dashboards, the waiter)."""
        return (
            f"approval {self.id} of session {self.origin} is corrupt in the store: {self.corrupt}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "origin": self.origin,
            "id": self.id,
            "session": self.session,
            "agent": self.agent,
            "summary": self.summary,
            "request": self.request,
            "asked": self.asked,
            "deadline": self.deadline,
            "default": self.default,
            "status": self.status,
            "note": self.note,
            "decided_by": self.decided_by,
            "decided": self.decided,
            "node": self.node,
        }


_TEXT, _NUMBER = (str,), (int, float)
_TYPES: tuple[tuple[int, str, tuple[type, ...], str], ...] = (
    (2, "key", _TEXT, "text"), (3, "session", _TEXT, "text"), (4, "agent", _TEXT, "text"),
    (5, "summary", _TEXT, "text"), (7, "asked", _NUMBER, "number"),
    (8, "deadline", _NUMBER, "number"), (11, "note", _TEXT, "text"),
    (12, "decided_by", (str, type(None)), "text"),
    (13, "decided", (int, float, type(None)), "number"),
    (14, "node", (str, type(None)), "text"),
)  # fmt: skip


def _row(r: tuple[Any, ...]) -> Approval:
    """The approval a row holds. SQLite keeps whatever was written in a column (its types
    are affinities), so a damaged or hand-edited row is marked ``corrupt`` here, once,
    rather than failing whoever reads it, and every row beside it with it."""
    problem = None
    request: Any = {}
    try:
        request = json.loads(r[6])
        if not isinstance(request, dict):
            problem = f"request is a JSON {type(request).__name__}, not an object"
    except (ValueError, TypeError, RecursionError) as exc:
        problem = f"request is not JSON ({type(exc).__name__}: {exc})"
    v = list(r)
    for i, name, kinds, label in _TYPES:
        if not isinstance(r[i], kinds):
            problem = problem or f"{name} is {r[i]!r:.60}, not a {label}"
            # Every field keeps its type, so a reader that shows the row (a dashboard's
            # table) cannot fail on it; ``corrupt`` says the values are not to be trusted.
            v[i] = None if type(None) in kinds else repr(r[i]) if label == "text" else 0.0
    return Approval(
        v[0], v[1], v[2], v[3], v[4], v[5], request if problem is None else {}, v[7], v[8],
        bool(r[9]), v[10], v[11], v[12], v[13], problem, v[14],
    )  # fmt: skip


def _check_id(origin: str, approval_id: int) -> None:
    if not 1 <= approval_id <= MAX_ID:
        raise ApprovalNotFound(
            f"session {origin} has no approval {approval_id} (approvals are numbered from 1)"
        )


def origin_of(store: SessionStore, info: SessionInfo) -> str:
    """The session whose approvals ``info`` shares: itself, or for a resumed session the
    run it resumed (followed back through resumes of resumes)."""
    seen = {info.id}
    while info.kind == "resume" and info.replay_of is not None:
        info = store.session(info.replay_of)
        if info.id in seen:  # a loop cannot be written by Pantheon; refuse rather than spin
            raise ApprovalError(f"session {info.id}: its resume chain loops")
        seen.add(info.id)
    return info.id


class ApprovalBook:
    """The approvals of one store: ask, decide, read. Thread-safe as the store is (its
    calls are serialized); every method is a short transaction."""

    def __init__(self, store: SessionStore) -> None:
        self.store = store
        #: The store has no approvals table and cannot be given one (it is read-only):
        #: nobody ever asked for one there, so every read finds none.
        self._absent = False
        try:
            # Created on first use, so stores made before approvals existed keep working;
            # looked for first, so a reader does not take the write lock for nothing.
            columns = {r[1] for r in store._query("PRAGMA table_info(approvals)")}
            if store.read_only:
                self._absent = not columns
                if columns and "node" not in columns:
                    raise store._unmigrated("(its approvals table has no node column)")
            elif not columns:
                with store._tx() as conn:
                    conn.execute(_SCHEMA)
            elif "node" not in columns:  # a table made before multi-process approvals
                with store._tx() as conn:
                    have = {r[1] for r in conn.execute("PRAGMA table_info(approvals)")}
                    if "node" not in have:  # another process may have added it meanwhile
                        conn.execute("ALTER TABLE approvals ADD COLUMN node TEXT")
        except sqlite3.DatabaseError as exc:
            raise ApprovalError(f"{store.path}: cannot keep approvals: {exc}") from exc

    def origin(self, session_ref: str) -> str:
        """The origin of the session ``session_ref`` names (an id or a unique prefix)."""
        return origin_of(self.store, self.store.session(session_ref))

    def ask(
        self,
        *,
        origin: str,
        session: str,
        agent: str,
        key: str,
        request: Mapping[str, Any],
        timeout: float,
        default_approve: bool,
        node: str | None = None,
        now: float | None = None,
        reopen: Collection[str] = (),
    ) -> Approval:
        """The request with ``key`` in ``origin``: created pending (numbered next, with a
        deadline ``timeout`` seconds from now), or the existing one, taken over by
        ``session`` and ``node`` (a resumed run asking again keeps the original deadline).

        ``reopen`` names who "decides" a request without deciding it: a cancellation that
        only said nobody in that run would act on the answer (``node-lost``, the driver's
        note for the requests of a node it lost). An existing row decided by one of them is
        reopened: ``pending`` again, its note and decider cleared, with a new deadline
        ``timeout`` seconds from now (nobody could decide it while it stood cancelled), so
        the run asking again waits for a real decision instead of taking the cancellation
        for one. In the same transaction as the read: a person deciding meanwhile decides
        the reopened row, or finds it cancelled still."""
        now = time.time() if now is None else now
        text = json.dumps(dict(request), sort_keys=True, default=repr)
        summary = str(request.get("summary", ""))
        with self.store._tx() as conn:
            row = conn.execute(
                f"SELECT {_COLS} FROM approvals WHERE origin = ? AND key = ?", (origin, key)
            ).fetchone()
            if row is not None and row[10] != "pending" and row[12] in reopen:
                conn.execute(
                    "UPDATE approvals SET session = ?, node = ?, status = 'pending', note = '', "
                    "decided_by = NULL, decided = NULL, deadline = ? WHERE origin = ? AND key = ?",
                    (session, node, now + timeout, origin, key),
                )
                return _row((*row[:3], session, *row[4:8], now + timeout, row[9], "pending",
                             "", None, None, node))  # fmt: skip
            if row is not None:
                conn.execute(
                    "UPDATE approvals SET session = ?, node = ? WHERE origin = ? AND key = ?",
                    (session, node, origin, key),
                )
                return _row((*row[:3], session, *row[4:14], node))
            n = conn.execute(
                "SELECT coalesce(max(id), 0) + 1 FROM approvals WHERE origin = ?", (origin,)
            ).fetchone()[0]
            values = (
                origin, n, key, session, agent, summary, text, now, now + timeout,
                int(default_approve), "pending", "", None, None, node,
            )  # fmt: skip
            conn.execute(f"INSERT INTO approvals ({_COLS}) VALUES ({','.join('?' * 15)})", values)
        return _row(values)

    def decide(
        self, origin: str, approval_id: int, *, approved: bool, note: str = "", by: str
    ) -> Approval:
        """Decide a pending approval; :class:`AlreadyDecided` if it was decided before,
        :class:`ApprovalNotFound` if there is no such approval."""
        if len(note) > MAX_NOTE:
            raise ApprovalError(f"a note is at most {MAX_NOTE} characters (got {len(note)})")
        if not by.strip() or len(by) > MAX_BY:
            raise ApprovalError(f"who decides is 1 to {MAX_BY} characters (got {by!r})")
        _check_id(origin, approval_id)
        select = f"SELECT {_COLS} FROM approvals WHERE origin = ? AND id = ?"
        with self.store._tx() as conn:  # BEGIN IMMEDIATE: nobody decides between the two
            row = conn.execute(select, (origin, approval_id)).fetchone()
            if row is None:
                raise ApprovalNotFound(f"session {origin} has no approval {approval_id}")
            approval = _row(row)
            if approval.corrupt is not None:
                raise ApprovalError(approval.corrupt_message())
            if not approval.pending:
                raise AlreadyDecided(approval)
            conn.execute(
                "UPDATE approvals SET status = ?, note = ?, decided_by = ?, decided = ? "
                "WHERE origin = ? AND id = ?",
                ("approved" if approved else "rejected", note, by, time.time(), origin,
                 approval_id),
            )  # fmt: skip
            return _row(conn.execute(select, (origin, approval_id)).fetchone())

    def get(self, origin: str, approval_id: int) -> Approval:
        _check_id(origin, approval_id)
        if self._absent:
            raise ApprovalNotFound(f"session {origin} has no approval {approval_id}")
        rows = self.store._query(
            f"SELECT {_COLS} FROM approvals WHERE origin = ? AND id = ?", (origin, approval_id)
        )
        if not rows:
            raise ApprovalNotFound(f"session {origin} has no approval {approval_id}")
        return _row(rows[0])

    def entries(self, origin: str, *, status: str | None = None) -> list[Approval]:
        """The approvals of ``origin`` in the order they were asked."""
        if self._absent:
            return []
        sql = f"SELECT {_COLS} FROM approvals WHERE origin = ?"
        params: tuple[Any, ...] = (origin,)
        if status is not None:
            sql += " AND status = ?"
            params += (status,)
        return [_row(r) for r in self.store._query(sql + " ORDER BY id", params)]

    def among(self, origin: str, ids: Iterable[int]) -> list[Approval]:
        """The approvals numbered ``ids`` (what a waiting run looks at each poll)."""
        wanted = sorted(i for i in set(ids) if 1 <= i <= MAX_ID)
        if not wanted or self._absent:
            return []
        marks = ",".join("?" * len(wanted))
        return [
            _row(r)
            for r in self.store._query(
                f"SELECT {_COLS} FROM approvals WHERE origin = ? AND id IN ({marks})",
                (origin, *wanted),
            )
        ]
