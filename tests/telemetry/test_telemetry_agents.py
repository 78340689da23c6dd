"""The support team, traced: one email is one trace, agents add GenAI spans, replays stay exact."""

from __future__ import annotations

from pathlib import Path

from opentelemetry.trace import SpanKind
from telemetry_helpers import Traced

from bus import Bus
from pantheon.rerun import replay_session
from pantheon.runner._build import team_setup
from pantheon.runner._runtime import run_scenario
from pantheon.runner._session_run import recording
from pantheon.scenario import (
    AnthropicProviderConfig,
    OpenAIProviderConfig,
    Scenario,
    load_scenario,
)
from pantheon.sessions import SessionStore
from pantheon.testing import ModelServer, classify_reply

ROOT = Path(__file__).resolve().parents[2]
PIPELINE = ("sensor", "reasoner", "planner", "guardian", "actor", "learner")


def few_emails(n: int) -> Scenario:
    scenario = load_scenario(ROOT / "scenarios" / "support_email.yaml")
    return scenario.model_copy(update={"input": scenario.input.model_copy(update={"count": n})})


async def test_one_email_is_one_trace_with_genai_spans(traced: Traced) -> None:
    bus = Bus(session_id="sess-traced")
    traced.telemetry.instrument(bus)
    summary = await run_scenario(few_emails(4), bus=bus)
    assert summary.inputs == 4

    spans = traced.spans()
    roots = [s for s in spans if s.parent is None]
    assert sorted({s.name for s in roots}) == ["publish observation.email.received"]
    assert len(roots) == 4  # every other span descends from one of the four emails
    by_id = {s.context.span_id: s for s in spans}
    for s in spans:
        if s.parent is not None:
            parent = by_id[s.parent.span_id]  # every parent was exported too
            assert parent.context.trace_id == s.context.trace_id

    # Follow the first email (e0001, a question answered with a reply).
    [root] = [s for s in roots if s.start_time == min(r.start_time for r in roots)]
    trace = [s for s in spans if s.context.trace_id == root.context.trace_id]
    names = {s.name for s in trace}
    for topic in (
        "observation.email.received",
        "sensor.email.enriched",
        "reasoning.intent.classified",
        "plan.proposed",
        "guardian.decision",
        "action.executed",
    ):
        assert f"publish {topic}" in names and f"process {topic}" in names
    groups = {
        (s.attributes or {}).get("messaging.consumer.group.name")
        for s in trace
        if s.kind is SpanKind.CONSUMER
    }
    assert set(PIPELINE) <= groups

    agents = [s for s in trace if s.name.startswith("invoke_agent ")]
    assert {s.name.removeprefix("invoke_agent ") for s in agents} >= set(PIPELINE)
    for s in agents:
        attrs = s.attributes or {}
        assert attrs["gen_ai.operation.name"] == "invoke_agent"
        assert attrs["gen_ai.conversation.id"] == "sess-traced"
        # An agent's work is a child of the bus's processing of the message it handles.
        parent = by_id[s.parent.span_id]  # type: ignore[union-attr]
        assert parent.name.startswith("process ") and parent.kind is SpanKind.CONSUMER

    [chat] = [s for s in trace if s.name == "chat rules"]
    assert (chat.attributes or {})["gen_ai.operation.name"] == "chat"
    assert (chat.attributes or {})["gen_ai.request.model"] == "rules"
    assert (chat.attributes or {})["gen_ai.conversation.id"] == "sess-traced"
    assert by_id[chat.parent.span_id].name == "invoke_agent reasoner"  # type: ignore[union-attr]

    [reply] = [s for s in trace if s.name == "execute_tool reply"]
    attrs = reply.attributes or {}
    assert attrs["gen_ai.operation.name"] == "execute_tool"
    assert attrs["gen_ai.tool.name"] == "reply"
    assert attrs["gen_ai.conversation.id"] == "sess-traced"
    assert by_id[reply.parent.span_id].name == "invoke_agent actor"  # type: ignore[union-attr]

    # The Reasoner's question to Memory is a request inside its effect: the whole round trip
    # (publish, Memory's processing, Memory's agent span) hangs under that tool span.
    [lookup] = [s for s in trace if s.name == "execute_tool memory.lookup"]
    [ask] = [s for s in trace if s.name == "publish memory.lookup"]
    assert ask.parent is not None and ask.parent.span_id == lookup.context.span_id
    assert any(s.name == "invoke_agent memory" for s in trace)


async def test_tracing_changes_nothing_a_replay_checks(tmp_path: Path, traced: Traced) -> None:
    scenario = few_emails(6)
    store_path = tmp_path / "sessions.db"
    async with recording(scenario, store_path, None) as rec:
        traced.telemetry.instrument(rec.bus)
        summary = await run_scenario(
            scenario, bus=rec.bus, attach=rec.attach, outbox_dir=rec.outbox_dir
        )
        await rec.finish(summary)
        session_id = rec.bus.session_id
    assert traced.named("invoke_agent actor")
    assert session_id is not None
    with SessionStore(store_path) as store:
        setup = traced.telemetry.wrap_setup(team_setup(scenario.text, base_dir=ROOT / "scenarios"))
        report = await replay_session(store, session_id, setup)
    assert report.matched, report.divergence
    # The replay was traced too, as its own traces, with the replay's session as conversation.
    conversations = {
        (s.attributes or {}).get("gen_ai.conversation.id")
        for s in traced.named("invoke_agent actor")
    }
    assert conversations == {session_id, report.new_session_id}


async def test_a_model_servers_chat_span_carries_usage(traced: Traced) -> None:
    with ModelServer(classify_reply) as server:
        scenario = few_emails(2).model_copy(
            update={
                "provider": OpenAIProviderConfig(
                    kind="openai", base_url=server.base_url, model="local", api_key_env=""
                )
            }
        )
        bus = Bus(session_id="sess-model")
        traced.telemetry.instrument(bus)
        summary = await run_scenario(scenario, bus=bus)
    chats = traced.named("chat local")
    assert len(chats) == 2 and all(s.kind is SpanKind.CLIENT for s in chats)
    attrs = chats[0].attributes or {}
    assert attrs["gen_ai.provider.name"] == "openai"
    assert attrs["gen_ai.request.temperature"] == 0.0
    assert attrs["server.address"] == "127.0.0.1" and attrs["server.port"] == server.port
    assert attrs["gen_ai.response.id"].startswith("chatcmpl-")
    assert list(attrs["gen_ai.response.finish_reasons"]) == ["stop"]
    tokens_in = sum((s.attributes or {})["gen_ai.usage.input_tokens"] for s in chats)
    tokens_out = sum((s.attributes or {})["gen_ai.usage.output_tokens"] for s in chats)
    assert summary.usage["input_tokens"] == tokens_in > 0
    assert summary.usage["output_tokens"] == tokens_out > 0


async def test_an_anthropic_chat_span_carries_usage(traced: Traced) -> None:
    with ModelServer(classify_reply) as server:
        scenario = few_emails(2).model_copy(
            update={
                "provider": AnthropicProviderConfig(
                    kind="anthropic",
                    base_url=server.anthropic_base_url,
                    model="local",
                    api_key_env="",
                )
            }
        )
        bus = Bus(session_id="sess-anthropic")
        traced.telemetry.instrument(bus)
        summary = await run_scenario(scenario, bus=bus)
    chats = traced.named("chat local")
    assert len(chats) == 2 and all(s.kind is SpanKind.CLIENT for s in chats)
    attrs = chats[0].attributes or {}
    assert attrs["gen_ai.provider.name"] == "anthropic"
    assert attrs["server.port"] == server.port and attrs["gen_ai.request.max_tokens"] == 1024
    assert attrs["gen_ai.response.id"].startswith("msg_")
    assert list(attrs["gen_ai.response.finish_reasons"]) == ["stop"]
    tokens_in = sum((s.attributes or {})["gen_ai.usage.input_tokens"] for s in chats)
    assert summary.usage["input_tokens"] == tokens_in > 0
