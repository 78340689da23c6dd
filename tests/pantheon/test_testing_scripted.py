"""The scripted model and approval desk of ``agent_harness``, and ``with_provider``, the
scenario behind ``run_scenario(..., provider=...)``: each way of scripting, and what a test
is told when the script and the agent disagree."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from agents import Agent, ChatResult, ProviderError
from bus import Envelope
from pantheon.scenario import ScenarioError
from pantheon.testing import (
    AgentFailed,
    ModelServer,
    ScriptedDesk,
    agent_harness,
    with_provider,
)


class Asker(Agent):
    subscriptions = ("q.asked",)

    async def handle(self, env: Envelope) -> None:
        answer = await self.chat([{"role": "user", "content": env.payload}], temperature=0.0)
        await self.emit("q.answered", answer.content)


class Payer(Agent):
    subscriptions = ("pay.asked",)

    async def handle(self, env: Envelope) -> None:
        decision = await self.approve({"summary": f"pay {env.payload}"})
        await self.emit("pay.decided", [decision.approved, decision.note, decision.by])


async def test_a_callable_answers_from_the_question_and_its_options() -> None:
    def answer(messages: list[dict[str, Any]], options: dict[str, Any]) -> str:
        return f"{messages[-1]['content']} at {options['temperature']}"

    async with agent_harness(Asker, model=answer) as h:
        await h.send("q.asked", "why")
    assert h.published("q.answered") == ["why at 0.0"]
    [chat] = h.chats
    assert chat.request.options == {"temperature": 0.0}
    assert chat.result == ChatResult("why at 0.0", model="scripted", finish_reason="stop")


async def test_a_call_past_the_script_fails_the_test_saying_so() -> None:
    async with agent_harness(Asker, model=["one"]) as h:
        await h.send("q.asked", "first")
        with pytest.raises(AgentFailed) as info:
            await h.send("q.asked", "second")
    assert "AssertionError: the test scripted 1 model answer(s) but was asked for number 2" in str(
        info.value
    )


async def test_an_exception_answer_is_raised_at_the_call() -> None:
    async with agent_harness(Asker, model=ProviderError("the model is down")) as h:
        await h.send("q.asked", "anyone?", check=False)
    [letter] = h.dead_letters
    assert (letter.error_type, letter.error) == ("ProviderError", "the model is down")
    assert h.chats == []


async def test_a_model_is_scripted_or_given_not_both() -> None:
    with pytest.raises(TypeError, match=r"model= \(scripted answers\) or provider=, not both"):
        async with agent_harness(Asker, model="x", provider=object()):
            pass


async def test_a_desk_of_ones_own_is_used_as_given() -> None:
    desk = ScriptedDesk(lambda agent, request: (agent == "payer", request["summary"]), by="bo")
    async with agent_harness(Payer, name="payer", approvals=desk) as h:
        await h.send("pay.asked", 5)
    assert h.published("pay.decided") == [[True, "pay 5", "bo"]]
    assert desk.requests == [("payer", {"summary": "pay 5"})]
    assert h.approvals == [{"summary": "pay 5"}]


async def test_a_ruling_that_is_no_decision_fails_naming_it() -> None:
    async with agent_harness(Payer, approvals="yes") as h:  # type: ignore[arg-type]
        await h.send("pay.asked", 5, check=False)
    [letter] = h.dead_letters
    assert letter.error == "a scripted approval is True, False or (approved, note), not 'yes'"


HEAD = "version: 1\nname: t\ninput: {kind: stdin, topic: a.b}\n"


def test_with_provider_appends_a_section_and_keeps_every_line_where_it_was(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(HEAD + "agents:\n  reasoner:\n    settings: {treshold: 0.5}\n")
    with ModelServer() as server, pytest.raises(ScenarioError) as info:
        with_provider(path, server)
    [problem] = info.value.problems
    assert (problem.file, problem.line, problem.field) == (
        str(path),
        6,
        "agents.reasoner.settings.treshold",
    )
    path.write_text(HEAD + "agents:\n  reasoner: {}\n")
    with ModelServer(model="m-1") as server:
        scenario = with_provider(path, server)
        assert scenario.text.endswith(
            f'\nprovider: {{"kind": "openai", "base_url": "{server.base_url}", "model": "m-1"}}\n'
        )
    assert scenario.provider.kind == "openai" and scenario.provider.model == "m-1"


def test_with_provider_keeps_an_openai_sections_model_and_takes_a_whole_section(
    tmp_path: Path,
) -> None:
    path = tmp_path / "t.yaml"
    path.write_text(
        HEAD + "provider: {kind: openai, base_url: 'https://x.example/v1', model: big, "
        "timeout: 7}\nagents:\n  reasoner: {}\n"
    )
    with ModelServer() as server:
        scenario = with_provider(path, server)
    assert scenario.provider.kind == "openai"
    assert (scenario.provider.base_url, scenario.provider.model) == (server.base_url, "big")
    assert scenario.provider.timeout == 7
    rules = with_provider(scenario, {"kind": "rules", "default_intent": "bug"})
    assert rules.provider.kind == "rules" and rules.provider.default_intent == "bug"
    path.write_text("version: 1\nname: [t\n")
    with ModelServer() as server, pytest.raises(ScenarioError) as info:
        with_provider(path, server)
    assert info.value.problems[0].file == str(path)
