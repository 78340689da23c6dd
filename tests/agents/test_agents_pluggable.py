"""The built-in Guardian and Actor serving another team: a policy and tools by import path,
checked at load, with the support desk's behaviour left as it was."""

from __future__ import annotations

import json
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from agents import Actor, AgentOptions, Guardian, LiveEffects, Outbox
from bus import BreakerPolicy, Bus, Retry
from bus.testing import capture_events
from pantheon import ScenarioError, load_scenario

# Module names are unique per test file: a process imports a module once.
MODULE = '''
CALLS = []


def strict(proposal):
    """Blocks everything that is not a page."""
    if proposal["action"] == "page":
        return {**proposal, "verdict": "approved", "reasons": ["a human decides"]}
    return {**proposal, "verdict": "blocked", "reasons": [f"no {proposal['action']}"], "steps": []}


class Limit:
    def __init__(self, *, most):
        if most < 0:
            raise ValueError("most must be >= 0")
        self.most = most

    def __call__(self, proposal):
        ok = proposal["size"] <= self.most
        verdict = "approved" if ok else "blocked"
        return {**proposal, "verdict": verdict, "reasons": [f"size {proposal['size']}"]}


def no_verdict(proposal):
    return {"reasons": ["forgot the verdict"]}


def restart(step):
    CALLS.append(("restart", step["host"]))
    return {"restarted": step["host"]}


async def page(step):
    CALLS.append(("page", step["who"]))
    return {"paged": step["who"]}


FAILS_LEFT = [1]


def flaky(step):
    CALLS.append(("flaky", step["host"]))
    if FAILS_LEFT[0]:
        FAILS_LEFT[0] -= 1
        raise ConnectionError("orchestrator unavailable")
    return {"ok": True}
'''


@pytest.fixture
def mod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    (tmp_path / "pluggable_roles_mod.py").write_text(MODULE, encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    import pluggable_roles_mod

    pluggable_roles_mod.CALLS.clear()
    pluggable_roles_mod.FAILS_LEFT[:] = [1]
    return pluggable_roles_mod


class RecordingEffects(LiveEffects):
    """Calls every effect for real and notes its name: what a session would record."""

    def __init__(self) -> None:
        super().__init__(0)
        self.names: list[str] = []

    async def effect(self, name: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        self.names.append(name)
        return await super().effect(name, fn, *args, **kwargs)


# -- Guardian ----------------------------------------------------------------------------------


async def test_guardian_publishes_what_its_policy_function_decides(mod: Any) -> None:
    guardian = Guardian(
        settings={"policy": "pluggable_roles_mod:strict"}, subscribe=["decision.proposed"]
    )
    assert guardian.policy is mod.strict
    async with Bus() as bus:
        await guardian.attach(bus)
        with capture_events(bus, "guardian.decision") as out:
            await bus.emit("decision.proposed", {"id": 1, "action": "failover", "steps": [{}]})
            await bus.emit("decision.proposed", {"id": 2, "action": "page", "steps": [{}]})
            await bus.drain()
    by_id = {e.payload["id"]: e.payload for e in out}
    assert by_id[1] == {
        "id": 1,
        "action": "failover",
        "steps": [],
        "verdict": "blocked",
        "reasons": ["no failover"],
    }
    assert by_id[2]["verdict"] == "approved" and by_id[2]["steps"] == [{}]
    assert guardian.decisions == {"blocked": 1, "approved": 1}


def test_a_policy_class_is_built_once_with_its_options(mod: Any) -> None:
    guardian = Guardian(
        settings={"policy": "pluggable_roles_mod:Limit", "policy_options": {"most": 3}}
    )
    assert isinstance(guardian.policy, mod.Limit) and guardian.policy.most == 3
    assert guardian.decide({"size": 3})["verdict"] == "approved"
    blocked = guardian.decide({"size": 4})
    assert (blocked["verdict"], blocked["reasons"]) == ("blocked", ["size 4"])


async def test_a_policy_answer_without_a_verdict_is_a_dead_letter(mod: Any) -> None:
    guardian = Guardian(
        settings={"policy": "pluggable_roles_mod:no_verdict"},
        subscribe=["decision.proposed"],
        options=AgentOptions(breaker=None),
    )
    async with Bus() as bus:
        await guardian.attach(bus)
        await bus.emit("decision.proposed", {"id": 1})
        await bus.drain()
        [entry] = bus.dlq.entries()
    assert entry.error_type == "ValueError"
    assert "needs 'verdict'" in (entry.error or "")
    assert guardian.decisions == {}


def test_without_a_policy_the_support_rules_still_apply() -> None:
    guardian = Guardian(settings={"refund_limit": 100})
    assert guardian.policy is None
    plan = {
        "email_id": "e1",
        "sender": "a@b.example",
        "intent": "refund",
        "confidence": 0.9,
        "action": "reply",
        "amount": 150.0,
        "steps": [],
        "pii": [],
    }
    assert guardian.decide(plan)["verdict"] == "escalated"


BAD_GUARDIANS = {
    "no_module": (
        "      policy: nosuch_policy_mod:check\n",
        "agents.guardian.settings.policy",
        "No module named 'nosuch_policy_mod'",
    ),
    "options_refused": (
        "      policy: pluggable_roles_mod:Limit\n      policy_options: {most: -1}\n",
        "agents.guardian.settings",
        "policy Limit refused policy_options: most must be >= 0",
    ),
    "options_unknown": (
        "      policy: pluggable_roles_mod:Limit\n      policy_options: {mots: 3}\n",
        "agents.guardian.settings",
        "refused policy_options",
    ),
    "function_with_options": (
        "      policy: pluggable_roles_mod:strict\n      policy_options: {most: 3}\n",
        "agents.guardian.settings",
        "is a function, which takes no policy_options",
    ),
    "options_alone": (
        "      policy_options: {most: 3}\n",
        "agents.guardian.settings",
        "policy_options given without a policy",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_GUARDIANS))
def test_a_bad_policy_is_a_located_error_at_load(mod: Any, tmp_path: Path, case: str) -> None:
    body, field, message = BAD_GUARDIANS[case]
    (tmp_path / "in.jsonl").write_text("", encoding="utf-8")
    text = "version: 1\nname: t\ninput:\n  path: in.jsonl\nagents:\n  guardian:\n    settings:\n"
    path = tmp_path / f"{case}.yaml"
    path.write_text(text + body, encoding="utf-8")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    [problem] = info.value.problems
    assert (problem.field, problem.file) == (field, str(path))
    assert message in problem.message


# -- Actor -------------------------------------------------------------------------------------

TOOLS = {"restart": "pluggable_roles_mod:restart", "page": "pluggable_roles_mod:page"}


async def test_actor_calls_registered_tools_as_effects_and_reports_the_outcome(
    mod: Any, tmp_path: Path
) -> None:
    effects = RecordingEffects()
    outbox = Outbox(tmp_path / "outbox.jsonl")
    actor = Actor(
        outbox=outbox,
        effects=effects,
        settings={"tools": TOOLS, "key": "alert_id", "outcome_fields": ["alert_id", "verdict"]},
    )
    decision = {
        "alert_id": "a-1",
        "verdict": "approved",
        "steps": [{"tool": "restart", "host": "api-2"}, {"tool": "page", "who": "oncall"}],
    }
    async with Bus() as bus:
        await actor.attach(bus)
        with capture_events(bus, "action.executed") as done:
            await bus.emit("guardian.decision", decision)
            await bus.emit("guardian.decision", decision)  # delivered twice: runs once
            await bus.drain()
    assert effects.names == ["tool.restart", "tool.page"] * 2
    assert mod.CALLS == [("restart", "api-2"), ("page", "oncall")]
    first, again = (e.payload for e in done)
    assert first == {
        "alert_id": "a-1",
        "verdict": "approved",
        "results": [
            {"tool": "restart", "status": "done", "result": {"restarted": "api-2"}},
            {"tool": "page", "status": "done", "result": {"paged": "oncall"}},
        ],
    }
    assert [r["status"] for r in again["results"]] == ["duplicate", "duplicate"]
    lines = [json.loads(x) for x in (tmp_path / "outbox.jsonl").read_text().splitlines()]
    assert lines == [
        {
            "alert_id": "a-1",
            "step": 0,
            "tool": "restart",
            "host": "api-2",
            "result": {"restarted": "api-2"},
        },
        {
            "alert_id": "a-1",
            "step": 1,
            "tool": "page",
            "who": "oncall",
            "result": {"paged": "oncall"},
        },
    ]
    assert outbox.counts == {"restart": 1, "page": 1}


async def test_a_served_tool_answer_marks_its_step_done_so_a_live_retry_does_not_redo_it(
    mod: Any, tmp_path: Path
) -> None:
    """A resume serves the dead run's answer to step 0, then the handling's retry runs live:
    the retry must find step 0 done, not call the tool (or count it) a second time."""
    outbox = Outbox(tmp_path / "outbox.jsonl")
    actor = Actor(outbox=outbox, settings={"tools": TOOLS, "key": "alert_id"})
    outbox.tally("a-1", 0, {"tool": "restart", "status": "done", "result": {"restarted": "x"}})
    assert outbox.done("a-1", 0)
    again = await actor._call("a-1", 0, {"tool": "restart", "host": "api-2"})
    assert again == {"tool": "restart", "status": "duplicate"}
    outbox.tally("a-1", 0, again)
    assert mod.CALLS == [] and outbox.counts == {"restart": 1}


async def test_a_retried_decision_does_not_redo_a_tool_that_already_worked(mod: Any) -> None:
    actor = Actor(
        settings={
            "tools": {**TOOLS, "flaky": "pluggable_roles_mod:flaky"},
            "key": "alert_id",
            "outcome_fields": ["alert_id"],
        },
        options=AgentOptions(retry=Retry(attempts=2), breaker=None),
    )
    steps = [{"tool": "restart", "host": "api-1"}, {"tool": "flaky", "host": "api-1"}]
    async with Bus() as bus:
        await actor.attach(bus)
        with capture_events(bus, "action.executed") as done:
            await bus.emit("guardian.decision", {"alert_id": "a-9", "steps": steps})
            await bus.drain()
        assert bus.dlq.entries() == []
    # The first attempt restarted, then the flaky tool failed; the retry restarted nothing.
    assert mod.CALLS == [("restart", "api-1"), ("flaky", "api-1"), ("flaky", "api-1")]
    [out] = done
    assert [r["status"] for r in out.payload["results"]] == ["duplicate", "done"]


async def test_an_unknown_tool_is_refused_before_any_tool_runs(mod: Any) -> None:
    actor = Actor(
        settings={"tools": TOOLS, "key": "alert_id"},
        options=AgentOptions(breaker=BreakerPolicy(consecutive_failures=50, min_calls=50)),
    )
    async with Bus() as bus:
        await actor.attach(bus)
        steps = [{"tool": "restart", "host": "x"}, {"tool": "reboot_dc", "host": "x"}]
        await bus.emit("guardian.decision", {"alert_id": "a-1", "steps": steps})
        await bus.drain()
        [entry] = bus.dlq.entries()
    assert "unknown tool 'reboot_dc' in step 1" in (entry.error or "")
    assert mod.CALLS == [("restart", "x")]  # step 0 ran; the bad step stopped the rest


async def test_the_support_actor_reports_exactly_what_it_did_before() -> None:
    actor = Actor()
    decision = {
        "email_id": "e1",
        "sender": "a@b.example",
        "intent": "question",
        "confidence": 0.9,
        "verdict": "approved",
        "action": "reply",
        "reasons": [],
        "steps": [{"tool": "reply", "to": "a@b.example", "text": "Hi"}],
    }
    async with Bus() as bus:
        await actor.attach(bus)
        with capture_events(bus, "action.executed") as done:
            await bus.emit("guardian.decision", decision)
            await bus.drain()
    [out] = done
    assert list(out.payload) == ["email_id", "sender", "intent", "action", "verdict", "results"]
    assert out.payload["results"] == [{"tool": "reply", "status": "done"}]


def test_an_unknown_tool_path_is_a_located_error_at_load(tmp_path: Path) -> None:
    (tmp_path / "in.jsonl").write_text("", encoding="utf-8")
    path = tmp_path / "s.yaml"
    path.write_text(
        textwrap.dedent(
            """\
            version: 1
            name: t
            input:
              path: in.jsonl
            agents:
              actor:
                settings:
                  tools:
                    restart: nosuch_tools_mod:restart
            """
        ),
        encoding="utf-8",
    )
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    [problem] = info.value.problems
    assert problem.field == "agents.actor.settings.tools.restart"
    assert problem.line == 9
    assert "No module named 'nosuch_tools_mod'" in problem.message


async def test_memory_keeps_history_keyed_by_any_field_and_tallies_it() -> None:
    from agents import Memory
    from pantheon.testing import agent_harness

    settings = {
        "key": "host",
        "fields": ["alert", "action"],
        "history": 2,
        "lookup_topic": "hosts.lookup",
        "tally": {"restarts": {"action": "restart"}},
    }
    async with agent_harness(
        Memory, settings=settings, subscribe=["hosts.lookup", "remediation.done"]
    ) as h:
        for alert, action in (("cpu", "restart"), ("oom", "restart"), ("disk", "clear")):
            await h.send("remediation.done", {"host": "db-1", "alert": alert, "action": action})
        answer = await h.request("hosts.lookup", {"host": "db-1"})
        unknown = await h.request("hosts.lookup", {"host": "web-9"})
    # Bounded at 2: the first restart is forgotten.
    assert answer == {
        "host": "db-1",
        "count": 2,
        "restarts": 1,
        "recent": [{"alert": "oom", "action": "restart"}, {"alert": "disk", "action": "clear"}],
    }
    assert unknown == {"host": "web-9", "count": 0, "restarts": 0, "recent": []}


def test_a_call_without_tokens_is_priced_at_zero_whatever_the_price_list() -> None:
    from agents import Usage, UsageMeter

    meter = UsageMeter()
    assert meter.add("rules", Usage(0, 0), "rules", {}) == 0.0
    usage = meter.snapshot({})
    assert usage.calls == 1 and usage.cost_usd == 0.0 and usage.priced
    # A call that used tokens on a model with no price leaves the cost a lower bound.
    assert meter.add("gpt-x", Usage(10, 5), "gpt-x", {}) is None
    assert not meter.snapshot({}).priced
