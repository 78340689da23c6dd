"""The store's schema: effects ride in the journal (schema 2), and a version-1 store is
migrated in place when opened."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import msgspec
import pytest

from bus import Bus, Envelope
from pantheon.sessions import SCHEMA_VERSION, Recorder, SessionStore, StoreError
from pantheon.sessions._journal import EnvelopeRows

#: The version-1 schema as Pantheon shipped it (its journal refused ``kind = 'effects'``).
V1_SCHEMA = """
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE sessions (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL DEFAULT 'run', scenario TEXT, scenario_text TEXT,
    seed INTEGER, started REAL NOT NULL, ended REAL,
    status TEXT NOT NULL CHECK (status IN ('running', 'completed', 'failed', 'aborted')),
    summary TEXT, replay_of TEXT, pid INTEGER, host TEXT
);
CREATE TABLE envelopes (
    session TEXT NOT NULL, seq INTEGER NOT NULL, id INTEGER NOT NULL, topic TEXT NOT NULL,
    priority INTEGER NOT NULL, causation_id INTEGER, correlation_id INTEGER, source TEXT,
    hops INTEGER NOT NULL, created_ns INTEGER NOT NULL, wall REAL NOT NULL, payload BLOB,
    payload_repr INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE TABLE deliveries (
    session TEXT NOT NULL, seq INTEGER NOT NULL, subscriber TEXT NOT NULL,
    envelope_id INTEGER NOT NULL, enqueued_ns INTEGER NOT NULL, started_ns INTEGER NOT NULL,
    ended_ns INTEGER NOT NULL, outcome TEXT NOT NULL, error_type TEXT, error TEXT,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE TABLE breaker_transitions (
    session TEXT NOT NULL, seq INTEGER NOT NULL, time REAL NOT NULL, name TEXT NOT NULL,
    old TEXT NOT NULL, new TEXT NOT NULL, reason TEXT, PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE TABLE dead_letters (
    session TEXT NOT NULL, entry_id INTEGER NOT NULL, envelope_id INTEGER NOT NULL,
    topic TEXT NOT NULL, subscriber TEXT NOT NULL, reason TEXT NOT NULL, error_type TEXT,
    error TEXT, traceback TEXT, attempts INTEGER NOT NULL, time REAL NOT NULL,
    redriven INTEGER NOT NULL DEFAULT 0, redriven_by TEXT, PRIMARY KEY (session, entry_id)
) WITHOUT ROWID;
CREATE TABLE effects (
    session TEXT NOT NULL, seq INTEGER NOT NULL, envelope_id INTEGER NOT NULL,
    subscriber TEXT, ordinal INTEGER NOT NULL, name TEXT NOT NULL, flag INTEGER NOT NULL,
    result BLOB, error_type TEXT, error TEXT, time REAL NOT NULL,
    started_ns INTEGER NOT NULL, ended_ns INTEGER NOT NULL, PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE INDEX dead_letters_envelope ON dead_letters (session, envelope_id);
CREATE TABLE journal (
    session TEXT NOT NULL, seq INTEGER NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('envelopes', 'deliveries')),
    first INTEGER NOT NULL, count INTEGER NOT NULL, created REAL NOT NULL,
    blob BLOB NOT NULL, PRIMARY KEY (session, seq)
) WITHOUT ROWID;
CREATE TABLE metrics (
    session TEXT NOT NULL, seq INTEGER NOT NULL, time REAL NOT NULL, stats TEXT NOT NULL,
    PRIMARY KEY (session, seq)
) WITHOUT ROWID;
INSERT INTO meta VALUES ('schema_version', '1');
"""

_pack = msgspec.msgpack.encode
#: An envelope id past 2**63, stored wrapped to negative, as the recorder stores such ids.
BIG_ID = 2**64 - 5


def _old_store(path: Path) -> None:
    """A version-1 store with one finished session (rows) and one killed mid-run whose last
    envelopes are still a journal chunk."""
    conn = sqlite3.connect(path)
    conn.executescript(V1_SCHEMA)
    conn.executemany(
        "INSERT INTO sessions VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
        [
            ("old-done", "run", "emails", "text", 7, 100.0, 101.0, "completed", '{"n": 2}',
             None, 1, "elsewhere"),
            ("old-cut", "run", "emails", None, None, 200.0, 201.0, "aborted", "{}", None, 1,
             "elsewhere"),
        ],
    )  # fmt: skip
    conn.executemany(
        "INSERT INTO envelopes VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        [
            ("old-done", 0, 11, "email.received", 2, None, 11, None, 0, 5_000, 100.5,
             _pack({"id": "e0", "body": "refund"}), 0),
            ("old-done", 1, BIG_ID - 2**64, "email.triaged", 2, 11, 11, "triage", 1, 6_000,
             100.6, _pack("<object at 0x1>"), 1),
        ],
    )  # fmt: skip
    conn.execute(
        "INSERT INTO deliveries VALUES (?,?,?,?,?,?,?,?,?,?)",
        ("old-done", 0, "triage", 11, 5_000, 5_100, 5_900, "delivered", None, None),
    )
    conn.executemany(
        "INSERT INTO effects VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)",
        [
            ("old-done", 0, 11, "triage", 0, "llm.classify", 0, _pack({"intent": "refund"}),
             None, None, 100.55, 5_200, 5_800),
            ("old-done", 1, 11, "triage", 1, "tool.reply", 1, None, "TimeoutError", "slow",
             100.56, 5_810, 5_890),
        ],
    )  # fmt: skip
    rows = EnvelopeRows(200.0, 0)
    rows.add_envelope(
        Envelope(topic="email.received", payload={"id": "e9"}, id=21, created=1_000_000_000)
    )
    ((_, _, chunk),) = rows.take()
    conn.execute("INSERT INTO journal VALUES ('old-cut', 0, 'envelopes', 0, 1, 200.5, ?)", (chunk,))
    conn.commit()
    conn.close()


def test_a_version_1_store_is_migrated_in_place_and_reads_back_exactly(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _old_store(path)
    with SessionStore(path) as store:
        conn = sqlite3.connect(path)
        assert conn.execute("SELECT value FROM meta").fetchone() == (str(SCHEMA_VERSION),)
        conn.close()
        done = store.session("old-done")
        assert (done.status, done.summary, done.seed, done.host) == (
            "completed", {"n": 2}, 7, "elsewhere",
        )  # fmt: skip
        envs = store.envelopes("old-done")
        assert [
            (e.seq, e.id, e.topic, e.causation_id, e.payload, e.payload_repr) for e in envs
        ] == [
            (0, 11, "email.received", None, {"id": "e0", "body": "refund"}, False),
            (1, BIG_ID, "email.triaged", 11, "<object at 0x1>", True),
        ]
        assert envs[1].wall == 100.6 and envs[1].created_ns == 6_000
        [d] = store.deliveries("old-done")
        assert (d.subscriber, d.envelope_id, d.handling_ns, d.outcome) == (
            "triage", 11, 800, "delivered",
        )  # fmt: skip
        effects = store.effects("old-done")
        assert [(e.seq, e.name, e.flag, e.error_type) for e in effects] == [
            (0, "llm.classify", 0, None),
            (1, "tool.reply", 1, "TimeoutError"),
        ]
        assert effects[0].value == {"intent": "refund"}
        assert effects[1].time == 100.56 and effects[1].ended_ns == 5_890
        # The killed session's journal chunk survived the journal's rebuild.
        [cut] = store.envelopes("old-cut")
        assert (cut.id, cut.payload, cut.wall) == (21, {"id": "e9"}, 201.0)
        assert store.counts("old-cut")["journal_chunks"] == 1


async def test_a_migrated_store_journals_effects(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    _old_store(path)
    with SessionStore(path) as store:
        recorder = Recorder(store)
        async with Bus() as bus:
            recorder.attach(bus)
            assert await recorder.effects.effect("tool.echo", lambda: "hi") == "hi"
        await recorder.finish()
        [effect] = store.effects(recorder.session_id)
        assert (effect.name, effect.value) == ("tool.echo", "hi")
        assert len(store.effects("old-done")) == 2


async def test_effects_are_journaled_and_read_before_they_are_materialized(
    tmp_path: Path,
) -> None:
    with SessionStore(tmp_path / "s.db") as store:
        recorder = Recorder(store)
        writer = recorder._writer
        async with Bus() as bus:
            recorder.attach(bus)
            # Keep the writer from materializing while we look (it would on an idle loop).
            writer.loop_clock = None
            writer.max_lag = 3600.0
            for i in range(5):
                await recorder.effects.effect("model.fake.chat", lambda i=i: {"n": i})
            await recorder.effects.effect("tool.reply", lambda: "sent")
            await recorder.flush()
            sid = recorder.session_id
            conn = sqlite3.connect(store.path)
            assert conn.execute("SELECT count(*) FROM effects").fetchone() == (0,)
            assert conn.execute(
                "SELECT kind, count FROM journal WHERE session = ?", (sid,)
            ).fetchall() == [("effects", 6)]
            conn.close()
            live = store.effects(sid)
            assert [(e.seq, e.name) for e in live] == [
                *((i, "model.fake.chat") for i in range(5)),
                (5, "tool.reply"),
            ]
            assert [e.value for e in store.effects(sid, name="model.*.chat")] == [
                {"n": i} for i in range(5)
            ]
            assert store.counts(sid)["effects"] == 6
        await recorder.finish()
        assert store.counts(sid)["journal_chunks"] == 0
        assert store.effects(sid) == live


def test_a_damaged_effects_chunk_is_a_store_error_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    with SessionStore(path) as store:
        sid = store.begin_session(None)
        with sqlite3.connect(path) as conn:
            conn.execute(
                "INSERT INTO journal (session, seq, kind, first, count, created, blob) "
                "VALUES (?, 0, 'effects', 0, 1, 0.0, ?)",
                (sid, b"\xc1junk"),
            )
        with pytest.raises(StoreError, match="journal chunk at effect 0 cannot be decoded"):
            store.effects(sid)
