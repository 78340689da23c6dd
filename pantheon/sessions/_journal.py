"""The recording journal: what the writer commits every interval, and how it becomes rows.

Why a journal: the bus handles a message in about 1.5 µs, and building and binding one SQLite
row from Python costs more than that, under the same GIL. So each envelope, delivery and
effect is encoded in C by msgspec as it happens, into msgpack chunks of up to 2,048 rows
(:class:`EnvelopeRows`, :class:`DeliveryRows`, :class:`EffectRows`), and the hot commit
stores each chunk as one blob in the ``journal`` table: durable at the same group-commit
cadence, at about a microsecond of loop time per row. Effects were row inserts until schema
2: the nine-agent pipeline makes five effect calls per email, and binding their 12 columns
cost the writer 0.10 s of CPU per 3,000 emails against 0.02 s for every envelope and
delivery chunk (``benchmarks/RESULTS.md``). The writer turns journal chunks into
``envelopes`` / ``deliveries`` / ``effects`` rows ("materializes" them) whenever the event
loop is not busy, when the recorder finishes, and when a store is opened after a crash.
Materializing a chunk inserts its rows and deletes it in one transaction, so every recorded
row is in exactly one of the two places at any time; :class:`~pantheon.sessions.SessionStore`
reads both, so readers never see the difference.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

import msgspec

from bus import Delivery, Envelope, Receipt
from pantheon.sessions._codec import safe_repr

__all__ = [
    "CHUNK_ROWS",
    "Chunk",
    "DeliveryRows",
    "EffectRows",
    "EnvelopeRows",
    "Materializer",
    "decode_deliveries",
    "decode_effects",
    "decode_envelopes",
    "insert_rows",
]

#: Rows per journal chunk: bounds the GIL time one materialization step takes (~10 ms).
CHUNK_ROWS = 2048

_I64 = 2**63 - 1
_U64 = 2**64

DeliveryTuple = tuple[str, int, int, int, int, str]
#: An effect as an effects runner hands it to its sink (:class:`EffectRows`):
#: (envelope id, subscriber, ordinal, name, flag, result blob, error type, error, time,
#: started_ns, ended_ns, request digest).
EffectTuple = tuple[
    int, str | None, int, str, int, bytes | None, str | None, str | None, float, int, int,
    bytes | None,
]  # fmt: skip
#: An effect as a schema-3 journal holds it: no request digest. A store migrated with
#: chunks still in its journal (a run killed before it) reads them back without one.
_EffectTupleV3 = tuple[
    int, str | None, int, str, int, bytes | None, str | None, str | None, float, int, int
]


def _stored_envelope() -> type[msgspec.Struct]:
    """:class:`~bus.Envelope`'s fields, in order, with the payload left as its msgpack bytes
    (``msgspec.Raw``): materializing stores those bytes as they are, where decoding the
    payload and encoding it again cost 2-3 times as much (78-83 against 26-42 ms for a
    3,000-email pipeline run's 28 chunks; the rows came out identical)."""
    fields = [
        (f.name, msgspec.Raw if f.name == "payload" else f.type, f.default)
        if f.default is not msgspec.NODEFAULT
        else (f.name, f.type)
        for f in msgspec.structs.fields(Envelope)
    ]
    return msgspec.defstruct("StoredEnvelope", fields, array_like=True, gc=False)


_StoredEnvelope: Any = _stored_envelope()
_EnvChunk = tuple[float, int, list[int], list[_StoredEnvelope]]  # wall0, mono0, flagged, envelopes
_env_chunk: msgspec.msgpack.Decoder[Any] = msgspec.msgpack.Decoder(_EnvChunk)
_del_chunk = msgspec.msgpack.Decoder(list[DeliveryTuple])
_eff_chunk = msgspec.msgpack.Decoder(list[EffectTuple])
_eff_chunk_v3 = msgspec.msgpack.Decoder(list[_EffectTupleV3])
_raw = msgspec.msgpack.Encoder()


def _skip_type(cls: type) -> bool:
    # ``context`` (an effects runner, when it is not our EffectsContext, which encodes as
    # ``[]`` for free) and ``reply`` (a future, or a transport's Receipt on a message from
    # another node) ride on envelopes but are never serialized; anything else msgspec
    # cannot encode is a payload problem.
    return issubclass(cls, asyncio.Future | Receipt) or callable(getattr(cls, "effect", None))


#: One journal chunk as the loop thread cuts it: (kind, rows, msgpack blob).
Chunk = tuple[str, int, bytes]


def _array_header(n: int) -> bytes:
    """msgpack's header of an array of ``n`` items, in its shortest form (as msgspec
    writes it, so a chunk built row by row is byte for byte one encoded whole)."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


class _Rows:
    """Rows of one kind, encoded to msgpack on the loop thread as they happen, and cut into
    journal chunks of :data:`CHUNK_ROWS`.

    Why on the loop thread, at once: the recorder used to keep each envelope and delivery
    (a C ``append``) and have the writer thread encode a batch of them 50-70 ms later.
    Keeping them meant every payload outlived its handling, and the writer encoded them
    with the GIL held, from memory another core had written: 75-85 ms of
    writer CPU per 3,000-email pipeline run for the envelopes alone (2,048 at a time, one C
    call the loop could not interrupt), and the kept payloads cost the loop more again (the
    collector's young generation had to be held at 50,000). Encoded at once, what the loop
    pays is one C call on memory it has just written, and nothing is kept but bytes.
    Measured in ``benchmarks/RESULTS.md`` ("Session 11").

    Loop thread only: the listeners, the effects sink and the recorder's ticker."""

    __slots__ = ("_buf", "_chunks", "_encode_into", "count", "kind", "taken")

    def __init__(self, kind: str, encoder: msgspec.msgpack.Encoder) -> None:
        self.kind = kind
        self._encode_into = encoder.encode_into
        self._buf = bytearray()
        self._chunks: list[Chunk] = []
        #: Rows in the open chunk, and in the cut ones not taken yet.
        self.count = 0
        self.taken = 0

    def rows(self) -> int:
        """Rows waiting to be taken."""
        return self.taken + self.count

    def add(self, row: tuple[Any, ...]) -> None:
        """One row of plain values (an effect: :data:`EffectTuple`)."""
        self._encode_into(row, self._buf, -1)
        self.count += 1
        if self.count == CHUNK_ROWS:
            self._cut()

    def _head(self) -> bytes:
        return _array_header(self.count)

    def _cut(self) -> None:
        self._chunks.append((self.kind, self.count, self._head() + self._buf))
        self.taken += self.count
        self._buf = bytearray()
        self.count = 0

    def take(self) -> list[Chunk]:
        """Every row so far, as chunks (the open one cut), oldest first."""
        if self.count:
            self._cut()
        chunks, self._chunks = self._chunks, []
        self.taken = 0
        return chunks


class EffectRows(_Rows):
    """Effects as the effects runner reports them (:data:`EffectTuple`; results are msgpack
    already, encoded when the effect returned)."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("effects", _raw)


class DeliveryRows(_Rows):
    """The bus's :class:`~bus.Delivery` reports, as :data:`DeliveryTuple` rows."""

    __slots__ = ()

    def __init__(self) -> None:
        super().__init__("deliveries", _raw)

    def add_delivery(self, d: Delivery) -> None:
        """The bus's ``on_delivery`` listener."""
        env = d.envelope
        self._encode_into(
            (d.subscriber, env.id, env.created, d.started, d.ended, d.outcome), self._buf, -1
        )
        self.count += 1
        if self.count == CHUNK_ROWS:
            self._cut()


class EnvelopeRows(_Rows):
    """Envelopes as published, whole (the payload as it was at that moment: a handler that
    mutates it later cannot change the record). A payload msgspec cannot encode is stored as
    its repr and its position flagged. A chunk is ``[wall base, monotonic base, flagged
    positions, envelopes]``: the bases turn each ``created`` into wall-clock time."""

    __slots__ = ("_flagged", "_null_types", "mono_base", "wall_base")

    def __init__(self, wall_base: float, mono_base: int) -> None:
        super().__init__("envelopes", msgspec.msgpack.Encoder(enc_hook=self._hook))
        self.wall_base = wall_base
        self.mono_base = mono_base
        self._flagged: list[int] = []
        self._null_types: set[type] = set()

    def _hook(self, obj: Any) -> Any:
        cls = type(obj)
        if cls in self._null_types:
            return None
        if _skip_type(cls):
            self._null_types.add(cls)
            return None
        raise TypeError(f"cannot encode {cls.__qualname__}")

    def add_envelope(self, env: Envelope) -> None:
        """The bus's ``on_publish`` listener."""
        buf = self._buf
        mark = len(buf)
        try:
            self._encode_into(env, buf, -1)
        except Exception:
            del buf[mark:]
            self._flagged.append(self.count)
            self._encode_into(
                msgspec.structs.replace(
                    env, payload=safe_repr(env.payload), context=None, reply=None
                ),
                buf,
                -1,
            )
        self.count += 1
        if self.count == CHUNK_ROWS:
            self._cut()

    def add_own_envelope(self, env: Envelope) -> None:
        """``on_publish`` of a bus with peers: an envelope from another process (its
        ``reply`` is that transport's :class:`~bus.Receipt`) is that process's to journal."""
        if not isinstance(env.reply, Receipt):
            self.add_envelope(env)

    def _head(self) -> bytes:
        head = _raw.encode((self.wall_base, self.mono_base, self._flagged))
        # The 3-item array's header, widened to 4 by the envelopes that follow it.
        return b"\x94" + head[1:] + _array_header(self.count)

    def _cut(self) -> None:
        super()._cut()
        self._flagged = []  # positions are the open chunk's


def _db(i: int | None) -> int | None:
    return i - _U64 if i is not None and i > _I64 else i


def decode_envelopes(blob: bytes, first: int) -> list[tuple[Any, ...]]:
    """A chunk's envelopes as ``envelopes`` rows minus the session column:
    (seq, id, topic, priority, causation_id, correlation_id, source, hops, created_ns, wall,
    payload blob, payload_repr), ids as SQLite stores them."""
    wall0, mono0, flagged, envs = _env_chunk.decode(blob)
    marks = set(flagged)
    return [
        (first + n, _db(e.id), e.topic, int(e.priority), _db(e.causation_id),
         _db(e.correlation_id), e.source, e.hops, e.created,
         wall0 + (e.created - mono0) * 1e-9, bytes(e.payload), int(n in marks))
        for n, e in enumerate(envs)
    ]  # fmt: skip


def decode_deliveries(blob: bytes, first: int) -> list[tuple[Any, ...]]:
    """A chunk's deliveries as rows minus the session column and the error columns:
    (seq, subscriber, envelope_id, enqueued_ns, started_ns, ended_ns, outcome)."""
    return [
        (first + n, sub, _db(env_id), created, start, end, outcome)
        for n, (sub, env_id, created, start, end, outcome) in enumerate(_del_chunk.decode(blob))
    ]


def decode_effects(blob: bytes, first: int, node: str | None) -> list[tuple[Any, ...]]:
    """A chunk's effects (made on ``node``) as ``effects`` rows minus the session column:
    (seq, envelope_id, subscriber, ordinal, name, flag, result, error_type, error, time,
    started_ns, ended_ns, node, digest), ids as SQLite stores them."""
    try:
        effects: list[tuple[Any, ...]] = _eff_chunk.decode(blob)
    except msgspec.ValidationError:
        effects = [(*e, None) for e in _eff_chunk_v3.decode(blob)]
    return [
        (first + n, _db(env_id), *rest, node, digest)
        for n, (env_id, *rest, digest) in enumerate(effects)
    ]


#: SQLite's default cap on bound parameters per statement (3.32+).
_MAX_PARAMS = 32_766


def insert_rows(
    conn: sqlite3.Connection, table: str, rows: Sequence[tuple[Any, ...]], verb: str = "INSERT"
) -> None:
    """Insert rows with as few statements as possible: one multi-row ``VALUES`` per up to
    32 766 parameters rather than ``executemany``.

    Why: sqlite3 releases the GIL around every statement step, and on a busy event loop each
    re-acquisition is a thread handoff that costs the loop far more than the insert itself
    (measured: ~1 ms per handoff on a 2-vCPU VM). One statement is one handoff."""
    if not rows:
        return
    width = len(rows[0])
    per = max(1, _MAX_PARAMS // width)
    one = "(" + ",".join("?" * width) + ")"
    for i in range(0, len(rows), per):
        part = rows[i : i + per]
        sql = f"{verb} INTO {table} VALUES " + ",".join([one] * len(part))
        conn.execute(sql, [v for row in part for v in row])


class ErrorPairing:
    """Pairs the k-th failed delivery of (envelope, subscriber) with the k-th dead letter
    of that pair whose reason is ``failed`` or ``circuit_open`` (the bus adds the dead
    letter just before it reports the delivery)."""

    __slots__ = ("_conn", "_seen", "_session")

    def __init__(self, conn: sqlite3.Connection, session: str, *, fresh: bool) -> None:
        self._conn = conn
        self._session = session
        self._seen: dict[tuple[int, str], int] = {}
        if not fresh:
            for env_id, sub, n in conn.execute(
                "SELECT envelope_id, subscriber, count(*) FROM deliveries "
                "WHERE session = ? AND outcome != 'delivered' GROUP BY 1, 2",
                (session,),
            ):
                self._seen[(env_id, sub)] = n

    def error(self, env_id: int, sub: str) -> tuple[str | None, str | None]:
        k = self._seen.get((env_id, sub), 0)
        self._seen[(env_id, sub)] = k + 1
        row = self._conn.execute(
            "SELECT error_type, error FROM dead_letters WHERE session = ? AND envelope_id = ? "
            "AND subscriber = ? AND reason IN ('failed', 'circuit_open') "
            "ORDER BY entry_id LIMIT 1 OFFSET ?",
            (self._session, env_id, sub, k),
        ).fetchone()
        return (row[0], row[1]) if row else (None, None)

    def fill(self, rows: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
        """Delivery rows (without error columns) -> rows with error_type, error."""
        out = []
        for r in rows:
            if r[6] != "delivered":
                out.append((*r, *self.error(r[2], r[1])))
            else:
                out.append((*r, None, None))
        return out


class Materializer:
    """Moves one session's journal chunks into the row tables, oldest first, one chunk per
    transaction. ``fresh`` says the session has no materialized deliveries yet (a new
    recording), which saves one scan."""

    __slots__ = ("_conn", "_pairing", "_session")

    def __init__(self, conn: sqlite3.Connection, session: str, *, fresh: bool = False) -> None:
        self._conn = conn
        self._session = session
        self._pairing = ErrorPairing(conn, session, fresh=fresh)

    def pending(self) -> int:
        return int(
            self._conn.execute(
                "SELECT count(*) FROM journal WHERE session = ?", (self._session,)
            ).fetchone()[0]
        )

    def step(self) -> bool:
        """Materialize the oldest chunk; False when there was none."""
        conn = self._conn
        sid = self._session
        # Select inside the write transaction: two processes reaping the same dead session
        # must not both take the same chunk.
        conn.execute("BEGIN IMMEDIATE")
        try:
            row = conn.execute(
                "SELECT seq, kind, first, blob, node FROM journal WHERE session = ? "
                "ORDER BY seq LIMIT 1",
                (sid,),
            ).fetchone()
            if row is None:
                conn.execute("COMMIT")
                return False
            jseq, kind, first, blob, node = row
            if kind == "envelopes":
                envs = decode_envelopes(blob, first)
                insert_rows(conn, "envelopes", [(sid, *r, node) for r in envs])
            elif kind == "effects":
                effs = decode_effects(blob, first, node)
                insert_rows(conn, "effects", [(sid, *r) for r in effs])
            else:
                rows = self._pairing.fill(decode_deliveries(blob, first))
                insert_rows(conn, "deliveries", [(sid, *r, node) for r in rows])
            conn.execute("DELETE FROM journal WHERE session = ? AND seq = ?", (sid, jseq))
        except BaseException:
            conn.execute("ROLLBACK")
            raise
        conn.execute("COMMIT")
        return True

    def run(self, max_chunks: int | None = None) -> int:
        n = 0
        while (max_chunks is None or n < max_chunks) and self.step():
            n += 1
        return n
