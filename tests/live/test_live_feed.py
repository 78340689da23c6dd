"""The live feed: a real ``pantheon run`` in a subprocess publishes snapshots that clients
in this process attach to; a finished session's snapshot is the read model's."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import tempfile
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from live_watch import watch_feed

import pantheon.live
from bus import Bus, Envelope, Retry
from pantheon import readmodel
from pantheon.live import (
    FeedNotFound,
    LiveFeed,
    RedriveResult,
    Snapshot,
    connect,
    snapshot_from_store,
    socket_path,
    trace_from_store,
)
from pantheon.sessions import SessionStore
from pantheon.testing import ModelServer, classify_reply

ROOT = Path(__file__).resolve().parents[2]
DEADLINE = 60.0


@dataclass
class Watched:
    """What two clients saw of one real run, and the redrive one of them asked for."""

    store: Path
    session_id: str
    first: list[Snapshot] = field(default_factory=list)
    second: list[Snapshot] = field(default_factory=list)
    redrive: RedriveResult | None = None
    exit_code: int | None = None


async def _watch(store: Path, child: subprocess.Popen[bytes]) -> Watched:
    info, a = await watch_feed(store, child, DEADLINE)
    watched = Watched(store, info.id)
    b = await connect(socket_path(store, info.id))  # several clients at once
    assert a.session_id == b.session_id == info.id

    async def follow_a() -> None:
        async for snap in a:
            watched.first.append(snap)
            if watched.redrive is None and snap.live and snap.dead_letters:
                watched.redrive = await a.redrive(snap.dead_letters[0].entry_id)

    async def follow_b() -> None:
        async for snap in b:
            watched.second.append(snap)

    async with asyncio.timeout(DEADLINE):
        await asyncio.gather(follow_a(), follow_b())
    await a.aclose()
    await b.aclose()
    return watched


@pytest.fixture(scope="module")
def watched(tmp_path_factory: pytest.TempPathFactory) -> Watched:
    """flaky_actor paced to 200 emails/s (about three seconds), run by the real CLI in a
    subprocess and watched from here from start to end."""
    tmp = tmp_path_factory.mktemp("live")
    data = yaml.safe_load((ROOT / "scenarios" / "flaky_actor.yaml").read_text())
    data["input"]["path"] = str(ROOT / "scenarios" / data["input"]["path"])
    data["path"] = [str(ROOT / "scenarios")]  # the support team's package, from elsewhere
    data["input"]["rate"] = 200
    scenario = tmp / "flaky_paced.yaml"
    scenario.write_text(yaml.safe_dump(data))
    store = tmp / "sessions.db"
    child = subprocess.Popen(
        [
            *(sys.executable, "-m", "pantheon.cli", "run", str(scenario)),
            *("--store", str(store), "--json"),
        ],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        result = asyncio.run(_watch(store, child))
        out, err = child.communicate(timeout=DEADLINE)
    finally:
        if child.poll() is None:
            child.kill()
            child.communicate()
    result.exit_code = child.returncode
    assert json.loads(out)["session_id"] == result.session_id, err
    return result


def test_clients_see_the_counters_grow_until_the_final_status(watched: Watched) -> None:
    for seen in (watched.first, watched.second):
        live = [s for s in seen if s.live]
        assert len(live) >= 3, "several snapshots a second over a ~3 s run"
        published = [s.totals.published for s in live]
        assert published == sorted(published) and published[-1] > published[0]
        assert len(set(published)) >= 3  # growing while the run goes, not only at the end
        assert [s.seq for s in seen] == sorted({s.seq for s in seen})
        last = seen[-1]
        assert not last.live and last.status == "completed" and watched.exit_code == 0
        assert last.totals.published >= published[-1]
        assert any(s.traces and s.traces[-1].hops for s in live)  # recent waterfalls
        assert {b.name for b in last.breakers} >= {"actor", "reasoner"}
        assert {s.key for s in last.series if s.kind == "agent"} >= {"actor", "sensor"}
        # The Reasoner asks the rule provider: model calls, no tokens, no price for "rules".
        assert last.usage.total.calls > 0 and last.usage.total.total_tokens == 0
        assert set(last.usage.by_agent) == {"reasoner"} and last.usage.total.priced  # $0
        # What the team decided grows live, in its own words, and ends as the record says.
        decided = [s.outcomes.decided for s in live]
        assert decided == sorted(decided) and len(set(decided)) >= 2
        assert last.outcomes.noun == "email" and last.outcomes.scored > 0
        with SessionStore(watched.store, create=False) as st:
            assert snapshot_from_store(st, watched.session_id).outcomes == last.outcomes


def test_a_client_redrives_a_dead_letter_in_the_running_process(watched: Watched) -> None:
    result = watched.redrive
    assert result is not None and result.ok, result
    later = [s for s in watched.first if result.entry_id in {d.entry_id for d in s.dead_letters}]
    assert later[-1].dead_letters[0].redriven
    with SessionStore(watched.store) as store:
        (entry,) = [d for d in store.dead_letters(watched.session_id) if d.entry_id == 1]
        assert entry.entry_id == result.entry_id
        assert entry.redriven and entry.redriven_by == watched.session_id


def test_a_finished_sessions_snapshot_is_the_read_models(watched: Watched) -> None:
    with SessionStore(watched.store) as store:
        sid = watched.session_id
        snap = snapshot_from_store(store, sid)
        assert snap.session_id == sid and snap.status == "completed" and not snap.live
        assert snap.totals.published == store.envelope_counts()[sid]
        hops = readmodel.hop_latency(store, sid)
        assert [(h.kind, h.name, h.count, h.wait_p99_ms, h.handle_p99_ms) for h in snap.hops] == [
            (h.kind, h.name, h.count, h.wait_p99_ms, h.handle_p99_ms) for h in hops
        ]
        letters = readmodel.dead_letters(store, sid)
        assert [
            (d.entry_id, d.subscriber, d.traceback, d.payload, d.redriven)
            for d in snap.dead_letters
        ] == [(d.entry_id, d.subscriber, d.traceback, d.payload, d.redriven) for d in letters]
        assert snap.totals.dlq_size == len(letters)
        points = readmodel.throughput(store, sid, bucket_s=snap.series[0].bucket_s)
        for series in snap.series:
            mine = [p.count for p in points if (p.kind, p.key) == (series.kind, series.key)]
            assert list(series.counts) == mine
        assert [(e.name, e.old, e.new) for e in snap.breaker_events] == [
            (e.name, e.old, e.new) for e in readmodel.breaker_timeline(store, sid)
        ]
        requests = readmodel.requests(store, sid)
        assert [(t.correlation_id, t.outcome, t.hop_count) for t in snap.traces] == [
            (r.correlation_id, r.outcome, r.hops) for r in requests
        ]
        dead = next(t for t in snap.traces if t.outcome == "dead_letter")
        bars = readmodel.waterfall(store, sid, dead.correlation_id)
        hops_of = trace_from_store(store, sid, dead.correlation_id)
        assert [(h.agent, h.start_ms, h.outcome) for h in hops_of] == [
            (b.agent, b.start_ms, b.outcome) for b in bars
        ]


def test_model_usage_grows_live_and_ends_as_the_read_models(
    model_scenario: Callable[..., Path], tmp_path: Path
) -> None:
    """A run against a model server, paced to about two seconds: its feed counts tokens
    and cost while it goes, and its last snapshot's usage is the store's, exactly."""
    store = tmp_path / "sessions.db"
    with ModelServer(classify_reply) as server:
        scenario = model_scenario(tmp_path, server.base_url, count=24, rate=12)
        child = subprocess.Popen(
            [
                *(sys.executable, "-m", "pantheon.cli", "run", str(scenario)),
                *("--store", str(store), "--json"),
            ],
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        try:
            watched = asyncio.run(_watch(store, child))
            out, err = child.communicate(timeout=DEADLINE)
        finally:
            if child.poll() is None:
                child.kill()
                child.communicate()
    assert child.returncode == 0, err
    summary = json.loads(out)
    live = [s.usage for s in watched.first if s.live]
    calls = [u.total.calls for u in live]
    assert calls == sorted(calls) and len(set(calls)) >= 3, calls  # counted as it goes
    assert all(u.calls == () for u in live)  # totals only: the calls are in the store
    assert any(0 < u.total.cost_usd < summary["usage"]["cost_usd"] for u in live)
    last = watched.first[-1]
    assert not last.live
    with SessionStore(store, create=False) as st:
        stored = readmodel.usage(st, watched.session_id, calls=False)
        assert snapshot_from_store(st, watched.session_id).usage == stored
    assert last.usage == stored
    assert last.usage.as_dict() == summary["usage"]


# -- in-process: limits and misuse ------------------------------------------------------------


async def test_a_client_that_never_reads_holds_one_frame_and_slows_nothing(
    tmp_path: Path,
) -> None:
    sock = tmp_path / "feed.sock"
    big = "x" * 20_000  # dead letters carry their payloads: big frames fill a socket fast
    async with Bus(session_id="slow-client") as bus:

        async def fail(env: Envelope) -> None:
            raise ValueError("always")

        bus.on("work", fail, name="worker", retry=Retry(attempts=1))
        feed = LiveFeed(bus, path=sock, interval=0.01)
        await feed.start()
        _, stalled = await asyncio.open_unix_connection(str(sock))  # never reads
        reader = await connect(sock)
        for i in range(300):
            await bus.emit("work", f"{big}{i}")
        await bus.drain(timeout=DEADLINE)
        seen = []
        async with asyncio.timeout(DEADLINE):
            async for snap in reader:
                seen.append(snap.seq)
                if snap.totals.dlq_size == 300:
                    break
        frame = feed._last_frame
        assert frame is not None and len(frame) > 1_000_000  # 200 payloads of 20 kB
        buffered = [c.writer.transport.get_write_buffer_size() for c in feed._clients]
        assert len(buffered) == 2
        # The stalled client's backlog: at most the frame being written plus the newest.
        assert max(buffered) <= 2 * len(frame)
        assert seen == sorted(set(seen))
        await reader.aclose()
        await feed.aclose()  # does not wait on the stalled client beyond its grace
        assert not sock.exists()
        stalled.close()


async def test_redrive_of_an_unknown_entry_says_why(tmp_path: Path) -> None:
    sock = tmp_path / "feed.sock"
    async with Bus(session_id="unknown") as bus, LiveFeed(bus, path=sock) as feed:
        async with await connect(sock) as client:
            result = await client.redrive(12345)
        assert not result.ok and "no dead letter 12345" in result.detail
        assert feed.clients in (0, 1)


async def test_garbage_from_a_client_drops_only_that_client(tmp_path: Path) -> None:
    sock = tmp_path / "feed.sock"
    async with Bus(session_id="garbage") as bus, LiveFeed(bus, path=sock, interval=0.01):
        good = await connect(sock)
        _, bad = await asyncio.open_unix_connection(str(sock))
        bad.write((5).to_bytes(4, "big") + b"\xc1\xc1\xc1\xc1\xc1")  # not msgpack
        await bad.drain()
        await bus.emit("nobody.listens", 1)
        async with asyncio.timeout(DEADLINE):
            snap = await good.next()
            while snap.totals.published < 1:
                snap = await good.next()
        await good.aclose()
        bad.close()


async def test_no_feed_and_bad_paths_fail_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(FeedNotFound, match="no live feed"):
        await connect(tmp_path / "absent.sock")
    # A store too deep for a Unix socket path gets a short one of its own, the same each time.
    deep = tmp_path / ("d" * 120) / "sessions.db"
    short = socket_path(deep, "s")
    assert len(os.fsencode(short)) <= 107 and short.name == "s.sock"
    assert short == socket_path(deep, "s") != socket_path(tmp_path / ("e" * 120) / "x.db", "s")
    (tmp_path / ("t" * 100)).mkdir()  # tempfile skips a TMPDIR that does not exist
    monkeypatch.setenv("TMPDIR", str(tmp_path / ("t" * 100)))
    tempfile.tempdir = None  # forget the cached one
    try:
        with pytest.raises(ValueError, match="set TMPDIR to a short path"):
            socket_path(deep, "s")
    finally:
        tempfile.tempdir = None
    (tmp_path / "file.sock").write_text("not a socket")
    async with Bus() as bus:
        feed = LiveFeed(bus, path=tmp_path / "file.sock")
        with pytest.raises(pantheon.live.LiveError, match="not a socket"):
            await feed.start()
        await feed.aclose()


def test_all_is_exactly_the_public_names() -> None:
    public = {
        name
        for name, value in vars(pantheon.live).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert set(pantheon.live.__all__) == public


async def test_a_detaching_recorder_leaves_a_feed_attached_after_it(tmp_path: Path) -> None:
    """Observers detach one by one: a recorder finishing before the feed used to put back
    the delivery slot it had found (empty), unhooking the feed's traces for good."""
    from pantheon.sessions import Recorder

    with SessionStore(tmp_path / "sessions.db") as store:
        recorder = Recorder(store)
        async with Bus() as bus:
            recorder.attach(bus)
            feed = LiveFeed(bus, interval=0.01)
            await feed.start()

            @bus.on("job", name="worker")
            async def work(env: Envelope) -> None:
                if env.payload == "bad":
                    raise ValueError("bad job")

            await bus.emit("job", "before")
            await bus.drain()
            await recorder.finish()
            assert not recorder.attached
            await bus.emit("job", "after")
            await bus.emit("job", "bad")
            await bus.drain()
            snap = feed.snapshot()
            await feed.aclose()
        # The recorder saw only what happened while it was attached.
        assert [e.payload for e in store.envelopes(recorder.session_id)] == ["before"]
    hops = [h for t in snap.traces for h in t.hops]
    assert sorted(h.outcome for h in hops) == ["delivered", "delivered", "failed"]
    assert [(d.error_type, d.error) for d in snap.dead_letters] == [("ValueError", "bad job")]
