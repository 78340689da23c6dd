"""An agent that asks a model its own questions needs a model provider: a scenario that
leaves it on the offline rules provider fails validation on the agent's line, and a call the
rules provider cannot answer fails at the call, naming the agent and what it asked."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.intents import INTENTS, classify

from agents import Agent, FunctionAgent, ProviderError, RuleProvider
from bus import Envelope
from pantheon.scenario import ScenarioError, load_scenario
from pantheon.scenario._agents import uses_model
from pantheon.testing import agent_harness

MODULE = '''
from agents import Agent


class Summarizer(Agent):
    subscriptions = ("ticket.new",)

    async def handle(self, env):
        answer = await self.chat([{"role": "user", "content": env.payload["subject"]}])
        await self.emit("ticket.summarized", answer.data)


class Declared(Agent):
    """Reaches the model through a helper the code scan cannot see, so it says so."""

    subscriptions = ("ticket.new",)
    uses_model = True

    async def handle(self, env):
        await ask_through(self, env)


class RulesAreEnough(Summarizer):
    """Asks only what the rules provider answers."""

    uses_model = False


async def ask_through(agent, env):
    return await getattr(agent, "chat")([{"role": "user", "content": "x"}])


async def on_ticket(env, agent):
    await agent.chat([{"role": "user", "content": env.payload["subject"]}])
'''


def _scenario(tmp_path: Path, module: str, agent: str, provider: str = "") -> Path:
    (tmp_path / f"{module}.py").write_text(MODULE, encoding="utf-8")
    path = tmp_path / "scenario.yaml"
    path.write_text(
        f"version: 1\nname: t\ninput: {{kind: stdin, topic: ticket.new}}\n{provider}"
        f"agents:\n  asker:\n{agent}",
        encoding="utf-8",
    )
    return path


def test_a_chatting_class_without_a_provider_fails_on_its_class_line(tmp_path: Path) -> None:
    path = _scenario(tmp_path, "chat_mod_a", '    class: "chat_mod_a:Summarizer"\n')
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    [problem] = info.value.problems
    assert (problem.line, problem.column, problem.field) == (6, 5, "agents.asker.class")
    assert problem.message == (
        "Summarizer calls chat(), but the scenario names no model provider, and the offline "
        "rules one it gets only classifies intents: add provider: {kind: openai, base_url: "
        "..., model: ...} (or kind: anthropic, or kind: custom), or to run offline a scripted "
        "model the run starts itself: provider: {kind: openai, model: ..., "
        'stand_in: "module:reply"}'
    )
    assert str(problem).startswith(f"{path}:6:5: agents.asker.class: Summarizer calls chat()")


def test_a_chatting_handler_on_the_rules_provider_fails_on_its_handler_line(
    tmp_path: Path,
) -> None:
    path = _scenario(
        tmp_path,
        "chat_mod_b",
        '    handler: "chat_mod_b:on_ticket"\n    subscribe: [ticket.new]\n',
        provider="provider: {kind: rules}\n",
    )
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    [problem] = info.value.problems
    assert (problem.line, problem.field) == (7, "agents.asker.handler")
    assert problem.message.startswith(
        "handler chat_mod_b:on_ticket calls chat(), but provider kind 'rules' only classifies"
    )


def test_a_declaration_overrides_what_the_code_shows(tmp_path: Path) -> None:
    path = _scenario(tmp_path, "chat_mod_c", '    class: "chat_mod_c:Declared"\n')
    with pytest.raises(ScenarioError, match=r"Declared calls chat\(\)"):
        load_scenario(path)
    path = _scenario(tmp_path, "chat_mod_c", '    class: "chat_mod_c:RulesAreEnough"\n')
    assert list(load_scenario(path).agents) == ["observer", "asker"]


def test_a_model_provider_lets_the_chatting_agent_run(tmp_path: Path) -> None:
    path = _scenario(
        tmp_path,
        "chat_mod_d",
        '    class: "chat_mod_d:Summarizer"\n',
        provider="provider: {kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m}\n",
    )
    assert load_scenario(path).provider.kind == "openai"


SUMMARY = {
    "type": "json_schema",
    "json_schema": {
        "name": "summary",
        "schema": {
            "type": "object",
            "properties": {"severity": {"type": "string"}, "summary": {"type": "string"}},
            "required": ["severity", "summary"],
        },
    },
}


class Summarizer(Agent):
    subscriptions = ("ticket.new",)

    async def handle(self, env: Envelope) -> None:
        answer = await self.chat(
            [{"role": "user", "content": env.payload["subject"]}], response_format=SUMMARY
        )
        await self.emit("ticket.summarized", {"severity": answer.data["severity"]})


async def test_the_rules_provider_refuses_a_schema_it_cannot_fill_naming_the_agent() -> None:
    async with agent_harness(Summarizer, name="summarizer", provider=RuleProvider({})) as h:
        await h.send("ticket.new", {"subject": "Checkout is down"}, check=False)
    [letter] = h.dead_letters
    assert letter.error_type == "ProviderError"
    assert letter.error == (
        "agent 'summarizer': the offline rules provider cannot answer JSON schema 'summary': it "
        "gives only intent, confidence, scores, not severity, summary; give the scenario a "
        "model provider (provider: {kind: openai, base_url: ..., model: ...})"
    )


async def test_the_rules_provider_refuses_tools_and_answers_its_own_question() -> None:
    rules = RuleProvider({"outage": [r"(?i)\bdown\b"]})
    user = [{"role": "user", "content": "Subject: Checkout is down\n\nHelp"}]
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {}}}
    with pytest.raises(ProviderError, match=r"cannot call tools \('lookup'\)"):
        await rules.chat(user, tools=[tool])
    described = {"type": "json_schema", "json_schema": {"name": "s", "schema": {
        "type": "object", "properties": {"intent": {}, "severity": {}}}}}  # fmt: skip
    assert RuleProvider.refusal(described) == (
        "the offline rules provider cannot answer JSON schema 's': it gives only intent, "
        "confidence, scores, not severity"
    )
    answer = await classify(rules, "Checkout is down", "Help")
    assert answer["intent"] == "outage" and answer["intent"] in INTENTS


def test_code_without_source_is_judged_by_the_names_it_uses() -> None:
    namespace: dict[str, object] = {}
    exec(
        "async def ask(env, agent):\n    await agent.chat([])\n\n"
        "async def quiet(env, agent):\n    await agent.emit('x', chat)\n",
        namespace,
    )
    assert uses_model(FunctionAgent, namespace["ask"]) is True  # type: ignore[arg-type]
    # `chat` here is a global, not a call on the agent; the code scan cannot read the source
    # to tell, and only the name says so: a declaration settles such cases.
    assert uses_model(FunctionAgent, namespace["quiet"]) is True  # type: ignore[arg-type]
    assert uses_model(Summarizer) is True and uses_model(Agent) is False


def test_a_recorded_scenario_rebuilt_for_a_replay_is_not_held_to_a_provider(
    tmp_path: Path,
) -> None:
    # Sessions recorded before this check existed replay: their model answers are served.
    from pantheon.scenario import parse_scenario

    path = _scenario(tmp_path, "ticket_mod", '    class: "ticket_mod:Summarizer"\n')
    with pytest.raises(ScenarioError):
        load_scenario(path)
    scenario = parse_scenario(path.read_text(), base_dir=tmp_path, check_files=False)
    assert scenario.agents["asker"].class_ == "ticket_mod:Summarizer"
