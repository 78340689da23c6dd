"""Recording, replaying and diffing sessions, on real SQLite files."""

from __future__ import annotations

import asyncio
import io
import json
import sqlite3
import threading
import time
import types
import weakref
from pathlib import Path

import msgspec
import pytest
from sessions_team import CALLS, email, make_setup

import pantheon.sessions as sessions
from bus import Bus, Envelope
from pantheon.rerun import replay_session
from pantheon.sessions import (
    RecordedError,
    Recorder,
    ReplayDivergence,
    SchemaVersionError,
    SessionNotFound,
    SessionStore,
    StoreError,
    diff_sessions,
    export_jsonl,
    redrive,
)
from pantheon.sessions._recorder import _Writer


@pytest.fixture
def store(tmp_path: Path) -> SessionStore:
    with SessionStore(tmp_path / "sessions.db") as st:
        yield st


async def record(store: SessionStore, variant: str = "base", n: int = 5) -> str:
    """Record the test team handling ``n`` emails; returns the session id."""
    recorder = Recorder(store, scenario="emails", scenario_text=variant, seed=7)
    async with Bus() as bus:
        recorder.attach(bus)
        await make_setup(variant)(bus)
        for i in range(n):
            await bus.emit("email.received", email(i))
        await bus.drain()
    await recorder.finish("completed", {"emails": n})
    return recorder.session_id


@pytest.fixture(autouse=True)
def _reset_calls() -> None:
    CALLS["classify"] = 0


def test_public_surface_is_exactly_all() -> None:
    # A submodule (``internals``, once a sibling room imported it) is an attribute of the
    # package but not part of its surface, as in bus's and rerun's own checks.
    public = {name for name in dir(sessions) if not name.startswith("_")}
    modules = {n for n in public if isinstance(getattr(sessions, n), types.ModuleType)}
    assert public - modules == set(sessions.__all__)


async def test_a_failing_session_is_recorded(store: SessionStore) -> None:
    sid = await record(store)
    info = store.session(sid)
    assert info.status == "completed"
    assert info.summary == {"emails": 5}
    assert info.scenario_text == "base" and info.seed == 7 and info.kind == "run"

    envs = store.envelopes(sid)
    topics = [e.topic for e in envs]
    assert topics.count("email.received") == 5
    assert topics.count("email.classified") == 5
    assert topics.count("action.done") == 4  # message 3 failed in the actor
    assert [e.seq for e in envs] == list(range(len(envs)))
    inputs = [e for e in envs if e.topic == "email.received"]
    assert all(e.causation_id is None and e.source is None for e in inputs)
    assert inputs[2].payload == email(2)
    classified = {e.causation_id: e for e in envs if e.topic == "email.classified"}
    assert classified[inputs[1].id].source == "classifier"
    assert classified[inputs[1].id].payload == {"n": 1, "label": "spam"}

    deliveries = store.deliveries(sid)
    assert len(deliveries) == 5 + 5 + 4
    failed = [d for d in deliveries if d.outcome != "delivered"]
    assert len(failed) == 1
    (bad,) = failed
    assert bad.subscriber == "actor" and bad.outcome == "failed"
    assert bad.error_type == "ValueError" and bad.error == "cannot act on message 3"
    assert bad.envelope_id == classified[inputs[3].id].id
    assert all(d.started_ns >= d.enqueued_ns and d.ended_ns >= d.started_ns for d in deliveries)

    (letter,) = store.dead_letters(sid)
    assert letter.subscriber == "actor" and letter.reason == "failed"
    assert letter.envelope_id == bad.envelope_id and letter.topic == "email.classified"
    assert letter.error_type == "ValueError" and letter.attempts == 1
    assert "Traceback" in letter.traceback and "cannot act on message 3" in letter.traceback
    assert not letter.redriven

    effects = store.effects(sid)
    assert [e.name for e in effects].count("llm.classify") == 5
    assert [e.name for e in effects].count("clock.now") == 5
    first = next(e for e in effects if e.name == "llm.classify" and e.envelope_id == inputs[0].id)
    assert first.subscriber == "classifier" and first.ordinal == 0 and first.value == "ham"
    assert len(store.metrics(sid)) >= 1
    assert store.counts(sid)["journal_chunks"] == 0  # finish() materialized everything


async def test_replay_reproduces_the_failure_without_calling_effects(store: SessionStore) -> None:
    sid = await record(store)
    assert CALLS["classify"] == 5
    CALLS["classify"] = 0

    report = await replay_session(store, sid, make_setup("base"))

    assert CALLS["classify"] == 0  # every effect served from the record
    assert report.matched and report.divergence is None
    assert report.effects_served == 10 and report.effects_called == 0
    assert report.hops_compared == 14
    (failure,) = report.failures
    original = {e.id: e for e in store.envelopes(sid)}
    assert failure.subscriber == "actor" and failure.error_type == "ValueError"
    assert original[failure.original_id].payload == {"n": 3, "label": "spam"}
    replayed = {e.id: e for e in store.envelopes(report.new_session_id)}
    assert replayed[failure.replay_id].payload == {"n": 3, "label": "spam"}

    info = store.session(report.new_session_id)
    assert info.kind == "replay" and info.replay_of == sid and info.status == "completed"
    assert info.summary["replay"]["matched"] is True
    # Served effects are recorded into the replay too, with the original values.
    stamps = [e.payload["at"] for e in store.envelopes(sid) if e.topic == "action.done"]
    again = [e.payload["at"] for e in replayed.values() if e.topic == "action.done"]
    assert stamps == again


async def test_a_changed_handler_diverges_at_its_hop(store: SessionStore) -> None:
    sid = await record(store)
    report = await replay_session(store, sid, make_setup("changed"))
    assert not report.matched
    div = report.divergence
    assert isinstance(div, ReplayDivergence)
    assert div.field == "payload" and div.agent == "classifier"
    original = {e.id: e for e in store.envelopes(sid)}
    assert original[div.original_id].topic == "email.classified"
    assert original[div.original_id].payload == {"n": 2, "label": "ham"}
    assert div.expected == {"n": 2, "label": "ham"} and div.actual == {"n": 2, "label": "urgent"}
    assert div.diff == ["payload.label: 'ham' -> 'urgent'"]
    assert "classifier" in str(div) and str(div.original_id) in str(div)
    with pytest.raises(ReplayDivergence) as raised:
        report.raise_for_divergence()
    assert raised.value is div
    with pytest.raises(ReplayDivergence):
        await replay_session(store, sid, make_setup("changed"), raise_on_divergence=True)


async def test_a_failure_that_disappears_is_a_divergence(store: SessionStore) -> None:
    sid = await record(store)
    report = await replay_session(store, sid, make_setup("fixed"))
    div = report.divergence
    assert div is not None and div.field == "outcome" and div.agent == "actor"
    assert "failed (ValueError" in div.expected and div.actual == "delivered"


async def test_diff_names_the_first_divergent_message(store: SessionStore) -> None:
    a = await record(store, "base")
    # Replays share the original's recorded clock, so they are comparable message for
    # message; two independent runs would differ in every timestamp.
    same = diff_sessions(store, a, (await replay_session(store, a, make_setup())).new_session_id)
    assert same.identical and same.hops_compared == 14
    b = (await replay_session(store, a, make_setup("changed"))).new_session_id

    # Prefixes work too when unique (ids made in the same second share more than the time).
    ids = [info.id for info in store.sessions()]
    prefix = next(
        a[:n] for n in range(15, len(a) + 1) if sum(i.startswith(a[:n]) for i in ids) == 1
    )
    result = diff_sessions(store, prefix, b)
    assert not result.identical
    div = result.divergence
    assert div is not None and div.field == "payload" and div.agent == "classifier"
    assert {e.id: e for e in store.envelopes(a)}[div.original_id].payload["n"] == 2
    assert {e.id: e for e in store.envelopes(b)}[div.replay_id].payload["label"] == "urgent"
    assert div.diff == ["payload.label: 'ham' -> 'urgent'"]
    names = {(d.scope, d.name, d.metric) for d in result.latency}
    assert ("subscriber", "actor", "handling") in names
    assert ("edge", "classifier -> actor", "queue_wait") in names
    assert ("edge", "<outside> -> classifier", "queue_wait") in names
    actor = next(d for d in result.latency if d.name == "actor" and d.metric == "handling")
    assert actor.a.count == 5 and actor.a.p99_us >= actor.a.p50_us > 0
    assert actor.b.count >= 2  # the replay stopped feeding inputs at the divergence
    json.dumps(result.to_dict())


async def test_live_effects_call_the_function(store: SessionStore) -> None:
    sid = await record(store)
    CALLS["classify"] = 0
    report = await replay_session(store, sid, make_setup("base"), live_effects=True)
    assert CALLS["classify"] == 5
    assert report.effects_called == 10 and report.effects_served == 0
    # The clock is live too, so the stamps differ: an honest payload divergence.
    assert report.divergence is not None and report.divergence.field == "payload"
    assert report.divergence.topic == "action.done"


async def test_replay_from_a_timestamp_skips_earlier_inputs(store: SessionStore) -> None:
    sid = await record(store)
    info = store.session(sid)
    inputs = [e for e in store.envelopes(sid) if e.topic == "email.received"]
    cut = inputs[3].wall - info.started
    report = await replay_session(store, sid, make_setup("base"), from_ts=cut)
    assert report.inputs_skipped == 3 and report.inputs_replayed == 2
    assert report.matched and report.hops_compared == 5  # 2 inputs, 2 classified, 1 done
    assert [f.error_type for f in report.failures] == ["ValueError"]


async def test_effect_errors_replay_as_the_same_type(store: SessionStore) -> None:
    class QuotaExceeded(Exception):
        def __init__(self, code: int, text: str) -> None:
            super().__init__(f"{code}: {text}")

    def flaky(n: int) -> int:
        if n == 1:
            raise TimeoutError("model took too long")
        if n == 2:
            raise QuotaExceeded(429, "slow down")
        return n

    async def setup(bus: Bus) -> None:
        @bus.on("job", name="worker")
        async def work(env: Envelope) -> None:
            await env.context.effect("call", flaky, env.payload)

    recorder = Recorder(store)
    async with Bus() as bus:
        recorder.attach(bus)
        await setup(bus)
        for i in range(3):
            await bus.emit("job", i)
        await bus.drain()
    await recorder.finish()
    letters = store.dead_letters(recorder.session_id)
    assert [(d.error_type, d.error) for d in letters] == [
        ("TimeoutError", "model took too long"),
        ("QuotaExceeded", "429: slow down"),
    ]
    report = await replay_session(store, recorder.session_id, setup)
    assert report.matched, report.divergence
    assert sorted(f.error_type for f in report.failures) == ["QuotaExceeded", "TimeoutError"]
    replayed = store.dead_letters(report.new_session_id)
    assert [(d.error_type, d.error) for d in replayed] == [
        ("TimeoutError", "model took too long"),
        ("QuotaExceeded", "429: slow down"),  # rebuilt as a RecordedError named like it
    ]
    err = sessions._effects.rebuild_error(  # type: ignore[attr-defined]
        "tests.nowhere.QuotaExceeded", "429: slow down"
    )
    assert isinstance(err, RecordedError) and type(err).__name__ == "QuotaExceeded"


async def test_an_effect_called_in_another_order_diverges(store: SessionStore) -> None:
    def setup_for(names: list[str]):  # type: ignore[no-untyped-def]
        async def setup(bus: Bus) -> None:
            @bus.on("job", name="worker")
            async def work(env: Envelope) -> None:
                for name in names:
                    await env.context.effect(name, lambda n=name: n)

        return setup

    recorder = Recorder(store)
    async with Bus() as bus:
        recorder.attach(bus)
        await setup_for(["a", "b"])(bus)
        await bus.emit("job", 1)
        await bus.drain()
    await recorder.finish()
    report = await replay_session(store, recorder.session_id, setup_for(["b", "a"]))
    div = report.divergence
    assert div is not None and div.field == "effect" and div.agent == "worker"
    assert (div.expected, div.actual) == ("a", "b")


async def test_unencodable_payload_is_stored_as_repr_and_flagged(store: SessionStore) -> None:
    class Opaque:
        def __repr__(self) -> str:
            return "<Opaque thing>"

    recorder = Recorder(store)
    async with Bus() as bus:
        recorder.attach(bus)
        bus.on("x.*", lambda env: None, name="noop")
        await bus.emit("x.a", {"ok": 1})
        await bus.emit("x.b", {"thing": Opaque()})
        await bus.emit("x.c", 2**70)
        await bus.drain()
    await recorder.finish()
    envs = store.envelopes(recorder.session_id)
    assert [(e.payload, e.payload_repr) for e in envs] == [
        ({"ok": 1}, False),
        ("{'thing': <Opaque thing>}", True),
        (repr(2**70), True),
    ]
    raw = (
        sqlite3.connect(store.path)
        .execute("SELECT payload_repr FROM envelopes ORDER BY seq")
        .fetchall()
    )
    assert raw == [(0,), (1,), (1,)]


async def test_export_jsonl_has_one_object_per_envelope(store: SessionStore) -> None:
    sid = await record(store)
    out = io.StringIO()
    n = export_jsonl(store, sid, out)
    lines = out.getvalue().splitlines()
    assert n == len(lines) == len(store.envelopes(sid))
    rows = [json.loads(line) for line in lines]
    assert rows[0]["topic"] == "email.received" and rows[0]["payload"] == email(0)
    assert {r["session"] for r in rows} == {sid}
    assert set(rows[0]) >= {"id", "seq", "causation_id", "correlation_id", "source", "hops"}


def test_unknown_schema_version_fails_clearly(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    SessionStore(path).close()
    with sqlite3.connect(path) as conn:
        conn.execute("UPDATE meta SET value = '99' WHERE key = 'schema_version'")
    with pytest.raises(SchemaVersionError) as raised:
        SessionStore(path)
    err = raised.value
    assert err.found == 99 and err.expected == sessions.SCHEMA_VERSION
    assert (
        str(path) in str(err)
        and "99" in str(err)
        and f"version {sessions.SCHEMA_VERSION}" in str(err)
    )
    assert isinstance(err, StoreError)


def test_a_foreign_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "not.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(StoreError, match="not a usable session store"):
        SessionStore(path)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE t (x)")
    with pytest.raises(StoreError, match="not a Pantheon session store"):
        SessionStore(other)


def test_store_path_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PANTHEON_STORE", raising=False)
    assert sessions.resolve_store_path() == tmp_path / ".pantheon" / "sessions.db"
    monkeypatch.setenv("PANTHEON_STORE", str(tmp_path / "elsewhere.db"))
    with SessionStore() as st:
        assert st.path == tmp_path / "elsewhere.db"
    conn = sqlite3.connect(tmp_path / "elsewhere.db")
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_session_prefixes_resolve_uniquely(store: SessionStore) -> None:
    a = Recorder(store, "20240101-000000-aaaa")
    b = Recorder(store, "20240101-000000-aabb")
    for r in (a, b):
        await r.finish()
    assert store.resolve("20240101-000000-aaa") == a.session_id
    with pytest.raises(SessionNotFound, match="ambiguous") as raised:
        store.resolve("20240101-000000-aa")
    assert raised.value.candidates == [a.session_id, b.session_id]
    with pytest.raises(SessionNotFound, match="no session 'zzz'"):
        store.session("zzz")
    assert sessions.new_session_id() != sessions.new_session_id()


async def test_redrive_delivers_to_a_fixed_team(store: SessionStore) -> None:
    sid = await record(store)
    (letter,) = store.dead_letters(sid)
    still_broken = await redrive(store, sid, make_setup("base"))
    assert still_broken.outcomes == {letter.entry_id: "failed: ValueError: cannot act on message 3"}
    assert not store.dead_letters(sid)[0].redriven

    report = await redrive(store, sid, make_setup("fixed"))
    assert report.outcomes == {letter.entry_id: "delivered"}
    (after,) = store.dead_letters(sid)
    assert after.redriven and after.redriven_by == report.new_session_id
    done = [e for e in store.envelopes(report.new_session_id) if e.topic == "action.done"]
    assert [e.payload["n"] for e in done] == [3]
    assert store.session(report.new_session_id).kind == "redrive"


async def test_recording_does_not_change_handler_behaviour(store: SessionStore) -> None:
    async def run(recorded: bool) -> list[tuple[str, object]]:
        seen: list[tuple[str, object]] = []
        recorder = Recorder(store) if recorded else None
        async with Bus() as bus:
            if recorder:
                recorder.attach(bus)

            @bus.on("n.*", name="double")
            async def double(env: Envelope) -> int:
                seen.append((env.topic, env.payload))
                if env.payload < 20:
                    await bus.emit("n.x", env.payload * 2)
                return env.payload

            for i in range(1, 4):
                await bus.emit("n.in", i)
            assert await bus.request("n.q", 99) == 99
            await bus.drain()
        if recorder:
            await recorder.finish()
        return seen

    assert await run(False) == await run(True)


async def test_readers_see_journaled_rows_before_they_are_materialized(
    store: SessionStore,
) -> None:
    recorder = Recorder(store)
    async with Bus() as bus:
        recorder.attach(bus)
        bus.on("t", lambda env: None, name="noop")
        for i in range(50):
            await bus.emit("t", i)
        await bus.drain()
        await recorder.flush()
        with SessionStore(store.path) as other:
            assert [e.payload for e in other.envelopes(recorder.session_id)] == list(range(50))
            assert len(other.deliveries(recorder.session_id)) == 50
            assert other.session(recorder.session_id).status == "running"
    await recorder.finish()
    assert store.counts(recorder.session_id)["journal_chunks"] == 0
    assert len(store.envelopes(recorder.session_id)) == 50


async def test_recorded_effects_count_towards_backpressure(store: SessionStore) -> None:
    # Issue #14 item 11: max_pending counted envelopes and deliveries only, so effect rows
    # (the writer's event queue) could pile up without limit between commits.
    max_pending = 10
    recorder = Recorder(store, commit_interval=3600, max_pending=max_pending)
    async with Bus() as bus:
        recorder.attach(bus)
        for i in range(100):
            await recorder.effects.effect("tool.echo", lambda i=i: i)
        # The ticker runs every 10 ms; a generous deadline, not a sleep as synchronisation.
        for _ in range(400):
            if recorder.statistics()["pending"] <= max_pending:
                break
            await asyncio.sleep(0.005)
        stats = recorder.statistics()
        assert stats["backpressure_waits"] >= 1
        assert stats["pending"] <= max_pending
    await recorder.finish()
    assert store.counts(recorder.session_id)["effects"] == 100


class Parcel(msgspec.Struct, weakref=True):
    """A payload the test can watch die (msgspec encodes it; a weak reference sees it go)."""

    items: list[str]


async def test_the_recorder_keeps_no_payload_once_its_handlings_end(store: SessionStore) -> None:
    """Each envelope is encoded as it is published and not kept: a payload is freed when
    the team is done with it, as without a recorder, not a commit later (keeping every
    payload alive until its batch was encoded made the collector's work grow and cost a
    recorded run's loop ~9% in ``benchmarks/pipeline_bench.py``)."""
    recorder = Recorder(store, scenario="keeps-nothing", commit_interval=3600)
    async with Bus() as bus:
        recorder.attach(bus)
        seen: list[int] = []
        bus.on("parcel.sent", lambda env: seen.append(len(env.payload.items)), name="count")
        watch = []
        for i in range(5):
            parcel = Parcel([f"item-{i}"] * i)
            watch.append(weakref.ref(parcel))
            await bus.emit("parcel.sent", parcel)
        del parcel
        # The worker keeps the envelope it handled last: one more, not watched.
        await bus.emit("parcel.sent", Parcel([]))
        await bus.drain()
        assert seen == [0, 1, 2, 3, 4, 0]
        assert recorder.statistics()["pending"] == 12  # recorded, not committed yet...
        assert [w() for w in watch] == [None] * 5  # ...and not one payload kept for it
    await recorder.finish()
    stored = [e.payload for e in store.envelopes(recorder.session_id)]
    assert stored == [{"items": [f"item-{i}"] * i} for i in range(5)] + [{"items": []}]


async def test_a_payload_is_recorded_as_published_whatever_a_handler_does_to_it(
    store: SessionStore,
) -> None:
    recorder = Recorder(store, scenario="as-published", commit_interval=3600)
    async with Bus() as bus:
        recorder.attach(bus)

        async def scribble(env: Envelope) -> None:
            env.payload["status"] = "scribbled"
            env.payload["tags"].append("late")

        bus.on("ticket.opened", scribble, name="scribble")
        await bus.emit("ticket.opened", {"status": "new", "tags": ["vip"]})
        await bus.drain()
    await recorder.finish()
    (env,) = store.envelopes(recorder.session_id)
    assert env.payload == {"status": "new", "tags": ["vip"]}


@pytest.mark.skipif(not hasattr(time, "pthread_getcpuclockid"), reason="no per-thread CPU clock")
def test_a_late_ticker_keeps_the_writer_from_materializing(tmp_path: Path) -> None:
    # A loop thread the kernel keeps waiting for a core uses a part of one, as a lightly busy
    # one does; its ticker's lateness is what tells them apart. Windows here are fake
    # monotonic times; the "loop" is this test thread's CPU clock, which it advances by
    # spinning 10 ms per 60 ms window (a share of about 0.17).
    writer = _Writer(tmp_path / "s.db", "NORMAL", "s")
    writer.loop_clock = time.pthread_getcpuclockid(threading.get_ident())

    def spin(seconds: float) -> None:
        end = time.thread_time() + seconds
        while time.thread_time() < end:
            pass

    now = time.monotonic()
    assert not writer._loop_idle(now)  # opens the first window
    spin(0.01)
    writer.loop_late = 0.02
    assert not writer._loop_idle(now + 0.06)  # a part of a core, and 20 ms late: busy
    spin(0.01)
    assert writer._loop_idle(now + 0.12)  # the same share, on time: idle
    assert not writer._loop_idle(now + 0.12)  # opens the next window
    writer.loop_late = 0.02
    assert writer._loop_idle(now + 0.18)  # next to no CPU: idle however late the ticker


@pytest.mark.skipif(not hasattr(time, "pthread_getcpuclockid"), reason="no per-thread CPU clock")
def test_a_multi_process_driver_materializes_only_on_a_spare_core(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The driver's loop idles while its nodes work; on one machine its materializing takes
    # their cores, so the machine's idle time decides too. Fake times as above; the
    # machine's idle CPU seconds are given.
    from pantheon.sessions import _recorder

    idle_s = [100.0]
    monkeypatch.setattr(_recorder, "_machine_idle_s", lambda: idle_s[0])
    driver = _Writer(tmp_path / "d.db", "NORMAL", "d", nodes=["a"])
    alone = _Writer(tmp_path / "s.db", "NORMAL", "s")
    for writer in (driver, alone):
        writer.loop_clock = time.pthread_getcpuclockid(threading.get_ident())
    now = time.monotonic()
    assert not driver._loop_idle(now) and not alone._loop_idle(now)  # open the windows
    idle_s[0] += 0.006  # 0.1 of a core idle over 60 ms: the nodes keep the machine busy
    assert not driver._loop_idle(now + 0.06)
    assert alone._loop_idle(now + 0.06)  # a single-process run looks at its loop only
    idle_s[0] += 0.06  # a whole core idle over the next 60 ms
    assert driver._loop_idle(now + 0.12)


def test_a_new_session_id_that_is_taken_is_drawn_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two sessions begun in one second draw from 65,536 suffixes: a clash is drawn again,
    never an error (a replay and a what-if of one session met one in CI)."""
    from pantheon.sessions import _store

    drawn = iter(["20261128-040635-d05a", "20261128-040635-d05a", "20261128-040635-0001"])
    monkeypatch.setattr(_store, "new_session_id", lambda: next(drawn))
    with SessionStore(tmp_path / "s.db") as store:
        first = store.begin_session(scenario="a")
        second = store.begin_session(scenario="b")
        assert (first, second) == ("20261128-040635-d05a", "20261128-040635-0001")
        store.end_session(first, "completed")
        with pytest.raises(StoreError, match="already exists"):
            store.begin_session("20261128-040635-d05a", scenario="c")


async def test_a_handlings_effect_positions_go_on_across_retries_and_start_afresh_per_message(
    store: SessionStore,
) -> None:
    """Effects are numbered per (message, subscriber): a retry goes on from where the
    failed attempt stopped, even when another worker of the subscription takes it (the
    bus carries the count with the handling), and the next message a worker takes starts
    at 0 again."""
    from bus import Retry

    recorder = Recorder(store, scenario="positions")
    tries: dict[int, int] = {}
    async with Bus() as bus:
        recorder.attach(bus)

        async def flaky(env: Envelope) -> None:
            n = env.payload["n"]
            await recorder.effects.effect("tool.look", lambda: n)
            tries[n] = tries.get(n, 0) + 1
            if n % 2 and tries[n] == 1:
                raise RuntimeError("first attempt fails")
            await recorder.effects.effect("tool.write", lambda: n)

        bus.on("job.*", flaky, name="flaky", retry=Retry(attempts=2), concurrency=3)
        for n in range(6):
            await bus.emit("job.run", {"n": n})
        await bus.drain()
    await recorder.finish()
    ids = {e.id: e.payload["n"] for e in store.envelopes(recorder.session_id)}
    by_n: dict[int, list[tuple[int, str]]] = {}
    for eff in store.effects(recorder.session_id):
        by_n.setdefault(ids[eff.envelope_id], []).append((eff.ordinal, eff.name))
    for n in range(6):
        expected = [(0, "tool.look"), (1, "tool.write")]
        if n % 2:  # the failed attempt's look, then the retry's look and write
            expected = [(0, "tool.look"), (1, "tool.look"), (2, "tool.write")]
        assert sorted(by_n[n]) == expected


async def test_a_recorded_bus_has_every_dead_letter_in_the_store_sheds_included(
    store: SessionStore,
) -> None:
    """A subscription shedding a flood lists one shed in SHED_SAMPLE past its first
    SHED_LIST_ALL, unless someone listens to its DLQ: a recorder does, so the record holds
    every shed and its counts per reason are the bus's ``dlq.totals``. (A multi-process
    run's summary counts a killed node's dead letters from its record on that basis.)
    ``shed=False`` lists the others only."""
    from bus._subscription import SHED_LIST_ALL

    recorder = Recorder(store, scenario="sheds", scenario_text="", seed=7)
    flood = SHED_LIST_ALL + 200
    async with Bus() as bus:
        recorder.attach(bus)
        gate = asyncio.Event()

        @bus.on("t", name="slow", max_queue=10, overflow="shed")
        async def slow(env: Envelope) -> None:
            await gate.wait()

        @bus.on("u", name="broken")
        async def broken(env: Envelope) -> None:
            raise ValueError("no")

        for i in range(10 + flood):
            bus.emit_nowait("t", i)
        await bus.emit("u", 0)
        gate.set()
        await asyncio.wait_for(bus.drain(), 5)
        totals = bus.dlq.totals
    await recorder.finish("completed", {})
    sid = recorder.session_id
    assert totals == {"shed": flood, "failed": 1}
    assert store.dead_letter_counts(sid) == {None: totals}
    (letter,) = store.dead_letters(sid, shed=False)
    assert (letter.subscriber, letter.reason) == ("broken", "failed")
    assert len(store.dead_letters(sid, limit=5)) == 5
