"""``pantheon.testing``: the helpers a team's own tests use, each tested the way a user's
test would use it (a real bus, real scenario runs, real replays)."""

from __future__ import annotations

import asyncio
import json
import textwrap
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

import pantheon
import pantheon.testing
from agents import (
    Agent,
    AgentOptions,
    AgentSettings,
    ChatResult,
    Fault,
    FaultMark,
    FunctionAgent,
    OpenAIProvider,
)
from bus import Bus, Envelope
from bus.testing import FakeClock
from pantheon import RunSummary
from pantheon.rerun import ReplayReport
from pantheon.sessions import SessionNotFound, SessionStore
from pantheon.testing import (
    AgentFailed,
    EffectCall,
    ModelServer,
    agent_harness,
    assert_passed,
    assert_replays,
    open_session,
    replay_matches,
    run_scenario,
    scratch_store,
)

MINE = {
    "DEFAULT_SEND_TIMEOUT",
    "AgentFailed",
    "AgentHarness",
    "EffectCall",
    "FakeClock",
    "RecordedEffects",
    "agent_harness",
    "assert_passed",
    "assert_replays",
    "capture_events",
    "memory_bus",
    "open_session",
    "replay_matches",
    "run_scenario",
    "scratch_store",
}


def test_public_names_are_exactly_all() -> None:
    public = {n for n in dir(pantheon.testing) if not n.startswith("_")}
    assert public == set(pantheon.testing.__all__)
    assert set(pantheon.testing.__all__) >= MINE


# -- the agent harness -------------------------------------------------------------------------


class Lookup(Agent):
    """Looks a customer up in a CRM (an effect) and says how they are treated."""

    subscriptions = ("ticket.new",)

    class Settings(AgentSettings):
        vip_threshold: int = 1000

    async def handle(self, env: Envelope) -> Any:
        record = await self.effect("tool.crm", crm_lookup, env.payload["customer"])
        spent = record["spent"]
        tier = "vip" if spent >= self.settings.vip_threshold else "regular"
        stamp = await self.now()
        await self.emit("ticket.tiered", {"id": env.payload["id"], "tier": tier, "at": stamp})
        return tier


CRM_CALLS: list[str] = []


def crm_lookup(customer: str) -> dict[str, Any]:
    CRM_CALLS.append(customer)
    return {"spent": 5000 if customer.startswith("big") else 10}


class Starter(Agent):
    """Announces itself when started: background work runs under the harness too."""

    async def start(self) -> None:
        await self.emit("agent.ready", {"name": self.name})


class Broken(Agent):
    subscriptions = ("ticket.new",)

    async def handle(self, env: Envelope) -> None:
        raise KeyError("customer")


class Stuck(Agent):
    subscriptions = ("ticket.new",)

    async def handle(self, env: Envelope) -> None:
        await asyncio.Event().wait()


async def test_send_waits_for_the_agent_and_published_lists_what_it_emitted() -> None:
    fakes = {"tool.crm": {"spent": 2000}, "clock.now": 1700000000.0}
    async with agent_harness(Lookup, settings={"vip_threshold": 1500}, effects=fakes) as h:
        sent = await h.send("ticket.new", {"id": "t1", "customer": "ann"})
        # Nothing to wait for: send returned once the agent had handled it.
        assert h.published("ticket.tiered") == [{"id": "t1", "tier": "vip", "at": 1700000000.0}]
    # What the harness sent is input, not output; everything stays readable after the block.
    assert h.published() == h.published("ticket.*") == [h.published("ticket.tiered")[0]]
    [out] = h.envelopes("ticket.tiered")
    assert out.causation_id == sent.id and out.source == "agent"
    assert isinstance(h.agent, Lookup) and h.agent.settings.vip_threshold == 1500


async def test_effects_are_recorded_and_faked_by_name() -> None:
    CRM_CALLS.clear()
    async with agent_harness(Lookup, effects={"clock.now": lambda: 42.0}) as h:
        await h.send("ticket.new", {"id": "t1", "customer": "big corp"})
        await h.send("ticket.new", {"id": "t2", "customer": "ann"})
    # Not faked: the real function ran, once per message.
    assert CRM_CALLS == ["big corp", "ann"]
    assert h.calls("tool.crm") == [
        EffectCall("tool.crm", ("big corp",), {}, result={"spent": 5000}),
        EffectCall("tool.crm", ("ann",), {}, result={"spent": 10}),
    ]
    # A callable fake computes the result; effects keep their order across names.
    assert [c.name for c in h.effects] == ["tool.crm", "clock.now"] * 2
    assert all(c.faked and c.result == 42.0 for c in h.calls("clock.now"))
    assert [p["tier"] for p in h.published("ticket.tiered")] == ["vip", "regular"]


async def test_an_exception_fake_fails_the_call_and_the_test_sees_why() -> None:
    outage = ConnectionError("crm unreachable")
    async with agent_harness(Lookup, effects={"tool.crm": outage}) as h:
        with pytest.raises(AgentFailed) as info:
            await h.send("ticket.new", {"id": "t1", "customer": "ann"})
        [call] = h.calls("tool.crm")
        assert call.error is outage and call.faked and call.result is None
    message = str(info.value)
    assert "agent on 'ticket.new' (failed, 1 attempt(s)): ConnectionError: crm unreachable" in (
        message
    )
    assert "Traceback" in message and "raise fake" in message
    assert [d.envelope.payload["id"] for d in info.value.dead_letters] == ["t1"]


async def test_what_a_harness_sends_is_numbered_input_for_a_fault_window() -> None:
    """``send`` is the agent's outside input, numbered per topic as an Observer numbers
    its inputs: a fault over the first two messages fails those two and no other."""
    fault = Fault(failure_rate=1.0, until=FaultMark(messages=2))
    async with agent_harness(Lookup, fault=fault, options=AgentOptions(breaker=None)) as h:
        failed = []
        for i in range(4):
            try:
                await h.send("ticket.new", {"id": f"t{i}", "customer": "ann"})
            except AgentFailed:
                failed.append(i)
    assert failed == [0, 1]
    verdicts = [c.result for c in h.calls("fault.window")]  # one per attempt
    assert verdicts[-2:] == [False, False] and set(verdicts[:-2]) == {True}


async def test_a_failing_handler_is_reported_once_and_check_false_leaves_it_to_the_test() -> None:
    async with agent_harness(Broken) as h:
        with pytest.raises(AgentFailed, match="KeyError: 'customer'"):
            await h.send("ticket.new", {"id": "t1"})
        # Already reported: the next message's send does not raise for it again.
        await h.send("ticket.new", {"id": "t2"}, check=False)
        assert [d.envelope.payload["id"] for d in h.dead_letters] == ["t1", "t2"]
        assert all(d.reason == "failed" for d in h.dead_letters)


async def test_a_handler_that_never_finishes_times_out_instead_of_hanging() -> None:
    with pytest.raises(TimeoutError):
        async with agent_harness(Stuck) as h:
            await h.send("ticket.new", {"id": "t1"}, timeout=0.05)


async def test_request_returns_the_handlers_answer() -> None:
    async with agent_harness(Lookup, effects={"tool.crm": {"spent": 1}}) as h:
        assert await h.request("ticket.new", {"id": "t1", "customer": "ann"}) == "regular"
        assert [p["id"] for p in h.published()] == ["t1"]  # the request itself is not output


async def test_a_handler_function_runs_as_a_function_agent() -> None:
    async def escalate(env: Envelope, agent: Agent) -> None:
        page = await agent.effect("tool.page", lambda who: f"paged {who}", "oncall")
        await agent.emit("ticket.escalated", {"id": env.payload["id"], "page": page})

    async with agent_harness(escalate, subscribe=["ticket.urgent"]) as h:
        await h.send("ticket.urgent", {"id": "t9"})
        await h.send("ticket.normal", {"id": "t10"})  # not subscribed: nothing happens
    assert isinstance(h.agent, FunctionAgent) and h.agent.name == "escalate"
    assert h.published("ticket.escalated") == [{"id": "t9", "page": "paged oncall"}]
    assert [c.args for c in h.calls("tool.page")] == [("oncall",)]


async def test_background_work_at_start_is_captured() -> None:
    async with agent_harness(Starter, name="starter") as h:
        pass
    assert h.published("agent.ready") == [{"name": "starter"}]


async def test_a_built_agent_and_a_bus_of_ones_own() -> None:
    clock = FakeClock()
    agent = Lookup("lookup", settings={"vip_threshold": 1})
    async with agent_harness(
        agent, bus=Bus(clock=clock), effects={"tool.crm": {"spent": 1}, "clock.now": clock.now}
    ) as h:
        await h.send("ticket.new", {"id": "t1", "customer": "ann"})
        assert h.bus.clock is clock and h.agent is agent
    assert h.published("ticket.tiered") == [{"id": "t1", "tier": "vip", "at": 0.0}]


async def test_settings_are_checked_and_arguments_that_cannot_apply_are_refused() -> None:
    with pytest.raises(ValidationError, match="vip_treshold"):
        async with agent_harness(Lookup, settings={"vip_treshold": 3}):
            pass
    with pytest.raises(TypeError, match="already built"):
        async with agent_harness(Lookup("x"), settings={"vip_threshold": 3}):
            pass
    with pytest.raises(TypeError, match="needs subscribe"):
        async with agent_harness(Stuck.handle):
            pass
    with pytest.raises(TypeError, match="not int"):
        async with agent_harness(3):  # type: ignore[arg-type]
            pass


class Classifier(Agent):
    """Asks its model which queue a ticket belongs in."""

    subscriptions = ("ticket.new",)

    async def handle(self, env: Envelope) -> None:
        answer = await self.chat([{"role": "user", "content": env.payload["subject"]}])
        await self.emit("ticket.classified", {"id": env.payload["id"], "queue": answer.content})


async def test_an_agent_that_chats_against_the_local_model_server() -> None:
    with ModelServer(reply="billing") as server:
        async with (
            OpenAIProvider(server.base_url, model="local") as provider,
            agent_harness(Classifier, provider=provider) as h,
        ):
            await h.send("ticket.new", {"id": "t1", "subject": "Refund please"})
        assert len(server.requests) == 1
    assert h.published("ticket.classified") == [{"id": "t1", "queue": "billing"}]
    [call] = h.calls("model.openai.chat")
    assert call.result["content"] == "billing" and not call.faked


async def test_a_model_call_is_faked_by_its_effect_name_like_any_tool() -> None:
    # No server at all: the provider is never called, the fake is the recorded answer.
    provider = OpenAIProvider("http://127.0.0.1:9/v1", model="local")
    fake = ChatResult(content="access").to_dict()
    try:
        async with agent_harness(
            Classifier, provider=provider, effects={"model.openai.chat": fake}
        ) as h:
            await h.send("ticket.new", {"id": "t2", "subject": "Locked out"})
    finally:
        await provider.aclose()
    assert h.published("ticket.classified") == [{"id": "t2", "queue": "access"}]
    assert h.agent.usage.calls == 1


# -- whole scenarios ---------------------------------------------------------------------------

# Module names are unique per test file: a process imports a module once.
MODULE = '''
import random
import time

from agents import Agent
from bus import Envelope


class Stamp(Agent):
    """Deterministic: everything from outside goes through effects."""

    subscriptions = ("ticket.received",)

    async def handle(self, env: Envelope) -> None:
        at = await self.now()
        await self.emit("ticket.stamped", {"id": env.payload["id"], "at": at})


class Leaky(Agent):
    """Reads the clock and randomness directly: a replay cannot reproduce its output."""

    subscriptions = ("ticket.received",)

    async def handle(self, env: Envelope) -> None:
        await self.emit("ticket.leaked", {"at": time.time(), "r": random.random()})


class Fragile(Agent):
    subscriptions = ("ticket.received",)

    async def handle(self, env: Envelope) -> None:
        if env.payload["id"] == "e2":
            raise ValueError("cannot parse e2")
'''

TICKETS = [{"id": f"e{i}", "subject": f"s{i}"} for i in range(1, 4)]


def scenario(folder: Path, name: str, agent: str, expect: str = "zero_lost: true") -> Path:
    path = folder / f"{name}.yaml"
    path.write_text(
        textwrap.dedent(
            f"""\
            version: 1
            name: {name}
            input:
              kind: jsonl
              path: tickets.jsonl
              topic: ticket.received
            agents:
              worker:
                class: "helpers_team_mod:{agent}"
            expect:
              {expect}
            """
        ),
        encoding="utf-8",
    )
    return path


@pytest.fixture
def team(tmp_path: Path) -> Path:
    folder = tmp_path / "team"
    folder.mkdir()
    (folder / "helpers_team_mod.py").write_text(MODULE, encoding="utf-8")
    (folder / "tickets.jsonl").write_text(
        "".join(json.dumps(t) + "\n" for t in TICKETS), encoding="utf-8"
    )
    return folder


def test_run_scenario_records_in_the_scratch_store_by_default(team: Path) -> None:
    summary = run_scenario(scenario(team, "stamp", "Stamp"))
    assert isinstance(summary, RunSummary) and summary.passed
    assert summary.inputs == 3 and summary.hops["worker"]["handled"] == 3
    assert not (team / ".pantheon").exists()  # nothing written beside the team
    assert summary.session_id is not None
    with SessionStore(scratch_store()) as st:
        assert st.session(summary.session_id).status == "completed"
    # The scratch store is one per process.
    assert scratch_store() == scratch_store() and scratch_store().is_file()


def test_run_scenario_takes_a_store_a_seed_and_a_loaded_scenario(team: Path) -> None:
    store = team / "mine.db"
    loaded = pantheon.load_scenario(scenario(team, "stamp", "Stamp"))
    summary = run_scenario(loaded, store=store, seed=99)
    assert summary.seed == 99 and summary.session_id is not None
    with SessionStore(store) as st:
        assert st.session(summary.session_id).seed == 99
    unrecorded = run_scenario(loaded, record=False)
    assert unrecorded.session_id is None and unrecorded.passed


def test_assert_passed_names_each_failed_expectation_with_expected_and_actual(
    team: Path,
) -> None:
    ok = run_scenario(scenario(team, "stamp", "Stamp"))
    assert_passed(ok)  # no exception
    bad = run_scenario(
        scenario(
            team, "fragile", "Fragile", "{max_dlq: 0, min_throughput: 1.0e12, zero_lost: true}"
        )
    )
    with pytest.raises(AssertionError) as info:
        assert_passed(bad)
    lines = str(info.value).splitlines()
    assert lines[0] == "scenario 'fragile': 2 expectation(s) failed"
    assert "- dead letters other than shed <= 0: expected 0, actual 1" in lines
    assert any(
        line.startswith("- throughput >= 1000000000000.0 msg/s: expected 1000000000000.0, actual ")
        for line in lines
    )
    assert not any("zero lost" in line for line in lines)  # it held
    assert "- worker on 'ticket.received' (failed): ValueError: cannot parse e2" in lines
    assert lines[-1].startswith(f"session {bad.session_id}")


def test_a_deterministic_team_replays_exactly(team: Path) -> None:
    summary = run_scenario(scenario(team, "stamp", "Stamp"))
    report = assert_replays(summary)
    assert isinstance(report, ReplayReport) and report.matched
    assert report.original_session_id == summary.session_id and report.hops_compared > 0
    assert replay_matches(summary) is True
    assert replay_matches(summary.session_id) is True  # by id, in the scratch store


def test_a_team_that_reads_the_clock_directly_does_not_replay(team: Path) -> None:
    summary = run_scenario(scenario(team, "leaky", "Leaky"))
    assert summary.passed
    assert replay_matches(summary) is False
    with pytest.raises(
        AssertionError, match=r"did not replay exactly: replay diverged \(payload\)"
    ):
        assert_replays(summary)


def test_replay_helpers_read_the_store_they_are_given(team: Path) -> None:
    store = team / "mine.db"
    summary = run_scenario(scenario(team, "stamp", "Stamp"), store=store)
    assert replay_matches(summary, store) is True
    session = open_session(summary, store)
    assert session.store == store and session.status == "completed"
    assert assert_replays(session).matched  # a Session knows its own store
    with pytest.raises(SessionNotFound):
        replay_matches(summary)  # not in the scratch store


def test_open_session_shows_what_happened_inside_the_team(team: Path) -> None:
    summary = run_scenario(scenario(team, "stamp", "Stamp"))
    session = open_session(summary)
    assert session.id == summary.session_id
    stamped = [e.payload["id"] for e in session.envelopes() if e.topic == "ticket.stamped"]
    assert sorted(stamped) == ["e1", "e2", "e3"]
    assert [e.name for e in session.effects()].count("clock.now") == 3


def test_an_unrecorded_run_has_no_session_to_open_or_replay(team: Path) -> None:
    summary = run_scenario(scenario(team, "stamp", "Stamp"), record=False)
    with pytest.raises(ValueError, match="not recorded"):
        open_session(summary)
    with pytest.raises(ValueError, match="not recorded"):
        replay_matches(summary)


async def test_the_sync_helpers_say_what_to_use_in_an_async_test(team: Path) -> None:
    path = scenario(team, "stamp", "Stamp")
    # filterwarnings=error: an un-awaited coroutine left behind would fail this test.
    with pytest.raises(RuntimeError, match=r"use 'await pantheon.run\(...\)'"):
        run_scenario(path)
    with pytest.raises(RuntimeError, match=r"pantheon.replay"):
        assert_replays("any-session")


def test_the_stand_in_model_server_answers_in_the_shape_asked_for() -> None:
    """``python -m pantheon.testing``, as the tutorial starts it: a real server process."""
    import asyncio
    import subprocess
    import sys

    from agents import OpenAIProvider

    schema = {
        "type": "object",
        "properties": {
            "severity": {"enum": ["high", "low"]},
            "summary": {"type": "string"},
            "score": {"type": "number", "minimum": 0.5},
            "tags": {"type": "array", "items": {"type": "string"}},
        },
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "t", "schema": schema}}

    async def ask(base_url: str) -> tuple[Any, Any]:
        async with OpenAIProvider(base_url, "stand-in") as model:
            result = await model.chat(
                [{"role": "user", "content": "The site is down for everyone"}],
                response_format=fmt,
            )
            plain = await model.chat([{"role": "user", "content": "hello there"}])
        return result, plain

    with subprocess.Popen(
        [sys.executable, "-m", "pantheon.testing", "--port", "0", "--delay", "0"],
        stdout=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line.startswith("model server at http://127.0.0.1:")
            result, plain = asyncio.run(ask(line.split()[3]))
        finally:
            proc.terminate()
    assert result.data == {
        "severity": "high",
        "summary": "The site is down for everyone",
        "score": 0.5,
        "tags": ["The site is down for everyone"],
    }
    assert result.usage.input_tokens == 6 and result.usage.output_tokens > 0
    assert plain.content == "You wrote: hello there"
