"""Each role's behaviour on a real bus, one agent or a small chain at a time."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from support import (
    ACTION_FOR_INTENT,
    INTENTS,
    classify,
    email_problem,
    extract_features,
    scrub,
)

from agents import (
    Actor,
    Agent,
    AgentOptions,
    Fault,
    Guardian,
    InjectedFault,
    InputItem,
    Learner,
    Memory,
    Monitor,
    Observer,
    Outbox,
    Planner,
    Reasoner,
    RuleProvider,
    Sensor,
)
from bus import BreakerPolicy, Bus, Retry
from bus.testing import capture_events
from pantheon.testing import read_jsonl

ROOT = Path(__file__).resolve().parents[2]

RULES = {
    "refund": [r"(?i)\brefund"],
    "spam": [r"(?i)\bwinner\b|\blottery\b"],
    "outage": [r"(?i)\bdown\b|\boutage\b"],
    "complaint": [r"(?i)\bterrible\b|\bangry\b"],
    "bug": [r"(?i)\bcrash|\berror\b"],
    "question": [r"(?i)\bhow\b"],
}
#: The support desk's logic, as its scenarios give it to the built-in roles.
REASONER = {"question": classify, "actions": ACTION_FOR_INTENT}


def plan(**over: Any) -> dict[str, Any]:
    base = {
        "email_id": "e1",
        "sender": "a@b.example",
        "intent": "question",
        "confidence": 0.9,
        "action": "reply",
        "amount": None,
        "steps": [{"tool": "reply", "to": "a@b.example", "text": "Thanks."}],
        "pii": [],
    }
    return base | over


# -- Sensor ------------------------------------------------------------------------------------


async def test_sensor_publishes_what_its_team_s_extract_finds() -> None:
    def words(payload: dict[str, Any]) -> dict[str, Any]:
        return {"words": len(payload["body"].split())}

    async with Bus() as bus:
        await Sensor("counting", settings={"extract": words}).attach(bus)
        await Sensor("plain").attach(bus)
        with capture_events(bus, "sensor.email.enriched") as enriched:
            await bus.emit("observation.email.received", {"body": "two words"})
            await bus.drain()
    by_source = {e.source: e.payload for e in enriched}
    assert by_source == {
        "counting": {"email": {"body": "two words"}, "features": {"words": 2}},
        "plain": {"email": {"body": "two words"}, "features": {}},  # no extract: no features
    }


async def test_sensor_takes_its_extract_by_import_path() -> None:
    sensor = Sensor(settings={"extract": "support.emails:extract_features"})
    assert sensor.settings.extract is extract_features


# -- Guardian ----------------------------------------------------------------------------------


def test_guardian_redacts_pii_from_replies() -> None:
    g = Guardian(settings={"refund_limit": 200, "min_confidence": 0.6, "pii": scrub})
    d = g.decide(
        plan(steps=[{"tool": "reply", "to": "x", "text": "You wrote: card 4111111111111111"}])
    )
    assert d["verdict"] == "modified"
    assert "4111" not in d["steps"][0]["text"]
    assert "[REDACTED card]" in d["steps"][0]["text"]
    assert any("redacted card" in r for r in d["reasons"])


def test_guardian_without_a_pii_function_sends_replies_as_planned() -> None:
    text = "You wrote: card 4111111111111111"
    d = Guardian().decide(plan(steps=[{"tool": "reply", "to": "x", "text": text}]))
    assert (d["verdict"], d["steps"][0]["text"]) == ("approved", text)
    assert d["reasons"] == ["within policy"]


def test_guardian_sends_big_refunds_to_a_human_with_the_reason() -> None:
    g = Guardian(settings={"refund_limit": 200, "min_confidence": 0.6})
    d = g.decide(plan(intent="refund", amount=349.99))
    assert (d["verdict"], d["action"]) == ("escalated", "escalate")
    assert d["steps"] == [{"tool": "escalate", "queue": "humans", "why": d["reasons"][0]}]
    assert "349.99 over limit 200.00" in d["reasons"][0]
    small = g.decide(plan(intent="refund", amount=120.0))
    assert (small["verdict"], small["action"]) == ("approved", "reply")


def test_guardian_escalates_low_confidence_and_ignores_spam() -> None:
    g = Guardian(settings={"min_confidence": 0.6})
    assert g.decide(plan(confidence=0.3))["action"] == "escalate"
    spam = g.decide(plan(intent="spam", action="ignore", steps=[]))
    assert (spam["verdict"], spam["action"], spam["steps"]) == ("approved", "ignore", [])
    assert g.decisions == {"escalated": 1, "approved": 1}


# -- Memory ------------------------------------------------------------------------------------


async def test_memory_answers_lookups_with_history() -> None:
    async with Bus() as bus:
        memory = Memory(settings={"history": 3})
        await memory.attach(bus)
        for i, intent in enumerate(["complaint", "question", "complaint", "bug"]):
            await bus.emit(
                "action.executed",
                {"email_id": f"e{i}", "sender": "a@b.example", "intent": intent, "action": "x"},
            )
        await bus.drain()
        answer = await bus.request("memory.lookup", {"sender": "a@b.example"}, timeout=1)
        assert answer["count"] == 3  # bounded history: the oldest was forgotten
        assert [h["email_id"] for h in answer["recent"]] == ["e1", "e2", "e3"]
        assert answer["complaints"] == 1
        empty = await bus.request("memory.lookup", {"sender": "new@b.example"}, timeout=1)
        assert empty["count"] == 0


# -- Learner -----------------------------------------------------------------------------------


async def test_learner_raises_a_threshold_after_a_run_of_wrong_outcomes() -> None:
    labels = {f"e{i}": {"intent": "question", "action": "reply"} for i in range(10)}
    async with Bus() as bus:
        learner = Learner(settings={"window": 4, "step": 0.1, "threshold": 0.4}, labels=labels)
        await learner.attach(bus)
        reasoner = Reasoner(
            provider=RuleProvider(RULES, intents=INTENTS), settings={**REASONER, "threshold": 0.4}
        )
        await reasoner.attach(bus)
        with capture_events(bus, "learner.>") as updates:
            for i in range(4):
                await bus.emit(
                    "action.executed",
                    {"email_id": f"e{i}", "sender": "s", "intent": "bug", "action": "ticket"},
                )
            await bus.drain()
        assert [u.payload for u in updates] == [
            {"intent": "bug", "old": 0.4, "new": 0.5, "reason": "4 wrong bug calls"}
        ]
        assert reasoner.thresholds["bug"] == 0.5  # the Reasoner took the update
        assert learner.report()["intent_accuracy"] == 0.0


def test_learner_reports_the_thresholds_of_the_intents_it_tunes() -> None:
    labels = {"e1": {"intent": "bug", "action": "ticket"}}
    learner = Learner(settings={"intents": INTENTS, "threshold": 0.3}, labels=labels)
    learner.observe("action.executed", {"email_id": "e1", "intent": "bug", "action": "ticket"})
    assert learner.report()["thresholds"] == dict.fromkeys(INTENTS, 0.3)
    assert Learner().thresholds == {}  # no team's intents: nothing to tune until one moves


async def test_learner_lowers_a_threshold_after_needless_escalations() -> None:
    labels = {f"e{i}": {"intent": "bug", "action": "ticket"} for i in range(3)}
    learner = Learner(settings={"window": 3, "step": 0.1, "threshold": 0.4}, labels=labels)
    updates = []
    for i in range(3):
        out = {"email_id": f"e{i}", "sender": "s", "intent": "bug", "action": "escalate"}
        updates += learner.observe("action.executed", out)
    assert updates == [
        {"intent": "bug", "old": 0.4, "new": 0.3, "reason": "3 needless escalations"}
    ]


# -- The chain ---------------------------------------------------------------------------------


async def inbox_items(path: Path) -> AsyncIterator[InputItem]:
    """The support inbox as a scenario's input would read it: emails, and rejects."""
    for line, record, problem in read_jsonl(path):
        reason = problem if record is None else email_problem(record)
        if record is not None and reason is None:
            yield InputItem("observation.email.received", record, key=record["id"])
        else:
            key = None if record is None else record.get("id")
            payload = {"line": line, "reason": reason, "key": key}
            yield InputItem("observation.email.malformed", payload, malformed=True)


async def test_pipeline_from_inbox_to_outbox(tmp_path: Path) -> None:
    inbox = tmp_path / "inbox.jsonl"
    records = [
        {
            "id": "e1",
            "from": "a@x.example",
            "subject": "Refund please",
            "body": "Refund $50 for ORD-1234",
        },
        {"id": "e2", "from": "b@x.example", "subject": "You are a winner", "body": "lottery!"},
        {"id": "e3", "from": "c@x.example", "subject": "Site down", "body": "outage since 9am"},
    ]
    inbox.write_text("\n".join(json.dumps(r) for r in records) + "\nnot json\n")
    outbox = Outbox(tmp_path / "outbox.jsonl")
    async with Bus() as bus:
        team = [
            Observer(source=inbox_items(inbox)),
            Sensor(settings={"extract": extract_features}),
            Memory(),
            Reasoner(provider=RuleProvider(RULES, intents=INTENTS), settings=REASONER),
            Planner(),
            Guardian(settings={"min_confidence": 0.6, "pii": scrub}),
            Actor(outbox=outbox),
        ]
        for agent in team:
            await agent.attach(bus)
        with (
            capture_events(bus, "action.executed") as done,
            capture_events(bus, "observation.email.malformed") as bad,
        ):
            await team[0].start()
            await team[0].done.wait()
            await bus.drain()
    actions = {e.payload["email_id"]: e.payload["action"] for e in done}
    assert actions == {"e1": "reply", "e2": "ignore", "e3": "escalate"}
    assert [e.payload["reason"] for e in bad] == ["not JSON: Expecting value"]
    lines = [json.loads(x) for x in (tmp_path / "outbox.jsonl").read_text().splitlines()]
    assert [(x["email_id"], x["tool"]) for x in lines] == [("e1", "reply"), ("e3", "escalate")]
    # Lineage: every action traces back to the Observer's outside input.
    assert all(e.hops == 5 and e.source == "actor" for e in done)


async def test_actor_retries_a_flaky_tool_and_dead_letters_when_exhausted(tmp_path: Path) -> None:
    outbox = Outbox(tmp_path / "o.jsonl")
    async with Bus() as bus:
        actor = Actor(
            outbox=outbox,
            fault=Fault(failure_rate=1.0, tool="reply"),
            options=AgentOptions(
                retry=Retry(attempts=3),
                breaker=BreakerPolicy(consecutive_failures=50, min_calls=50),
            ),
        )
        await actor.attach(bus)
        decision = Guardian().decide(plan())
        await bus.emit("guardian.decision", decision)
        await bus.drain()
        [entry] = bus.dlq.entries()
        assert entry.subscriber == "actor" and entry.attempts == 3
        assert entry.error_type == "InjectedFault"
        assert "injected failure" in (entry.traceback or "")
    assert not (tmp_path / "o.jsonl").exists()


async def test_monitor_raises_a_critical_alert_when_a_breaker_opens() -> None:
    async with Bus() as bus:
        monitor = Monitor(sample=False)
        await monitor.attach(bus)

        async def broken(env: Any) -> None:
            raise RuntimeError("down")

        bus.on("work", broken, name="worker", breaker=BreakerPolicy(consecutive_failures=2))
        with capture_events(bus, "monitor.alert.*") as alerts:
            for _ in range(2):
                await bus.emit("work", {})
            await bus.drain()
        assert [a.topic for a in alerts] == ["monitor.alert.breaker_open"]
        assert alerts[0].priority == 0
        assert alerts[0].payload["breaker"] == "worker"


async def test_monitor_sampling_alerts_on_dead_letters() -> None:
    async with Bus() as bus:
        monitor = Monitor(sample=False)
        await monitor.attach(bus)

        async def broken(env: Any) -> None:
            raise RuntimeError("no")

        bus.on("work", broken, name="worker")
        await bus.emit("work", {})
        await bus.drain()
        with capture_events(bus, "monitor.alert.*") as alerts:
            await monitor.check()
            await monitor.check()  # no new dead letters: no second alert
            await bus.drain()
        assert [a.payload["kind"] for a in alerts] == ["dead_letters"]


async def test_monitor_counts_the_dead_letters_of_the_teams_other_processes() -> None:
    """A Monitor of a multi-process run is told what the other processes hold
    (``dead_letters_elsewhere``, set by the process hosting it): it alerts on them as on
    its own bus's, and each alert counts the team's."""
    elsewhere = 0
    async with Bus() as bus:
        monitor = Monitor(sample=False)
        monitor.dead_letters_elsewhere = lambda: elsewhere
        await monitor.attach(bus)
        with capture_events(bus, "monitor.alert.*") as alerts:
            await monitor.check()  # nothing anywhere yet
            elsewhere = 3
            await monitor.check()
            await monitor.check()  # nothing new
            await bus.drain()
        assert [(a.payload["kind"], a.payload["dlq_size"]) for a in alerts] == [("dead_letters", 3)]


@pytest.mark.parametrize(
    ("subject", "body", "intent"),
    [
        ("Refund", "I want a refund", "refund"),
        ("hello", "you are a lottery winner", "spam"),
        ("", "nothing matches here", "question"),
    ],
)
async def test_rule_provider_classifies(subject: str, body: str, intent: str) -> None:
    verdict = await classify(RuleProvider(RULES, intents=INTENTS), subject, body)
    assert verdict["intent"] == intent
    assert 0 < verdict["confidence"] <= 1


async def test_a_long_fault_run_keeps_the_draw_counts_bounded() -> None:
    # Issue #14 item 11: one count per fault key (one per message) used to be kept for ever.
    fault = Fault(failure_rate=0.5)

    async def draws(agent: Agent, keys: list[str]) -> list[bool]:
        failed = []
        for key in keys:
            try:
                await agent.inject(fault, key)
            except InjectedFault:
                failed.append(True)
            else:
                failed.append(False)
        return failed

    agent = Agent("a", seed=7)
    run = [f"email/{i}" for i in range(3 * Agent.fault_draw_keys)]
    await draws(agent, run)
    assert len(agent._draws) == Agent.fault_draw_keys
    # A retry of a recent message still gets its next draw, the same for the same seed.
    retries = [run[-1], run[-1], run[-2]]
    again = Agent("a", seed=7)
    await draws(again, run)
    assert await draws(agent, retries) == await draws(again, retries)
    assert agent._draws[run[-1]] == 3 and agent._draws[run[-2]] == 2
    assert len(agent._draws) == Agent.fault_draw_keys
