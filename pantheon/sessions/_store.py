"""The session store: one SQLite file (WAL) holding every recorded run.

Durability, exactly:

* The file is in WAL mode with ``synchronous=NORMAL``. A commit is in the WAL (the OS page
  cache) when it returns, so it **survives a crash of the process** at any point, SIGKILL
  included. It is fsynced at checkpoints, not at every commit, so **a power loss or kernel
  crash can lose the last commits** (never corrupt the file). ``synchronous=FULL`` would close
  that window at the price of one fsync per group commit; a run record is telemetry, not a
  ledger, so we take NORMAL. Pass ``synchronous="FULL"`` to :class:`SessionStore` (the
  recorder's writer uses the store's setting) when that trade is wrong for you.
* The recorder writes in **group commits** from a background thread, every
  ``commit_interval`` (50 ms by default) or every ``commit_rows`` rows, whichever comes
  first. A SIGKILL therefore loses at most what was published in the last interval plus the
  commit in flight: everything published more than ``commit_interval`` + one commit before
  the kill is in the store (``tests/pantheon/test_sessions_process.py`` measures it).
* Readers in other processes see every committed row while a run writes (WAL readers never
  block the writer nor wait for it).
* Opening a store marks sessions left ``running`` by a process that no longer exists on
  this host as ``aborted`` (their ``ended`` is the time of their last recorded message).
* A store that cannot be written (a read-only file, directory or file system: an archive,
  a CI artifact mounted read-only) can still be read: ``SessionStore(path, access="read")``
  opens it read-only when it cannot be written (see :func:`connect`). Nothing is reaped or
  migrated then, and whatever would write raises :class:`StoreReadOnly`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import socket
import sqlite3
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal, overload

from bus import BreakerChange, DeadLetterRecord, DecodeError
from pantheon.scenario import DRIVER_NODE
from pantheon.sessions._codec import decode
from pantheon.sessions._errors import (
    SchemaVersionError,
    SessionNotFound,
    StoreError,
    StoreReadOnly,
)
from pantheon.sessions._journal import (
    ErrorPairing,
    Materializer,
    decode_deliveries,
    decode_effects,
    decode_envelopes,
)

__all__ = [
    "DEFAULT_STORE_PATH",
    "DRIVER_NODE",
    "SCHEMA_VERSION",
    "STORE_ENV",
    "BreakerTransition",
    "MetricSnapshot",
    "NodeJournal",
    "SessionInfo",
    "SessionStore",
    "StoredDeadLetter",
    "StoredDelivery",
    "StoredEffect",
    "StoredEnvelope",
    "connect",
    "from_db",
    "new_session_id",
    "resolve_store_path",
    "to_db",
]

#: Bumped on any incompatible change to the tables below. 2: the journal holds effects too
#: (``kind = 'effects'``). 3: records carry the ``node`` (process) that made them, and
#: ``session_nodes`` says how far each node's journal reached (multi-process runs). An older
#: store is migrated in place when opened (``_migrate``). 4: every effect row carries its
#: request's ``digest`` (``pantheon.sessions._digest``; NULL in rows recorded before, and
#: for calls with no stable encoding).
SCHEMA_VERSION = 4
#: Where the store lives when neither an explicit path nor ``$PANTHEON_STORE`` says otherwise
#: (relative to the working directory).
DEFAULT_STORE_PATH = Path(".pantheon") / "sessions.db"
STORE_ENV = "PANTHEON_STORE"
#: How long a connection waits for another writer's lock before failing.
BUSY_TIMEOUT = 30.0

Status = Literal["running", "completed", "failed", "aborted"]
STATUSES = ("running", "completed", "failed", "aborted")

# Effect row flags.
EFFECT_OK = 0
EFFECT_ERROR = 1
EFFECT_REPR = 2  # the result could not be encoded; its repr is stored and cannot be served
EFFECT_DIVERGED = 3  # replay only: the call did not match the original and was not run

#: How far each node's journal reached in a multi-process session (``NodeJournal``).
_SESSION_NODES = """CREATE TABLE IF NOT EXISTS session_nodes (
    session TEXT NOT NULL,
    node TEXT NOT NULL,
    batches INTEGER NOT NULL,
    records INTEGER NOT NULL,
    ended INTEGER NOT NULL DEFAULT 0,
    last REAL NOT NULL,
    PRIMARY KEY (session, node)
) WITHOUT ROWID"""

_SCHEMA = (
    """
CREATE TABLE IF NOT EXISTS meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS sessions (
    id TEXT PRIMARY KEY,
    kind TEXT NOT NULL DEFAULT 'run',
    scenario TEXT,
    scenario_text TEXT,
    seed INTEGER,
    started REAL NOT NULL,
    ended REAL,
    status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'aborted')),
    summary TEXT,
    replay_of TEXT,
    pid INTEGER,
    host TEXT,
    scenario_dir TEXT,
    forked_from TEXT
);
CREATE TABLE IF NOT EXISTS envelopes (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    id INTEGER NOT NULL,
    topic TEXT NOT NULL,
    priority INTEGER NOT NULL,
    causation_id INTEGER,
    correlation_id INTEGER,
    source TEXT,
    hops INTEGER NOT NULL,
    created_ns INTEGER NOT NULL,
    wall REAL NOT NULL,
    payload BLOB,
    payload_repr INTEGER NOT NULL DEFAULT 0,
    node TEXT,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS deliveries (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    subscriber TEXT NOT NULL,
    envelope_id INTEGER NOT NULL,
    enqueued_ns INTEGER NOT NULL,
    started_ns INTEGER NOT NULL,
    ended_ns INTEGER NOT NULL,
    outcome TEXT NOT NULL,
    error_type TEXT,
    error TEXT,
    node TEXT,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS breaker_transitions (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    time REAL NOT NULL,
    name TEXT NOT NULL,
    old TEXT NOT NULL,
    new TEXT NOT NULL,
    reason TEXT,
    node TEXT,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS dead_letters (
    session TEXT NOT NULL,
    entry_id INTEGER NOT NULL,
    envelope_id INTEGER NOT NULL,
    topic TEXT NOT NULL,
    subscriber TEXT NOT NULL,
    reason TEXT NOT NULL,
    error_type TEXT,
    error TEXT,
    traceback TEXT,
    attempts INTEGER NOT NULL,
    time REAL NOT NULL,
    redriven INTEGER NOT NULL DEFAULT 0,
    redriven_by TEXT,
    node TEXT,
    PRIMARY KEY (session, entry_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS effects (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    envelope_id INTEGER NOT NULL,
    subscriber TEXT,
    ordinal INTEGER NOT NULL,
    name TEXT NOT NULL,
    flag INTEGER NOT NULL,
    result BLOB,
    error_type TEXT,
    error TEXT,
    time REAL NOT NULL,
    started_ns INTEGER NOT NULL,
    ended_ns INTEGER NOT NULL,
    node TEXT,
    digest BLOB,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS dead_letters_envelope ON dead_letters (session, envelope_id);
CREATE TABLE IF NOT EXISTS journal (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('envelopes', 'deliveries', 'effects')),
    first INTEGER NOT NULL,
    count INTEGER NOT NULL,
    created REAL NOT NULL,
    blob BLOB NOT NULL,
    node TEXT,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS metrics (
    session TEXT NOT NULL,
    seq INTEGER NOT NULL,
    time REAL NOT NULL,
    stats TEXT NOT NULL,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;
"""
    + _SESSION_NODES
    + ";\n"
)


#: Session references counted from the newest: ``latest`` and ``-1``, ``-2``, ...
_NEWEST = re.compile(r"latest|-([1-9][0-9]*)")

_TABLES = tuple(line.split()[5] for line in _SCHEMA.splitlines() if line.startswith("CREATE TABLE"))

#: Version -> the statements that take a store of that version to the next. 1 -> 2: SQLite
#: cannot alter a CHECK constraint, so the journal is rebuilt with ``'effects'`` allowed (it
#: holds at most the chunks of runs still recording or killed, so the copy is small).
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE journal_v2 (
            session TEXT NOT NULL,
            seq INTEGER NOT NULL,
            kind TEXT NOT NULL CHECK (kind IN ('envelopes', 'deliveries', 'effects')),
            first INTEGER NOT NULL,
            count INTEGER NOT NULL,
            created REAL NOT NULL,
            blob BLOB NOT NULL,
            PRIMARY KEY (session, seq)
        ) WITHOUT ROWID""",
        "INSERT INTO journal_v2 SELECT session, seq, kind, first, count, created, blob "
        "FROM journal",
        "DROP TABLE journal",
        "ALTER TABLE journal_v2 RENAME TO journal",
    ),
    2: (
        *(
            f"ALTER TABLE {t} ADD COLUMN node TEXT"
            for t in (
                "envelopes",
                "deliveries",
                "effects",
                "breaker_transitions",
                "dead_letters",
                "journal",
            )
        ),
        _SESSION_NODES,
    ),
    # 3 -> 4: the request digest, a column of its own at the end (the journal's effect
    # chunks gain it as a last field; ``decode_effects`` reads the older ones too).
    3: ("ALTER TABLE effects ADD COLUMN digest BLOB",),
}


def _causal(rows: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Envelope rows (seq order) with every message after the one that caused it, otherwise
    in seq order. One process publishes a cause before its effects, so a single-process
    session is in this order already; a multi-process session's seqs follow the order its
    nodes' shipments reached the driver, which readers that walk trees (diff, outcomes)
    must not see."""
    ids = {r[1] for r in rows}
    seen: set[int] = set()
    waiting: dict[int, list[tuple[Any, ...]]] = defaultdict(list)
    out: list[tuple[Any, ...]] = []
    for row in rows:
        cause = row[4]
        if cause is not None and cause in ids and cause not in seen:
            waiting[cause].append(row)
            continue
        ready = [row]
        while ready:
            r = ready.pop()
            out.append(r)
            seen.add(r[1])
            ready.extend(reversed(waiting.pop(r[1], ())))
    # A cycle cannot come from a bus; a damaged record keeps its rows, in seq order.
    out.extend(r for rs in waiting.values() for r in rs)
    return out


def to_db(i: int) -> int:
    """An envelope id as SQLite stores it. Ids are unsigned 64-bit (a random per-process base
    in the high bits) and SQLite integers are signed, so the top half wraps to negative."""
    return i - 2**64 if i > 2**63 - 1 else i


@overload
def from_db(i: int) -> int: ...
@overload
def from_db(i: None) -> None: ...
def from_db(i: int | None) -> int | None:
    return i + 2**64 if i is not None and i < 0 else i


def resolve_store_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The store file: ``path`` if given, else ``$PANTHEON_STORE``, else
    ``.pantheon/sessions.db`` under the current directory."""
    if path is not None:
        return Path(path)
    env = os.environ.get(STORE_ENV)
    if env:
        return Path(env)
    return Path.cwd() / DEFAULT_STORE_PATH


def new_session_id() -> str:
    """Short, unique, sortable by start time: ``YYYYMMDD-HHMMSS-xxxx`` (4 random hex)."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + os.urandom(2).hex()


def connect(
    path: Path, synchronous: str = "NORMAL", *, readonly: bool = False
) -> sqlite3.Connection:
    """A connection in autocommit mode (transactions are explicit), WAL, our pragmas; with
    ``readonly`` one that only reads (:func:`_connect_readonly`) and sets nothing."""
    if readonly:
        return _connect_readonly(path)
    try:
        conn = sqlite3.connect(
            path, timeout=BUSY_TIMEOUT, isolation_level=None, check_same_thread=False
        )
    except sqlite3.Error as exc:
        raise StoreError(f"cannot open the session store {path}: {exc}") from None
    try:
        # Large pages make journal blobs cheap to write (fewer overflow pages: ~3x less CPU
        # per byte than 4 KiB pages). Only takes effect on a new, empty file.
        conn.execute("PRAGMA page_size=65536")
        mode = _to_wal(conn)
        if str(mode).lower() != "wal":
            raise StoreError(f"{path}: could not switch the store to WAL mode (got {mode!r})")
        conn.execute(f"PRAGMA synchronous={synchronous}")
    except sqlite3.DatabaseError as exc:
        conn.close()
        raise StoreError(f"{path} is not a usable session store: {exc}") from exc
    return conn


def _connect_readonly(path: Path) -> sqlite3.Connection:
    """A read-only connection to a store this process cannot write.

    ``mode=ro`` first: it reads the WAL too, but SQLite must then open the ``-shm`` index
    beside the file (creating it if missing). On a read-only directory or file system with
    no ``-shm`` there (the last writer closed cleanly and removed both), it cannot, and says
    "unable to open database file". Then, and only if there is no ``-wal`` with frames in it
    either, the file is opened ``immutable``: nothing can be in a WAL that does not exist,
    and a writer could not begin one through a directory nobody can write. A ``-wal`` left
    without its ``-shm`` (a writer killed, then the folder made read-only) holds commits an
    immutable open would silently miss: that is refused, saying why."""
    uri = path.resolve().as_uri()

    def attempt(query: str) -> sqlite3.Connection:
        conn = sqlite3.connect(
            f"{uri}?{query}",
            uri=True,
            timeout=BUSY_TIMEOUT,
            isolation_level=None,
            check_same_thread=False,
        )
        try:
            conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # opens it all
        except BaseException:
            conn.close()
            raise
        return conn

    try:
        try:
            return attempt("mode=ro")
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_CANTOPEN:
                raise
        wal = Path(f"{path}-wal")
        if wal.exists() and wal.stat().st_size > 0:
            raise StoreReadOnly(
                f"cannot read the session store {path}: its last commits are in {wal.name}, "
                f"and SQLite reads that log only through a {path.name}-shm file, which is "
                "missing and cannot be made in a read-only directory; open the store once "
                "where it can be written (any pantheon command folds the log into the file), "
                "or read a writable copy of the folder"
            )
        return attempt("mode=ro&immutable=1")
    except sqlite3.DatabaseError as exc:
        raise StoreError(f"{path} is not a usable session store: {exc}") from exc


def _unwritable(path: Path) -> str | None:
    """Why this process cannot write the store at ``path`` (an existing file), or None if
    it can. Asked with access(), as :func:`_readable` (never by opening the file). SQLite
    writes through the ``-wal`` and ``-shm`` files beside the store, made on opening and
    removed by the last connection to close, so the directory must be writable too, unless
    both are there already and writable (a store another process has open)."""
    try:
        if os.statvfs(path).f_flag & os.ST_RDONLY:
            return "it is on a read-only file system"
    except OSError:
        pass
    if not os.access(path, os.W_OK):
        return "the file is not writable"
    folder = path.parent
    if not os.access(folder, os.W_OK | os.X_OK) and not all(
        os.access(f"{path}{suffix}", os.W_OK) for suffix in ("-wal", "-shm")
    ):
        return f"its directory {folder} is not writable"
    return None


def _to_wal(conn: sqlite3.Connection) -> str:
    """Put the store in WAL mode (a new file) or see that it is. SQLite answers a journal
    mode change with "database is locked" at once, without waiting out the busy timeout,
    while another process is still creating the file (a ``pantheon approvals`` or a
    dashboard opening the store of a run that is just starting): that is retried here for
    up to BUSY_TIMEOUT."""
    deadline = time.monotonic() + BUSY_TIMEOUT
    while True:
        try:
            mode = str(conn.execute("PRAGMA journal_mode").fetchone()[0])
            if mode.lower() == "wal":
                return mode
            return str(conn.execute("PRAGMA journal_mode=WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() >= deadline:
                raise
            time.sleep(0.01)


def _readable(path: Path) -> bool:
    return os.access(path, os.R_OK)


def _pid_alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A killed child not yet reaped by its parent is a zombie: gone for our purposes.
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            state = f.read().rpartition(")")[2].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return True


# -- read models -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One session's row. ``started``/``ended`` are wall-clock seconds; ``kind`` is ``run``,
    ``replay`` or ``redrive``; ``replay_of`` names the session a replay or redrive re-ran."""

    id: str
    kind: str
    scenario: str | None
    scenario_text: str | None
    seed: int | None
    started: float
    ended: float | None
    status: str
    summary: dict[str, Any]
    replay_of: str | None
    pid: int | None
    host: str | None
    scenario_dir: str | None = None
    """The folder the scenario was loaded from: where its own agent modules are imported
    from when the session is replayed or redriven."""
    corrupt: str | None = None
    """What is wrong with the row, when part of it cannot be read (its summary is not
    JSON): listings show the session marked; :meth:`SessionStore.session` refuses it."""
    forked_from: str | None = None
    """The session a what-if replay (``kind='whatif'``) re-ran through a changed team:
    unlike ``replay_of`` it is not expected to match, it is compared decision by decision."""

    @property
    def duration(self) -> float | None:
        return None if self.ended is None else self.ended - self.started

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "kind": self.kind,
            "scenario": self.scenario,
            "seed": self.seed,
            "started": self.started,
            "ended": self.ended,
            "duration": self.duration,
            "status": self.status,
            "summary": self.summary,
            "replay_of": self.replay_of,
            "pid": self.pid,
            "host": self.host,
            "scenario_dir": self.scenario_dir,
            "corrupt": self.corrupt,
            "forked_from": self.forked_from,
        }


@dataclass(frozen=True, slots=True)
class StoredEnvelope:
    """An envelope as recorded. ``seq`` is its publish order in the session; ``payload`` is
    decoded (the repr string when ``payload_repr`` is set); ``wall`` is wall-clock seconds."""

    seq: int
    id: int
    topic: str
    priority: int
    causation_id: int | None
    correlation_id: int | None
    source: str | None
    hops: int
    created_ns: int
    wall: float
    payload: Any
    payload_repr: bool
    node: str | None = None
    """The process that published it: a node of a multi-process run; ``None`` for the
    process that recorded the session."""

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "id": self.id,
            "topic": self.topic,
            "priority": self.priority,
            "causation_id": self.causation_id,
            "correlation_id": self.correlation_id,
            "source": self.source,
            "hops": self.hops,
            "created_ns": self.created_ns,
            "wall": self.wall,
            "payload": self.payload,
            "payload_repr": self.payload_repr,
            "node": self.node,
        }


@dataclass(frozen=True, slots=True)
class StoredDelivery:
    """One handling of one envelope by one subscriber; times are monotonic ns."""

    seq: int
    subscriber: str
    envelope_id: int
    enqueued_ns: int
    started_ns: int
    ended_ns: int
    outcome: str
    error_type: str | None
    error: str | None
    node: str | None = None
    """The process that handled it: a node of a multi-process run; ``None`` for the process
    that recorded the session (a single-process run, or a multi-process run's driver)."""

    @property
    def queue_wait_ns(self) -> int:
        return self.started_ns - self.enqueued_ns

    @property
    def handling_ns(self) -> int:
        return self.ended_ns - self.started_ns


@dataclass(frozen=True, slots=True)
class StoredDeadLetter(DeadLetterRecord):
    """A recorded dead letter: the bus's record, when (wall seconds), and whether a redrive
    took it back (``redriven_by``: the session that redrove it)."""

    time: float
    redriven: bool
    redriven_by: str | None
    node: str | None = None
    """The process whose queue dead-lettered it (``None``: the recording process)."""

    def to_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True, slots=True)
class StoredEffect:
    """One effect call. ``flag``: 0 result stored, 1 raised (``error_type``/``error``),
    2 result not encodable (``result`` is its repr), 3 a replay call that diverged.
    ``started_ns``/``ended_ns`` (monotonic) bound the call: messages its handler published
    in between were published *by the effect* (a ``bus.request`` made inside one, say)."""

    seq: int
    envelope_id: int
    subscriber: str | None
    ordinal: int
    name: str
    flag: int
    result: bytes | None
    error_type: str | None
    error: str | None
    time: float
    started_ns: int = 0
    ended_ns: int = 0
    node: str | None = None
    """The process whose agent made the call (``None``: the recording process)."""
    digest: bytes | None = None
    """The request's digest (``pantheon.sessions._digest``): None when the call's function
    or arguments have no stable encoding, or the session was recorded before digests."""

    @property
    def value(self) -> Any:
        return decode(self.result)

    @property
    def returned(self) -> bool:
        """The call returned and its result is stored (``value`` is what it returned)."""
        return self.flag == EFFECT_OK

    def to_dict(self) -> dict[str, Any]:
        return {
            "seq": self.seq,
            "envelope_id": self.envelope_id,
            "subscriber": self.subscriber,
            "ordinal": self.ordinal,
            "name": self.name,
            "flag": self.flag,
            "result": self.value if self.flag in (EFFECT_OK, EFFECT_REPR) else None,
            "error_type": self.error_type,
            "error": self.error,
            "time": self.time,
        }


class BreakerTransition(BreakerChange, frozen=True):
    """A recorded breaker change: the bus's record of it, its row number (``seq``) and the
    process whose breaker it was (``node``; ``None``: the recording process)."""

    seq: int
    node: str | None = None

    @property
    def name(self) -> str:
        """The breaker's name (the column's)."""
        return self.breaker


@dataclass(frozen=True, slots=True)
class NodeJournal:
    """How far one node's journal reached in a multi-process session: ``shipments`` and
    ``records`` applied, whether its end mark came (``ended``: the node left cleanly, so
    nothing it did is missing) and when the last shipment was stored (wall seconds)."""

    node: str
    shipments: int
    records: int
    ended: bool
    last: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "shipments": self.shipments,
            "records": self.records,
            "ended": self.ended,
            "last": self.last,
        }


@dataclass(frozen=True, slots=True)
class MetricSnapshot:
    seq: int
    time: float
    stats: dict[str, Any] = field(default_factory=dict)


# -- the store -------------------------------------------------------------------------------


class SessionStore:
    """The session store file: open it, read sessions, and (through a
    :class:`~pantheon.sessions.Recorder`) write them.

    ``path`` defaults per :func:`resolve_store_path`; the directory is created. Opening checks
    the schema version (:class:`SchemaVersionError` on a mismatch) and marks sessions whose
    recording process died as ``aborted``. One store object may be used from several threads
    (calls are serialized); each recorder writes through its own connection. Use as a context
    manager or call :meth:`close`.

    ``access`` says what the caller means to do. ``"write"`` (record, decide, redrive): a
    store this process cannot write raises :class:`StoreReadOnly` at once, saying why.
    ``"read"`` (list, show, export, diff, the dashboards): a store that cannot be written is
    opened read-only (``read_only`` is then True): no session is reaped (one whose process
    died still reads ``running``), an older schema is not migrated (that raises
    :class:`StoreReadOnly`: it cannot be read as it is) and anything that would write
    raises :class:`StoreReadOnly`. A store that can be written is opened as with
    ``"write"``, so a reader still reaps and migrates it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] | None = None,
        *,
        create: bool = True,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
        access: Literal["write", "read"] = "write",
    ) -> None:
        self.path = resolve_store_path(path)
        self.synchronous = synchronous
        #: Why the store cannot be written (it was then opened read-only), or None.
        self.read_only_because: str | None = None
        if self.path.is_dir():
            raise StoreError(f"{self.path} is a directory, not a session store file")
        if not self.path.exists():
            if not create:
                raise StoreError(f"no session store at {self.path}")
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
            except FileExistsError:
                raise StoreError(
                    f"cannot create the session store {self.path}: "
                    "a file stands where its directory should be"
                ) from None
            except OSError as exc:
                raise StoreError(
                    f"cannot create the session store {self.path}: {exc.strerror or exc}"
                ) from None
            folder = self.path.parent
            if not os.access(folder, os.W_OK | os.X_OK):
                raise StoreReadOnly(
                    f"cannot create the session store {self.path}: its directory {folder} "
                    "is read-only"
                )
        else:
            # SQLite says only "unable to open database file"; the OS says why. Asked with
            # access(), never by opening the file: closing any descriptor of it drops every
            # POSIX lock this process holds on it, SQLite's too, and another process could
            # then delete the WAL a recorder in this process still writes to (its rows would
            # be hidden from every reader until it closed).
            if not _readable(self.path):
                raise StoreError(
                    f"cannot read the session store {self.path}: {os.strerror(errno.EACCES)}"
                )
            why = _unwritable(self.path)
            if why is not None and access == "write":
                raise StoreReadOnly(
                    f"the session store {self.path} is read-only ({why}), and this needs to "
                    "write to it (reading it works: sessions list and show, export, diff, dlq "
                    f"list, approvals); to write, use a writable copy (--store or ${STORE_ENV})"
                )
            self.read_only_because = why
        self._lock = threading.RLock()
        self._conn = connect(self.path, synchronous, readonly=self.read_only)
        try:
            self._init_schema()
            if not self.read_only:
                self.reap()
        except BaseException:
            self._conn.close()
            raise

    def __enter__(self) -> SessionStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __repr__(self) -> str:
        return f"SessionStore({str(self.path)!r})"

    @property
    def read_only(self) -> bool:
        """Opened read-only: the store cannot be written (``read_only_because`` says why)."""
        return self.read_only_because is not None

    def _refuse_write(self, what: str) -> StoreReadOnly:
        return StoreReadOnly(
            f"the session store {self.path} is read-only ({self.read_only_because}): cannot {what}"
        )

    def _unmigrated(self, what: str) -> StoreReadOnly:
        return StoreReadOnly(
            f"the session store {self.path} needs migrating {what} before this Pantheon "
            f"can read it, and it is read-only ({self.read_only_because}), so it cannot be "
            "migrated here: open it once where it can be written (any pantheon command "
            "migrates it), or read a writable copy"
        )

    @contextlib.contextmanager
    def _tx(self) -> Iterator[sqlite3.Connection]:
        if self.read_only:
            raise self._refuse_write("write to it")
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                yield self._conn
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
            self._conn.execute("COMMIT")

    def _query(
        self, sql: str, params: tuple[Any, ...] = (), *, session: str | None = None
    ) -> list[tuple[Any, ...]]:
        with self._lock:
            try:
                return self._conn.execute(sql, params).fetchall()
            except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
                raise self._damaged(session, str(exc)) from exc

    def _damaged(self, session: str | None, what: str) -> StoreError:
        """The one-line error for a store (or one session's record) that cannot be read."""
        if what.startswith("'utf-8' codec"):  # a TEXT column holding bytes that are not UTF-8
            what = f"a text column is not valid UTF-8 ({what})"
        where = "" if session is None else f" session {session!r}:"
        return StoreError(f"{self.path}:{where} {what}")

    def _init_schema(self) -> None:
        try:
            found = self._read_version()
            if found is None and self.read_only:
                raise StoreError(
                    f"{self.path} is not a Pantheon session store (it has no meta.schema_version)"
                )
            if found is None:
                with self._tx() as conn:
                    # Another process may have created it between our read and our lock.
                    if self._read_version() is None:
                        tables = conn.execute(
                            "SELECT count(*) FROM sqlite_master WHERE type = 'table'"
                        ).fetchone()[0]
                        if tables:
                            raise StoreError(
                                f"{self.path} is an SQLite file but not a Pantheon session "
                                "store (it has tables and no meta.schema_version)"
                            )
                        for stmt in _SCHEMA.split(";"):
                            if stmt.strip():
                                conn.execute(stmt)
                        conn.execute(
                            "INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),)
                        )
                found = self._read_version()
            if found in _MIGRATIONS and self.read_only:
                raise self._unmigrated(f"from schema version {found} to {SCHEMA_VERSION}")
            if found in _MIGRATIONS:
                found = self._migrate()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not a usable session store: {exc}") from exc
        if found != SCHEMA_VERSION:
            raise SchemaVersionError(
                self.path, found if found is not None else "none", SCHEMA_VERSION
            )
        self._check_tables()
        self._add_columns()

    def _migrate(self) -> int | str | None:
        """Bring an older store up to :data:`SCHEMA_VERSION` in place, one version per
        transaction, and return the version it is at now. Each step re-reads the version under
        the write lock: several processes may open the same old store at once."""
        while True:
            with self._tx() as conn:
                found = self._read_version()
                if not isinstance(found, int) or found not in _MIGRATIONS:
                    return found
                for stmt in _MIGRATIONS[found]:
                    conn.execute(stmt)
                conn.execute(
                    "UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(found + 1),)
                )

    def _check_tables(self) -> None:
        """Refuse, at open, a store missing one of our tables (dropped by hand or a damaged
        schema page): otherwise a read fails halfway and a run loses its record mid-way."""
        try:
            have = {
                row[0]
                for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not a usable session store: {exc}") from exc
        missing = [t for t in _TABLES if t not in have]
        if missing:
            raise StoreError(
                f"{self.path} is a damaged session store: table {', '.join(missing)} is missing"
            )

    def _add_columns(self) -> None:
        """Columns added since a version-1 store was first made: added in place, since an
        older Pantheon names its columns and never notices them."""
        try:
            have = {row[1] for row in self._conn.execute("PRAGMA table_info(sessions)")}
            for column in ("scenario_dir", "forked_from"):
                if column in have:
                    continue
                if self.read_only:
                    raise self._unmigrated(f"(its sessions table has no {column} column)")
                with self._tx() as conn:
                    have = {row[1] for row in conn.execute("PRAGMA table_info(sessions)")}
                    if column not in have:
                        conn.execute(f"ALTER TABLE sessions ADD COLUMN {column} TEXT")
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path} is not a usable session store: {exc}") from exc

    def _read_version(self) -> int | str | None:
        has_meta = self._conn.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'"
        ).fetchone()
        if not has_meta:
            return None
        row = self._conn.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
        if row is None:
            return None
        try:
            return int(row[0])
        except ValueError:
            return str(row[0])

    # -- session lifecycle (used by the recorder) -------------------------------------------

    def begin_session(
        self,
        session_id: str | None = None,
        *,
        scenario: str | None = None,
        scenario_text: str | None = None,
        seed: int | None = None,
        replay_of: str | None = None,
        kind: str = "run",
        started: float | None = None,
        scenario_dir: str | None = None,
        forked_from: str | None = None,
    ) -> str:
        """Create a ``running`` session owned by this process and return its id (a new one
        when ``session_id`` is None). An existing id is taken over only if it is still
        ``running`` in this process (the runtime may create the row before recording)."""
        sid = session_id or new_session_id()
        with self._tx() as conn:
            row = conn.execute("SELECT status, pid FROM sessions WHERE id = ?", (sid,)).fetchone()
            # A new id is 4 random hex digits after the second: two sessions begun in one
            # second collide once in 65,536 (a CI run met it: a replay and a what-if of one
            # session). A generated id is drawn again; only a given one is checked.
            while row is not None and session_id is None:
                sid = new_session_id()
                row = conn.execute(
                    "SELECT status, pid FROM sessions WHERE id = ?", (sid,)
                ).fetchone()
            if row is not None:
                if row[0] != "running" or row[1] != os.getpid():
                    raise StoreError(
                        f"{self.path}: session {sid!r} already exists ({row[0]}, pid {row[1]})"
                    )
                return sid
            conn.execute(
                "INSERT INTO sessions (id, kind, scenario, scenario_text, seed, started, status,"
                " summary, replay_of, pid, host, scenario_dir, forked_from)"
                " VALUES (?,?,?,?,?,?,'running','{}',?,?,?,?,?)",
                (
                    sid,
                    kind,
                    scenario,
                    scenario_text,
                    seed,
                    time.time() if started is None else started,
                    replay_of,
                    os.getpid(),
                    socket.gethostname(),
                    scenario_dir,
                    forked_from,
                ),
            )
        return sid

    def end_session(
        self, session_id: str, status: Status, summary: dict[str, Any] | None = None
    ) -> None:
        """Close a session with its final status and summary (JSON-able; others by repr)."""
        if status not in STATUSES or status == "running":
            raise ValueError(f"status must be completed, failed or aborted, not {status!r}")
        text = json.dumps(summary or {}, default=repr, sort_keys=True)
        with self._tx() as conn:
            conn.execute(
                "UPDATE sessions SET status = ?, summary = ?, ended = ? WHERE id = ?",
                (status, text, time.time(), session_id),
            )

    def reap(self) -> list[str]:
        """Mark ``running`` sessions whose process is gone as ``aborted`` (after moving what
        their journal holds into the row tables); returns their ids.

        Only sessions started on this host are judged (a pid means nothing elsewhere)."""
        host = socket.gethostname()
        rows = self._query("SELECT id, pid, host FROM sessions WHERE status = 'running'")
        dead = [sid for sid, pid, h in rows if h == host and pid and not _pid_alive(pid)]
        if not dead:
            return []
        with self._lock:
            for sid in dead:
                Materializer(self._conn, sid).run()
        with self._tx() as conn:
            for sid in dead:
                conn.execute(
                    "UPDATE sessions SET status = 'aborted', ended = coalesce("
                    "(SELECT max(wall) FROM envelopes WHERE session = ?), started), "
                    "summary = ? WHERE id = ? AND status = 'running'",
                    (sid, json.dumps({"aborted": "recording process is gone"}), sid),
                )
        return dead

    # -- reading ------------------------------------------------------------------------------

    def sessions(self, *, limit: int | None = None) -> list[SessionInfo]:
        """Sessions, newest first."""
        sql = f"SELECT {_SESSION_COLS} FROM sessions ORDER BY started DESC, id DESC"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [_session(r) for r in self._query(sql)]

    def resolve(self, ref: str) -> str:
        """The full id of the one session whose id is ``ref`` or starts with it.

        ``latest`` (or ``-1``) is the newest session, ``-2`` the one before it, and so on,
        in the order :meth:`sessions` lists them: the session a user just ran is the one they
        mean most often, and every command and API call that takes a session goes
        through here."""
        newest = _NEWEST.fullmatch(ref)
        if newest is not None:
            back = int(newest.group(1) or 1)
            rows = self._query(
                "SELECT id FROM sessions ORDER BY started DESC, id DESC LIMIT 1 OFFSET ?",
                (back - 1,),
            )
            if rows:
                return str(rows[0][0])
            raise SessionNotFound(ref, [], self.path)
        rows = self._query("SELECT id FROM sessions WHERE id = ?", (ref,))
        if rows:
            return str(rows[0][0])
        escaped = ref.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        rows = self._query(
            "SELECT id FROM sessions WHERE id LIKE ? ESCAPE '\\' ORDER BY id", (escaped + "%",)
        )
        if len(rows) == 1:
            return str(rows[0][0])
        raise SessionNotFound(ref, [r[0] for r in rows], self.path)

    def session(self, ref: str) -> SessionInfo:
        sid = self.resolve(ref)
        rows = self._query(f"SELECT {_SESSION_COLS} FROM sessions WHERE id = ?", (sid,))
        info = _session(rows[0])
        if info.corrupt is not None:
            raise self._damaged(sid, info.corrupt)
        return info

    def counts(self, session_id: str) -> dict[str, int]:
        """How many rows the session has in each table (journal chunks included)."""
        out = {}
        pending = dict(
            self._query(
                "SELECT kind, sum(count) FROM journal WHERE session = ? GROUP BY kind",
                (session_id,),
            )
        )
        for table in ("envelopes", "deliveries", "dead_letters", "effects", "metrics"):
            out[table] = self._query(
                f"SELECT count(*) FROM {table} WHERE session = ?", (session_id,)
            )[0][0] + int(pending.get(table) or 0)
        out["breaker_transitions"] = self._query(
            "SELECT count(*) FROM breaker_transitions WHERE session = ?", (session_id,)
        )[0][0]
        out["failed_deliveries"] = sum(
            1 for d in self.deliveries(session_id) if d.outcome != "delivered"
        )
        out["journal_chunks"] = self._query(
            "SELECT count(*) FROM journal WHERE session = ?", (session_id,)
        )[0][0]
        return out

    def envelope_counts(self) -> dict[str, int]:
        """Messages recorded per session, for listings."""
        out: dict[str, int] = dict(
            self._query("SELECT session, count(*) FROM envelopes GROUP BY session")
        )
        for sid, n in self._query(
            "SELECT session, sum(count) FROM journal WHERE kind = 'envelopes' GROUP BY session"
        ):
            out[sid] = out.get(sid, 0) + int(n)
        return out

    def topic_counts(self, session_id: str) -> dict[str, int]:
        """Messages recorded per topic, journal chunks included: what ``export`` lists and
        ``sessions show`` counts, read without decoding a payload.

        A multi-process run's summary counts its messages this way once every journal is
        in (``pantheon.runner.score_from_record``): a node killed mid-run took its own
        counters with it, but what it published and shipped before is in the record."""
        rows, chunks = self._with_journal(
            session_id,
            "SELECT topic, count(*) FROM envelopes WHERE session = ? GROUP BY topic",
            (session_id,),
            "envelopes",
        )
        counts: dict[str, int] = dict(rows)
        for _node, decoded in self._journaled_envelopes(session_id, chunks):
            for row in decoded:
                counts[row[2]] = counts.get(row[2], 0) + 1
        return counts

    def materialize(self, session_id: str) -> int:
        """Move the session's journal chunks into the row tables now; returns how many.
        The recorder does this itself; call it only for a session no process is recording."""
        if self.read_only:
            raise self._refuse_write("move journal chunks into the row tables")
        with self._lock:
            return Materializer(self._conn, session_id).run()

    def _with_journal(
        self, session_id: str, sql: str, params: tuple[Any, ...], kind: str
    ) -> tuple[list[tuple[Any, ...]], list[tuple[int, bytes, str | None]]]:
        """Rows and the still-journaled chunks of one kind, read in one snapshot."""
        with self._lock:
            try:
                self._conn.execute("BEGIN")
                try:
                    rows = self._conn.execute(sql, params).fetchall()
                    chunks = self._conn.execute(
                        "SELECT first, blob, node FROM journal WHERE session = ? AND kind = ? "
                        "ORDER BY seq",
                        (session_id, kind),
                    ).fetchall()
                finally:
                    self._conn.execute("COMMIT")
            except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
                raise self._damaged(session_id, str(exc)) from exc
        return rows, chunks

    def _journaled_envelopes(
        self, session_id: str, chunks: list[tuple[int, bytes, str | None]]
    ) -> Iterator[tuple[str | None, list[tuple[Any, ...]]]]:
        """Each envelope chunk's (node, rows); a chunk that does not decode is the session's
        damage, named by where it starts."""
        for first, blob, node in chunks:
            try:
                decoded = decode_envelopes(blob, first)
            except Exception as exc:  # a damaged chunk: whatever the decoder raises
                raise self._damaged(
                    session_id, f"journal chunk at message {first} cannot be decoded ({exc})"
                ) from exc
            yield node, decoded

    def envelopes(self, session_id: str, *, after_seq: int = -1) -> list[StoredEnvelope]:
        """The session's envelopes in publish order (``after_seq`` to tail a live run)."""
        rows, chunks = self._with_journal(
            session_id,
            "SELECT seq, id, topic, priority, causation_id, correlation_id, source, hops, "
            "created_ns, wall, payload, payload_repr, node FROM envelopes "
            "WHERE session = ? AND seq > ? ORDER BY seq",
            (session_id, after_seq),
            "envelopes",
        )
        for node, decoded in self._journaled_envelopes(session_id, chunks):
            rows.extend((*r, node) for r in decoded if r[0] > after_seq)
        rows.sort(key=lambda r: r[0])
        if rows and self.node_journals(session_id):
            rows = _causal(rows)
        out = []
        for r in rows:
            try:
                payload = decode(r[10])
            except DecodeError as exc:
                raise self._damaged(
                    session_id, f"the payload of message {r[0]} cannot be decoded ({exc})"
                ) from exc
            out.append(StoredEnvelope(
                r[0], from_db(r[1]), r[2], r[3], from_db(r[4]), from_db(r[5]), r[6], r[7], r[8],
                r[9], payload=payload, payload_repr=bool(r[11]), node=r[12],
            ))  # fmt: skip
        return out

    def deliveries(self, session_id: str) -> list[StoredDelivery]:
        """Every handling, in the order handlings ended."""
        with self._lock:
            try:
                self._conn.execute("BEGIN")
                try:
                    rows = self._conn.execute(
                        "SELECT seq, subscriber, envelope_id, enqueued_ns, started_ns, "
                        "ended_ns, outcome, error_type, error, node FROM deliveries "
                        "WHERE session = ? ORDER BY seq",
                        (session_id,),
                    ).fetchall()
                    chunks = self._conn.execute(
                        "SELECT first, blob, node FROM journal WHERE session = ? "
                        "AND kind = 'deliveries' ORDER BY seq",
                        (session_id,),
                    ).fetchall()
                    if chunks:
                        pairing = ErrorPairing(self._conn, session_id, fresh=False)
                        for first, blob, node in chunks:
                            filled = pairing.fill(decode_deliveries(blob, first))
                            rows.extend((*r, node) for r in filled)
                finally:
                    self._conn.execute("COMMIT")
            except (sqlite3.DatabaseError, UnicodeDecodeError) as exc:
                raise self._damaged(session_id, str(exc)) from exc
        return [StoredDelivery(r[0], r[1], from_db(r[2]), *r[3:]) for r in rows]

    def dead_letters(
        self,
        session_id: str,
        *,
        nodes: Collection[str] | None = None,
        shed: bool = True,
        limit: int | None = None,
    ) -> list[StoredDeadLetter]:
        """The session's dead letters in entry order; ``nodes``: only those processes'
        (nodes by name), ``shed=False``: none shed, ``limit``: at most that many."""
        where = ["session = ?"]
        params: list[Any] = [session_id]
        if nodes is not None:
            where.append(f"node IN ({', '.join('?' * len(nodes))})")
            params.extend(nodes)
        if not shed:
            where.append("reason != 'shed'")
        tail = ""
        if limit is not None:
            tail = " LIMIT ?"
            params.append(limit)
        rows = self._query(
            "SELECT entry_id, envelope_id, topic, subscriber, reason, error_type, error, "
            "traceback, attempts, time, redriven, redriven_by, node FROM dead_letters "
            f"WHERE {' AND '.join(where)} ORDER BY entry_id{tail}",
            tuple(params),
            session=session_id,
        )
        return [
            StoredDeadLetter(
                r[0], from_db(r[1]), r[2], r[3], r[4], r[5], r[6], r[7], r[8], r[9],
                redriven=bool(r[10]), redriven_by=r[11], node=r[12],
            )
            for r in rows
        ]  # fmt: skip

    def dead_letter_counts(self, session_id: str) -> dict[str | None, dict[str, int]]:
        """Dead letters recorded per process (``node``; ``None``: the recording process's
        own) and reason, redriven ones included, as a bus's ``dlq.totals`` counts them: a
        ``GROUP BY``, no traceback read.

        A multi-process run's summary takes from here what a process that ended without its
        report had dead-lettered (``pantheon.runner.score_from_record``)."""
        out: dict[str | None, dict[str, int]] = {}
        for node, reason, n in self._query(
            "SELECT node, reason, count(*) FROM dead_letters WHERE session = ? "
            "GROUP BY node, reason",
            (session_id,),
            session=session_id,
        ):
            out.setdefault(node, {})[reason] = int(n)
        return out

    def effects(self, session_id: str, *, name: str | None = None) -> list[StoredEffect]:
        """The session's effects in the order they were recorded; ``name`` keeps only those
        whose name matches it as a SQLite GLOB (``model.*.chat``: every model call), so a
        reader after a few kinds does not decode every tool result."""
        sql = (
            "SELECT seq, envelope_id, subscriber, ordinal, name, flag, result, error_type, "
            "error, time, started_ns, ended_ns, node, digest FROM effects WHERE session = ?"
        )
        params: tuple[Any, ...] = (session_id,)
        if name is not None:
            sql += " AND name GLOB ?"
            params += (name,)
        sql += " ORDER BY seq"  # said, not left to the plan's choice of index
        rows, chunks = self._with_journal(session_id, sql, params, "effects")
        if chunks:
            journaled: list[tuple[Any, ...]] = []
            for first, blob, node in chunks:
                try:
                    journaled.extend(decode_effects(blob, first, node))
                except Exception as exc:  # a damaged chunk: whatever the decoder raises
                    raise self._damaged(
                        session_id, f"journal chunk at effect {first} cannot be decoded ({exc})"
                    ) from exc
            if name is not None:
                # SQLite's own GLOB, asked once per distinct name, so both halves match alike.
                names = list({r[4] for r in journaled})
                keep = {
                    n
                    for (n,) in self._query(
                        "SELECT value FROM json_each(?) WHERE value GLOB ?",
                        (json.dumps(names), name),
                        session=session_id,
                    )
                }
                journaled = [r for r in journaled if r[4] in keep]
            rows.extend(journaled)
            rows.sort(key=lambda r: r[0])
        for r in rows:
            # Checked here, once, so a damaged result is a store error naming the file and
            # not an exception inside whichever handler a replay serves it to.
            if r[6] is not None and r[5] in (EFFECT_OK, EFFECT_REPR):
                try:
                    decode(r[6])
                except DecodeError as exc:
                    raise self._damaged(
                        session_id,
                        f"the result of effect {r[0]} ({r[4]}) cannot be decoded ({exc})",
                    ) from exc
        return [StoredEffect(r[0], from_db(r[1]), *r[2:]) for r in rows]

    def node_journals(self, session_id: str) -> dict[str, NodeJournal]:
        """The nodes that shipped records to a multi-process session, by name (empty for a
        single-process one, and for one recorded before nodes shipped theirs)."""
        rows = self._query(
            "SELECT node, batches, records, ended, last FROM session_nodes "
            "WHERE session = ? ORDER BY node",
            (session_id,),
            session=session_id,
        )
        return {r[0]: NodeJournal(r[0], r[1], r[2], bool(r[3]), r[4]) for r in rows}

    def node_names(self, session_id: str) -> Callable[[str | None], str | None]:
        """What the ``node`` of the session's records reads as, for whatever shows it (an
        export, a dead letter): :data:`DRIVER_NODE` for the process that recorded a
        multi-process session, whose own records the store keeps with ``None``; ``None``
        throughout a single-process session. Multi-process here means its nodes shipped
        their journals (as ``dlq list`` decides): in a session recorded before they did,
        every message is one the driver's bus saw, from whichever process published it."""
        if not self.node_journals(session_id):
            return lambda node: node
        return lambda node: node or DRIVER_NODE

    def breaker_transitions(self, session_id: str) -> list[BreakerTransition]:
        rows = self._query(
            "SELECT time, name, old, new, reason, seq, node FROM breaker_transitions "
            "WHERE session = ? ORDER BY seq",
            (session_id,),
            session=session_id,
        )
        return [BreakerTransition(*r) for r in rows]

    def metrics(self, session_id: str) -> list[MetricSnapshot]:
        rows = self._query(
            "SELECT seq, time, stats FROM metrics WHERE session = ? ORDER BY seq",
            (session_id,),
            session=session_id,
        )
        out = []
        for seq, t, s in rows:
            try:
                out.append(MetricSnapshot(seq, t, json.loads(s)))
            except ValueError as exc:  # JSONDecodeError, or text that is not UTF-8
                raise self._damaged(
                    session_id, f"metrics snapshot {seq} is not valid JSON ({exc})"
                ) from exc
        return out

    def mark_redriven(self, session_id: str, entry_id: int, by: str) -> None:
        """Record that dead letter ``entry_id`` was redriven, by session ``by``."""
        with self._tx() as conn:
            conn.execute(
                "UPDATE dead_letters SET redriven = 1, redriven_by = ? "
                "WHERE session = ? AND entry_id = ?",
                (by, session_id, entry_id),
            )


_SESSION_COLS = (
    "id, kind, scenario, scenario_text, seed, started, ended, status, summary, replay_of, pid,"
    " host, scenario_dir, forked_from"
)


def _session(row: tuple[Any, ...]) -> SessionInfo:
    """A session row; a summary that is not a JSON object marks the row ``corrupt`` (a
    listing still shows the session) instead of failing every read of the table."""
    summary: Any = {}
    corrupt = None
    try:
        summary = json.loads(row[8]) if row[8] else {}
    except ValueError as exc:
        corrupt = f"its summary is not valid JSON ({exc})"
    if not isinstance(summary, dict):
        corrupt = corrupt or f"its summary is not a JSON object (a {type(summary).__name__})"
        summary = {}
    return SessionInfo(
        row[0],
        row[1],
        row[2],
        row[3],
        row[4],
        row[5],
        row[6],
        row[7],
        summary=summary,
        replay_of=row[9],
        pid=row[10],
        host=row[11],
        scenario_dir=row[12],
        corrupt=corrupt,
        forked_from=row[13],
    )
