"""The read model over a real recorded store: every number checked against what was run.

The team is plain bus handlers with a known shape (six emails; the actor fails on emails 1
and 2, its breaker opens after those two failures, emails 3-5 are dead-lettered unopened),
so each expected value below is derived from that shape, not from the read model itself.
"""

from __future__ import annotations

import asyncio
import math
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml

from agents import Agent, OpenAIProvider
from bus import BreakerPolicy, Bus, Envelope
from pantheon import readmodel as rm
from pantheon.sessions import Recorder, SessionNotFound, SessionStore, diff_sessions
from pantheon.testing import ModelServer, classify_reply

EMAILS = 6
FAILING = {1, 2}  # the actor raises on these; two in a row open its breaker
OPENED_AFTER = 2


def _email(n: int) -> dict[str, object]:
    return {"id": f"e{n:03d}", "subject": f"subject {n}", "text": f"hello {n}"}


async def _setup(bus: Bus, gate: tuple[asyncio.Event, asyncio.Event] | None = None) -> None:
    """``gate``: (entered, release): the actor signals it holds a message, then waits."""

    @bus.on("email.received", name="classifier")
    async def classify(env: Envelope) -> None:
        await bus.emit("email.classified", {"n": int(env.payload["id"][1:])})

    @bus.on(
        "email.classified",
        name="actor",
        breaker=BreakerPolicy(consecutive_failures=2, cooldown=3600.0),
    )
    async def act(env: Envelope) -> None:
        n = env.payload["n"]
        if gate is not None:
            gate[0].set()
            await gate[1].wait()
        if n in FAILING:
            raise ValueError(f"cannot act on {n}")
        await bus.emit(
            "guardian.decision",
            {
                "email_id": f"e{n:03d}",
                "verdict": "escalated" if n == 0 else "approved",
                "action": "escalate" if n == 0 else "reply",
                "reasons": ["refund over limit", "second reason"] if n == 0 else [],
                "intent": "refund",
                "confidence": 0.5,
            },
        )

    @bus.on("guardian.decision", name="sink")
    async def sink(env: Envelope) -> None:
        return None


SUMMARY = {
    "passed": False,
    "accuracy": {"action_accuracy": 0.75, "scored": 4},
    "expectations": [
        {"name": "dead letters <= 1", "passed": False, "expected": 1, "actual": 5},
        {"name": "zero lost", "passed": True, "expected": True, "actual": True},
    ],
}


async def _record(path: Path) -> str:
    with SessionStore(path) as store:
        recorder = Recorder(store, scenario="readmodel", scenario_text="x", seed=1)
        async with Bus(session_id=recorder.session_id) as bus:
            recorder.attach(bus)
            await _setup(bus)
            for n in range(EMAILS):
                await bus.emit("email.received", _email(n))
            await bus.drain()
        await recorder.finish("failed", SUMMARY)
        return recorder.session_id


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[SessionStore, str]]:
    path = tmp_path_factory.mktemp("readmodel") / "sessions.db"
    sid = asyncio.run(_record(path))
    with SessionStore(path, create=False) as store:
        yield store, sid


def test_session_rows(recorded: tuple[SessionStore, str]) -> None:
    store, sid = recorded
    (row,) = rm.session_rows(store)
    info = store.session(sid)
    # 6 inputs, 6 classified, 1 decision (only email 0 gets through the actor), and the
    # breaker's own system.breaker.actor event.
    assert row == rm.SessionRow(
        id=sid,
        kind="run",
        status="failed",
        scenario="readmodel",
        started=info.started,
        duration_s=info.duration,
        messages=EMAILS * 2 + 2,
        dead_letters=EMAILS - 1,
        failed_expectations=("dead letters <= 1",),
        passed=False,
        replay_of=None,
        note=None,
    )
    assert row.duration_s is not None and row.duration_s > 0
    assert rm.session_row(store, sid[:-2]) == row


def test_unknown_session_is_a_clear_error(recorded: tuple[SessionStore, str]) -> None:
    store, _ = recorded
    with pytest.raises(SessionNotFound, match="nope"):
        rm.hop_latency(store, "nope")


def test_dead_letters_carry_payload_traceback_and_request(
    recorded: tuple[SessionStore, str],
) -> None:
    store, sid = recorded
    letters = rm.dead_letters(store, sid)
    assert [d.payload for d in letters] == [{"n": n} for n in range(1, EMAILS)]
    assert [d.reason for d in letters] == ["failed"] * 2 + ["circuit_open"] * 3
    failed = letters[0]
    assert failed.subscriber == "actor" and failed.topic == "email.classified"
    assert failed.error_type == "ValueError" and failed.error == "cannot act on 1"
    assert failed.traceback is not None and "cannot act on 1" in failed.traceback
    assert not failed.redriven and failed.attempts == 1
    envelopes = {e.id: e for e in store.envelopes(sid)}
    first = min(e.wall for e in envelopes.values())
    for d in letters:
        assert d.correlation_id == envelopes[d.envelope_id].correlation_id
        assert 0 <= d.t_s < 60
        assert math.isclose(d.t_s + first, store.dead_letters(sid)[d.entry_id - 1].time)


def test_breaker_timeline(recorded: tuple[SessionStore, str]) -> None:
    store, sid = recorded
    (event,) = rm.breaker_timeline(store, sid)
    assert (event.name, event.old, event.new) == ("actor", "closed", "open")
    letters = rm.dead_letters(store, sid)
    # It opened on the second failure: after the first one, before the first letter it refused.
    assert letters[0].t_s <= event.t_s <= letters[OPENED_AFTER].t_s
    assert letters[OPENED_AFTER].reason == "circuit_open"


def test_hop_latency_is_exact_and_matches_the_diff(recorded: tuple[SessionStore, str]) -> None:
    store, sid = recorded
    hops = {(h.kind, h.name): h for h in rm.hop_latency(store, sid)}
    assert set(hops) == {
        ("agent", "classifier"),
        ("agent", "actor"),
        ("agent", "sink"),
        ("edge", "<outside> -> classifier"),
        ("edge", "classifier -> actor"),
        ("edge", "actor -> sink"),
    }
    assert hops[("agent", "classifier")].count == EMAILS
    assert hops[("agent", "actor")].count == EMAILS
    assert hops[("agent", "sink")].count == 1
    waits = sorted(d.queue_wait_ns for d in store.deliveries(sid) if d.subscriber == "classifier")
    # Nearest rank over 6 values: p50 is the 3rd, p95 and p99 the 6th.
    h = hops[("agent", "classifier")]
    assert (h.wait_p50_ms, h.wait_p95_ms, h.wait_p99_ms) == (
        waits[2] / 1e6,
        waits[5] / 1e6,
        waits[5] / 1e6,
    )
    # The sessions diff computes its percentiles independently: same definition, same values.
    diff = diff_sessions(store, sid, sid)
    for d in diff.latency:
        mine = hops[("agent" if d.scope == "subscriber" else "edge", d.name)]
        p50, p99 = (
            (mine.wait_p50_ms, mine.wait_p99_ms)
            if d.metric == "queue_wait"
            else (mine.handle_p50_ms, mine.handle_p99_ms)
        )
        assert math.isclose(p50 * 1000, d.a.p50_us) and math.isclose(p99 * 1000, d.a.p99_us)


def test_throughput_counts_every_message_once(recorded: tuple[SessionStore, str]) -> None:
    store, sid = recorded
    points = rm.throughput(store, sid, bucket_s=0.01)
    by_topic: dict[str, int] = {}
    by_agent: dict[str, int] = {}
    for p in points:
        assert p.rate == pytest.approx(p.count / 0.01)
        target = by_topic if p.kind == "topic" else by_agent
        target[p.key] = target.get(p.key, 0) + p.count
    assert by_topic == {
        "email.received": 6,
        "email.classified": 6,
        "guardian.decision": 1,
        "system.breaker.actor": 1,
    }
    assert by_agent == {"classifier": 6, "actor": 6, "sink": 1}
    # Every series covers the same buckets (zeros included) starting at the first envelope.
    times = {(p.kind, p.key): [] for p in points}
    for p in points:
        times[(p.kind, p.key)].append(p.t_s)
    series = list(times.values())
    assert all(s == series[0] for s in series) and series[0][0] == 0.0
    with pytest.raises(ValueError, match="bucket_s"):
        rm.throughput(store, sid, bucket_s=0)


def test_outcomes(recorded: tuple[SessionStore, str]) -> None:
    store, sid = recorded
    out = rm.outcomes(store, sid)
    assert out.accuracy == SUMMARY["accuracy"]
    assert out.expectations == tuple(SUMMARY["expectations"])  # type: ignore[arg-type]
    assert out.decisions == {"escalated": 1}
    (g,) = out.guardian
    assert (g.item, g.verdict, g.action) == ("e000", "escalated", "escalate")
    assert g.reasons == ("refund over limit", "second reason")
    assert (g.intent, g.confidence) == ("refund", 0.5)


def test_requests_and_waterfall(recorded: tuple[SessionStore, str]) -> None:
    store, sid = recorded
    rows = rm.requests(store, sid)
    assert [r.label for r in rows] == [f"e{n:03d}: subject {n}" for n in range(EMAILS)]
    assert [r.outcome for r in rows] == ["ok"] + ["dead_letter"] * (EMAILS - 1)
    assert [r.hops for r in rows] == [3] + [2] * (EMAILS - 1)
    assert rows[0].start_ms == 0.0
    assert all(r.topic == "email.received" for r in rows)
    assert rm.requests(store, sid, limit=2) == rows[:2]

    ok = rm.waterfall(store, sid, rows[0].correlation_id)
    assert [(b.agent, b.topic, b.depth) for b in ok] == [
        ("classifier", "email.received", 0),
        ("actor", "email.classified", 1),
        ("sink", "guardian.decision", 2),
    ]
    for bar, parent in zip(ok[1:], ok, strict=False):
        assert bar.causation_id == parent.envelope_id
        assert bar.enqueued_ms >= parent.start_ms  # published while the parent was handled
    for bar in ok:
        assert bar.enqueued_ms <= bar.start_ms <= bar.end_ms
        assert math.isclose(bar.queue_wait_ms, bar.start_ms - bar.enqueued_ms, abs_tol=1e-6)
        assert math.isclose(bar.handling_ms, bar.end_ms - bar.start_ms, abs_tol=1e-6)
        assert bar.outcome == "delivered" and bar.error is None
    total = rows[0].total_ms
    assert math.isclose(total, ok[-1].end_ms - rows[0].start_ms, abs_tol=1e-6)

    failed = rm.waterfall(store, sid, rows[1].correlation_id)
    assert [(b.agent, b.outcome, b.error) for b in failed] == [
        ("classifier", "delivered", None),
        ("actor", "failed", "ValueError: cannot act on 1"),
    ]
    with pytest.raises(LookupError, match=sid):
        rm.waterfall(store, sid, 12345)


async def test_live_session_reads_pending_requests(tmp_path: Path) -> None:
    """A running session is read through the journal: the held request is pending."""
    entered, release = asyncio.Event(), asyncio.Event()
    with SessionStore(tmp_path / "live.db") as store:
        recorder = Recorder(store, scenario="live")
        async with Bus(session_id=recorder.session_id) as bus:
            recorder.attach(bus)
            await _setup(bus, (entered, release))
            await bus.emit("email.received", _email(0))
            await asyncio.wait_for(entered.wait(), timeout=10)
            recorder.snapshot()  # the subscriptions' patterns: what "pending" waits for
            await recorder.flush()
            (row,) = rm.session_rows(store)
            assert (row.status, row.duration_s, row.passed, row.messages) == (
                "running",
                None,
                None,
                2,
            )
            (req,) = rm.requests(store, recorder.session_id)
            assert (req.outcome, req.hops) == ("pending", 1)
            release.set()
            await bus.drain()
        await recorder.finish("completed", {"passed": True})
        assert rm.requests(store, recorder.session_id)[0].outcome == "ok"
        (row,) = rm.session_rows(store)
        assert (row.status, row.passed, row.messages) == ("completed", True, 3)


def test_replay_rows_report_the_match(tmp_path: Path) -> None:
    with SessionStore(tmp_path / "r.db") as other:
        rid = other.begin_session(kind="replay", replay_of="orig", scenario="s")
        other.end_session(
            rid, "completed", {"replay": {"matched": False, "divergence": {"message": "at hop 3"}}}
        )
        (row,) = rm.session_rows(other)
        assert (row.kind, row.passed, row.note, row.replay_of) == (
            "replay",
            False,
            "at hop 3",
            "orig",
        )


# -- model usage --------------------------------------------------------------------------------


def test_usage_is_exactly_the_run_summarys(model_session: Any) -> None:
    """Per agent and in total, to the last bit of the cost; per call, each call's own."""
    price = model_session.prices[model_session.model]
    with SessionStore(model_session.store, create=False) as store:
        sid = model_session.session_id
        usage = rm.usage(store, sid)
        row = rm.session_row(store, sid)
        effects = store.effects(sid)
    assert usage.as_dict() == model_session.summary["usage"]
    assert row.usage == usage.total
    assert (
        usage.total.calls
        == len(usage.calls)
        == len([e for e in effects if e.name == "model.openai.chat"])
    )
    assert {c.agent for c in usage.calls} == {"reasoner", "summarizer"}
    for agent, part in usage.by_agent.items():
        mine = [c for c in usage.calls if c.agent == agent]
        assert part.calls == len(mine)
        assert part.input_tokens == sum(c.input_tokens for c in mine)
        assert part.output_tokens == sum(c.output_tokens for c in mine)
        assert math.isclose(part.cost_usd, math.fsum(c.cost_usd or 0.0 for c in mine))
    for c in usage.calls:
        assert c.model == model_session.model and c.effect == "model.openai.chat"
        assert (
            c.cost_usd
            == (c.input_tokens * price["input"] + c.output_tokens * price["output"]) / 1e6
        )
        assert c.latency_ms > 0 and c.start_ms >= 0 and c.input_tokens > 0
    assert [c.seq for c in usage.calls] == sorted(c.seq for c in usage.calls)
    # The list without its calls (what the sessions list reads) has the same totals.
    with SessionStore(model_session.store, create=False) as store:
        assert rm.usage(store, sid, calls=False) == rm.SessionUsage.of(usage.by_agent)


async def test_a_replay_reports_the_originals_usage(model_session: Any, tmp_path: Path) -> None:
    """A replay serves the recorded results: the same tokens and cost, no latency."""
    import pantheon

    copy = tmp_path / "sessions.db"
    src, dst = sqlite3.connect(model_session.store), sqlite3.connect(copy)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    report = await pantheon.replay(model_session.session_id, store=copy)
    assert report.matched, report.divergence
    with SessionStore(copy, create=False) as store:
        original = rm.usage(store, model_session.session_id)
        replay = rm.usage(store, report.new_session_id)
    assert replay.as_dict() == original.as_dict()
    assert sorted((c.agent, c.input_tokens, c.output_tokens) for c in replay.calls) == sorted(
        (c.agent, c.input_tokens, c.output_tokens) for c in original.calls
    )
    assert all(c.latency_ms == 0 for c in replay.calls)


MODEL = "local"
PRICES = {MODEL: {"input": 2.5, "output": 10.0}}


class _Asker(Agent):
    subscriptions = ("question.asked",)

    async def handle(self, env: Envelope) -> None:
        await self.chat([{"role": "user", "content": env.payload["text"]}])


def _scenario_text(prices: dict[str, Any] | None) -> str:
    data: dict[str, Any] = {"provider": {"kind": "openai", "model": MODEL}}
    if prices is not None:
        data["prices"] = prices
    return yaml.safe_dump(data)


async def test_usage_of_a_running_session_counts_the_calls_so_far(tmp_path: Path) -> None:
    """Read while the run goes; the server answers a dated model name, priced by the name
    asked for, as the agent prices it; a call made outside a handler is ``<outside>``."""
    price = (PRICES[MODEL]["input"], PRICES[MODEL]["output"])
    with (
        ModelServer(classify_reply, model=f"{MODEL}-2024-07-18") as server,
        SessionStore(tmp_path / "sessions.db") as store,
    ):
        recorder = Recorder(store, scenario="ask", scenario_text=_scenario_text(PRICES))
        provider = OpenAIProvider(server.base_url, MODEL, max_retries=0)
        asker = _Asker("asker", provider=provider, prices={MODEL: price})
        async with Bus(session_id=recorder.session_id) as bus:
            recorder.attach(bus)
            await asker.attach(bus)
            for text in ("one two three", "four five"):
                await bus.emit("question.asked", {"text": text})
            await bus.drain()
            await recorder.flush()
            running = rm.usage(store, recorder.session_id)
            assert store.session(recorder.session_id).status == "running"
            assert running.by_agent == {"asker": asker.usage}
            assert running.total == asker.usage and running.total.priced
            assert [c.model for c in running.calls] == [f"{MODEL}-2024-07-18"] * 2
            assert [c.input_tokens for c in running.calls] == [3, 2]

            await asker.chat([{"role": "user", "content": "outside any handler"}])
            await recorder.flush()
            later = rm.usage(store, recorder.session_id)
            assert later.by_agent["<outside>"].calls == 1 and later.by_agent["asker"].calls == 2
            assert later.total == asker.usage  # the agent counts all three as its own
        await recorder.finish("completed", {})

        # The same calls with no price table: tokens counted, cost 0, not priced.
        bare = Recorder(store, scenario="ask", scenario_text=_scenario_text(None))
        unpriced = _Asker("asker", provider=provider, prices={})
        async with Bus(session_id=bare.session_id) as bus:
            bare.attach(bus)
            await unpriced.attach(bus)
            await bus.emit("question.asked", {"text": "six"})
            await bus.drain()
        await bare.finish("completed", {})
        await provider.aclose()
        alone = rm.usage(store, bare.session_id)
    assert alone.total == unpriced.usage
    assert (alone.total.calls, alone.total.cost_usd, alone.total.priced) == (1, 0.0, False)
    assert alone.calls[0].cost_usd is None


def test_prices_are_read_as_plain_yaml_and_bad_ones_left_out() -> None:
    text = """
provider: {kind: openai, model: m}
prices:
  m: {input: 1, output: 2}
  half: {input: 1}
  words: {input: a, output: b}
  listed: [1, 2]
agents: {triage: {class: "not_importable_anywhere:Triage"}}
"""
    assert rm._pricing(text) == ({"m": (1.0, 2.0)}, "m")
    assert rm._pricing("[unclosed") == ({}, "")
    assert rm._pricing(None) == ({}, "")
    assert rm._pricing("provider: {kind: rules}") == ({}, "")
    custom = "provider: {kind: custom, class: 'x:Y', settings: {model: big}}"
    assert rm._pricing(custom) == ({}, "big")


def test_pending_reads_recorded_patterns_as_tokens_and_skips_old_globs() -> None:
    """A session recorded before token topics may hold ``email*``, which today's bus refuses:
    it awaits nothing (and does not break the read), while ``email.>`` awaits by token rules."""
    snapshot = SimpleNamespace(
        stats={
            "subscribers": {
                "old": {"pattern": "email*"},
                "new": {"pattern": "email.>"},
                "one": {"pattern": "audit.*"},
                "odd": {"pattern": 3},
            }
        }
    )
    store = SimpleNamespace(metrics=lambda sid: [snapshot])
    topics = ["email.received", "emailx", "email", "audit.a", "audit.a.b"]
    envelopes = [SimpleNamespace(id=i, topic=t) for i, t in enumerate(topics)]
    awaited = rm._awaited_topics(store, "s", envelopes, set())  # type: ignore[arg-type]
    assert awaited == {"email.received", "audit.a"}


def test_a_redrive_outcome_counts_the_entries_that_failed_downstream() -> None:
    """As ``pantheon dlq redrive`` says it: an entry whose redelivery went through and whose
    consequences were dead-lettered failed again, downstream (the fix is elsewhere)."""
    outcomes = {
        "1": "delivered",
        "2": "failed downstream: #1 payer on invoice.decided: failed: RuntimeError: no",
        "3": "failed: RuntimeError: still broken",
        "4": "skipped: envelope not recorded",
    }
    assert rm.redrive_outcome({"outcomes": outcomes}) == (
        "1 of 4 redriven, 2 failed again (1 downstream), 1 skipped"
    )
    assert rm.redrive_outcome({"outcomes": {"1": "delivered"}}) == "1 of 1 redriven"
