"""The model agent and its tools: typed functions become tools, the agent loops model call ->
tool calls -> model call until a validated answer, every step a recorded effect, and the
session replays with the model server stopped. Against the real stand-in model server
(``pantheon.testing.ModelServer``) over sockets, through the real OpenAI provider."""

from __future__ import annotations

import asyncio
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import pytest
from pydantic import BaseModel

import pantheon
from agents import (
    AnswerInvalid,
    ModelAgent,
    OpenAIProvider,
    Template,
    TemplateError,
    Tool,
    ToolArgumentsInvalid,
    ToolError,
    ToolSource,
    TooManyToolErrors,
    tool,
    tool_schema,
)
from pantheon.scenario import ScenarioError, parse_scenario
from pantheon.sessions import SessionStore
from pantheon.testing import AgentFailed, ModelServer, Reply, agent_harness

# -- tools from functions ----------------------------------------------------------------------

ORDERS = {"A-1": {"status": "delivered", "paid": 40.0}, "A-2": {"status": "lost", "paid": 95.5}}


class Verdict(BaseModel):
    action: Literal["refund", "reship", "none"]
    amount: float
    reason: str


def order_status(order_id: str) -> dict[str, Any]:
    """The shipping status of an order and what was paid for it.

    Args:
        order_id: The order number, e.g. "A-1".
    """
    if order_id not in ORDERS:
        raise KeyError(f"no order {order_id}")
    return {"order_id": order_id, **ORDERS[order_id]}


async def customer_tier(customer: str) -> str:
    """The customer's loyalty tier: gold, silver or none."""
    await asyncio.sleep(0)
    return {"Cy": "gold"}.get(customer, "silver")


async def refund_limit(status: str, paid: float, vip: bool = False) -> float:
    """How much may be refunded for an order in this state.

    Args:
        status: The order's shipping status.
        paid: What the customer paid.
        vip: Whether the customer is a VIP (the whole amount, whatever the state).
    """
    await asyncio.sleep(0)
    return paid if vip or status == "lost" else 0.0


def test_a_function_becomes_a_tool_with_its_schema_from_signature_and_docstring() -> None:
    t = tool(refund_limit)
    assert isinstance(t, Tool)
    assert t.name == "refund_limit"
    assert t.description == "How much may be refunded for an order in this state."
    assert t.parameters == {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "status": {"type": "string", "description": "The order's shipping status."},
            "paid": {"type": "number", "description": "What the customer paid."},
            "vip": {
                "type": "boolean",
                "default": False,
                "description": "Whether the customer is a VIP (the whole amount, whatever "
                "the state).",
            },
        },
        "required": ["status", "paid"],
    }
    assert tool_schema(t) == {
        "type": "function",
        "function": {
            "name": "refund_limit",
            "description": t.description,
            "parameters": t.parameters,
        },
    }
    renamed = tool(name="status", description="Look an order up.")(order_status)
    assert (renamed.name, renamed.description) == ("status", "Look an order up.")


class Address(BaseModel):
    city: str


def test_a_numpy_docstring_describes_parameters_and_pydantic_models_are_nested() -> None:
    def ship(to: Address, express: bool) -> str:
        """Ship a parcel.

        Parameters
        ----------
        to : Address
            Where it goes.
        express : bool
            Next day.

        Returns
        -------
        str
        """
        return f"{to.city}:{express}"

    t = tool(ship)
    assert t.description == "Ship a parcel."
    assert t.parameters["properties"]["to"]["description"] == "Where it goes."
    assert t.parameters["properties"]["express"] == {"type": "boolean", "description": "Next day."}
    assert t.parameters["$defs"]["Address"]["required"] == ["city"]
    # The model's JSON object arrives as the model instance.
    assert asyncio.run(t({"to": {"city": "Oslo"}, "express": True})) == "Oslo:True"


async def test_arguments_are_validated_before_the_function_runs() -> None:
    ran: list[Any] = []

    def record(n: int) -> int:
        ran.append(n)
        return n

    t = tool(record)
    assert await t({"n": "7"}) == 7  # lax mode: the numeric string a model may send
    with pytest.raises(ToolArgumentsInvalid) as info:
        await t({"n": "seven", "extra": 1})
    assert str(info.value) == (
        "tool 'record' was called with arguments that do not fit: n: Input should be a valid "
        "integer, unable to parse string as an integer; extra: Extra inputs are not permitted"
    )
    with pytest.raises(ToolArgumentsInvalid, match="n: Field required"):
        await t({})
    assert ran == [7]


class Multiplier:
    """Multiplies by a factor."""

    def __init__(self, factor: int) -> None:
        self.factor = factor

    async def __call__(self, n: int) -> int:
        return n * self.factor


async def test_methods_and_callable_objects_are_tools_too() -> None:
    by_three = tool(name="triple")(Multiplier(3))
    assert by_three.parameters["properties"] == {"n": {"type": "integer"}}
    assert by_three.description == "Multiplies by a factor."
    assert await by_three({"n": "4"}) == 12
    method = tool(Multiplier(2).__call__)
    assert method.name == "__call__" and await method({"n": 5}) == 10


def test_what_cannot_be_a_tool_says_why() -> None:
    def splat(*args: int) -> None:
        """Varargs."""

    with pytest.raises(ToolError, match=r"parameter 'args' is \*args or \*\*kwargs"):
        tool(splat)
    with pytest.raises(ToolError, match="is not 1-64 letters"):
        tool(name="no spaces")(order_status)


def test_templates_read_payload_fields_only_and_name_what_is_missing() -> None:
    t = Template("Customer {customer.name} asks: {subject} {{literal}} {items}")
    fields = {"customer": {"name": "Ada"}, "subject": "Where?", "items": [1, 2]}
    assert t.render(fields) == "Customer Ada asks: Where? {literal} [1, 2]"
    with pytest.raises(TemplateError, match=r"no 'customer.email' \(it has name\)"):
        Template("{customer.email}").render(fields)
    # Dotted names are keys, never attributes: a str has no key '__class__'.
    with pytest.raises(TemplateError, match=r"no 'subject.__class__'"):
        Template("{subject.__class__}").render(fields)
    for bad in ("{items[0]}", "{subject!r}", "{x:>10}", "{", "{}"):
        with pytest.raises(TemplateError):
            Template(bad)


# -- the loop against the stand-in model server -------------------------------------------------


def _value(content: str) -> Any:
    """A tool result as the model reads it: JSON, or text (a tool's str result is sent as
    it is)."""
    try:
        return json.loads(content)
    except ValueError:
        return content


def conversation(request: dict[str, Any]) -> Reply:
    """A scripted model: look the order and the customer up (two calls in one answer), then
    ask the refund limit, then answer. Reads the conversation so far, so concurrent
    conversations each get their own next turn."""
    messages = request["messages"]
    results = [_value(m["content"]) for m in messages if m["role"] == "tool"]
    ask = json.loads(next(m["content"] for m in messages if m["role"] == "user"))
    if not results:
        return Reply(
            tool_calls=[
                {"name": "order_status", "arguments": {"order_id": ask["order"]}},
                {"name": "customer_tier", "arguments": {"customer": ask["customer"]}},
            ]
        )
    if len(results) == 2:
        order, tier = results
        args = {"status": order["status"], "paid": order["paid"], "vip": tier == "gold"}
        calls = [{"name": "refund_limit", "arguments": args, "id": "c2"}]
        if "note" in [t["function"]["name"] for t in request["tools"]]:
            calls.append({"name": "note", "arguments": {"ticket": ask["ticket"]}})
        return Reply(tool_calls=calls)
    limit = results[2]
    action = "refund" if limit else "none"
    reason = f"{ask['order']} checked, {results[1]} customer"
    return Reply(json.dumps({"action": action, "amount": limit, "reason": reason}))


@pytest.fixture
def server() -> Iterator[ModelServer]:
    with ModelServer(conversation) as s:
        yield s


SETTINGS = {
    "instructions": "You handle refunds for {customer}. Use the tools.",
    "output_topic": "refund.decided",
    "carry": ["ticket"],
}


async def test_two_tools_over_several_turns_give_a_validated_published_answer(
    server: ModelServer,
) -> None:
    async with (
        OpenAIProvider(server.base_url, model="stand-in") as provider,
        agent_harness(
            ModelAgent,
            name="refunds",
            subscribe=["refund.asked"],
            settings=SETTINGS,
            tools=[order_status, customer_tier, refund_limit],
            output=Verdict,
            provider=provider,
        ) as h,
    ):
        await h.send("refund.asked", {"ticket": "T-9", "customer": "Cy", "order": "A-1"})
    assert h.published("refund.decided") == [
        {
            "action": "refund",
            "amount": 40.0,
            "reason": "A-1 checked, gold customer",
            "ticket": "T-9",
        }
    ]
    names = [c.name for c in h.effects]  # as they finished: the first two ran together
    assert names[0] == "model.openai.chat"
    assert sorted(names[1:3]) == ["tool.customer_tier", "tool.order_status"]
    assert names[3:] == ["model.openai.chat", "tool.refund_limit", "model.openai.chat"]
    assert h.calls("tool.refund_limit")[0].result == 40.0
    first, _, last = (r.body for r in server.requests)
    assert first["messages"][0] == {
        "role": "system",
        "content": "You handle refunds for Cy. Use the tools.",
    }
    names = [t["function"]["name"] for t in first["tools"]]
    assert names == ["order_status", "customer_tier", "refund_limit"]
    assert first["response_format"]["json_schema"]["schema"] == Verdict.model_json_schema()
    # The last turn saw both calls and both results, in protocol order.
    roles = [m["role"] for m in last["messages"]]
    assert roles == ["system", "user", "assistant", "tool", "tool", "assistant", "tool"]
    assert last["messages"][4] == {"role": "tool", "tool_call_id": "call_1", "content": "gold"}
    assert last["messages"][6] == {"role": "tool", "tool_call_id": "c2", "content": "40.0"}
    assert h.agent.usage.calls == 3


async def test_the_calls_of_one_answer_run_concurrently_and_are_recorded_in_its_order() -> None:
    # Each tool waits for the other to have started: run one after the other, they would
    # wait for ever (and the harness's send would time out).
    started = {"ping": asyncio.Event(), "pong": asyncio.Event()}

    async def ping() -> str:
        """Ping."""
        started["ping"].set()
        await started["pong"].wait()
        return "ping done"

    async def pong() -> str:
        """Pong."""
        started["pong"].set()
        await started["ping"].wait()
        return "pong done"

    both = Reply(tool_calls=[{"name": "pong", "arguments": {}}, {"name": "ping", "arguments": {}}])
    with ModelServer([both, "both done"]) as s:
        async with (
            OpenAIProvider(s.base_url, model="stand-in") as provider,
            agent_harness(
                ModelAgent,
                subscribe=["q"],
                settings={"output_topic": "a"},
                tools=[ping, pong],
                provider=provider,
            ) as h,
        ):
            await h.send("q", "go")
        told = [m["content"] for m in s.requests[1].body["messages"] if m["role"] == "tool"]
    assert told == ["pong done", "ping done"]
    # The harness lists effects as they finish; their ordinals (what a replay keys by) are
    # the model's order, which the scenario test below replays.
    assert sorted(c.name for c in h.effects[1:3]) == ["tool.ping", "tool.pong"]


async def test_a_request_gets_the_answer_back() -> None:
    with ModelServer(Reply('{"action": "none", "amount": 0, "reason": "fine"}')) as s:
        async with (
            OpenAIProvider(s.base_url, model="stand-in") as provider,
            agent_harness(
                ModelAgent,
                subscribe=["ask"],
                settings={"output": Verdict},
                provider=provider,
            ) as h,
        ):
            answer = await h.request("ask", {"order": "A-1"}, timeout=10)
    assert answer == {"action": "none", "amount": 0.0, "reason": "fine"}


async def test_a_tool_that_raises_goes_back_to_the_model_and_the_loop_goes_on() -> None:
    def replies(request: dict[str, Any]) -> Reply:
        tools = [m for m in request["messages"] if m["role"] == "tool"]
        if not tools:
            return Reply(tool_calls=[{"name": "order_status", "arguments": {"order_id": "Z"}}])
        if len(tools) == 1:  # a wrong argument type, then a tool that does not exist
            return Reply(
                tool_calls=[
                    {"name": "order_status", "arguments": {"order_id": 5}, "id": "bad"},
                    {"name": "delete_everything", "arguments": {}, "id": "nope"},
                ]
            )
        return Reply('{"action": "none", "amount": 0, "reason": "no such order"}')

    with ModelServer(replies) as s:
        async with (
            OpenAIProvider(s.base_url, model="stand-in") as provider,
            agent_harness(
                ModelAgent,
                subscribe=["refund.asked"],
                settings={"output_topic": "refund.decided", "max_tool_errors": 3},
                tools=[order_status],
                output=Verdict,
                provider=provider,
            ) as h,
        ):
            await h.send("refund.asked", {"order": "Z"})
        last = s.requests[-1].body["messages"]
    told = [m["content"] for m in last if m["role"] == "tool"]
    assert told == [
        "Error: KeyError: 'no order Z'",
        "Error: ToolArgumentsInvalid: tool 'order_status' was called with arguments that do "
        "not fit: order_id: Input should be a valid string",
        "Error: there is no tool named 'delete_everything' (tools: order_status)",
    ]
    assert h.published("refund.decided")[0]["reason"] == "no such order"
    # The raising call is recorded as a failed effect; the unknown tool costs none.
    assert [c.error is not None for c in h.calls("tool.order_status")] == [True, True]


async def test_tool_errors_past_the_bound_fail_the_message_with_the_last_error() -> None:
    call = Reply(tool_calls=[{"name": "order_status", "arguments": {"order_id": "Z"}}])
    with ModelServer(call) as s:
        async with (
            OpenAIProvider(s.base_url, model="stand-in") as provider,
            agent_harness(
                ModelAgent,
                subscribe=["refund.asked"],
                settings={"max_tool_errors": 1},
                tools=[order_status],
                provider=provider,
            ) as h,
        ):
            with pytest.raises(AgentFailed) as info:
                await h.send("refund.asked", {"order": "Z"})
        assert len(s.requests) == 2
    [dead] = info.value.dead_letters
    assert dead.error_type == TooManyToolErrors.__name__
    assert "2 tool calls failed (max_tool_errors 1); the last: Error: KeyError" in dead.error


async def test_a_model_that_never_stops_calling_tools_ends_at_max_turns() -> None:
    again = Reply(tool_calls=[{"name": "refund_limit", "arguments": {"status": "x", "paid": 1}}])
    with ModelServer(again) as s:
        async with (
            OpenAIProvider(s.base_url, model="stand-in") as provider,
            agent_harness(
                ModelAgent,
                subscribe=["q"],
                settings={"max_turns": 3, "instructions": "Refunds for {customer}."},
                tools=[refund_limit],
                provider=provider,
            ) as h,
        ):
            with pytest.raises(AgentFailed) as info:
                await h.send("q", {"customer": "Ada"})
            with pytest.raises(AgentFailed) as missing:
                await h.send("q", {"client": "Bo"})
        assert len(s.requests) == 3
    [turns] = info.value.dead_letters
    assert (turns.error_type, turns.error) == (
        "TooManyTurns",
        "model agent 'model': no final answer in max_turns 3 model calls",
    )
    [template] = missing.value.dead_letters
    assert (template.error_type, template.error) == (
        "TemplateError",
        "template field {customer}: the message has no 'customer' (it has client, payload, topic)",
    )


async def test_an_invalid_answer_is_retried_with_the_reasons_then_dead_lettered() -> None:
    bad = Reply('{"action": "refund-ish", "amount": "lots"}')
    with ModelServer(bad) as s:
        async with (
            OpenAIProvider(s.base_url, model="stand-in") as provider,
            agent_harness(
                ModelAgent,
                subscribe=["refund.asked"],
                settings={"max_output_retries": 2, "output_topic": "refund.decided"},
                output=Verdict,
                provider=provider,
            ) as h,
        ):
            with pytest.raises(AgentFailed) as info:
                await h.send("refund.asked", {"order": "A-1"})
        requests = [r.body for r in s.requests]
    assert len(requests) == 3  # the first answer and two retries
    feedback = requests[1]["messages"][-1]
    assert feedback["role"] == "user"
    assert feedback["content"].startswith("Your answer does not fit the required output schema: ")
    assert "action: Input should be 'refund', 'reship' or 'none'" in feedback["content"]
    assert "reason: Field required" in feedback["content"]
    [dead] = info.value.dead_letters
    assert dead.error_type == AnswerInvalid.__name__
    assert dead.error.startswith(
        "model agent 'model': the answer did not fit the output type after 3 tries "
        "(max_output_retries 2): action: Input should be"
    )
    assert h.published("refund.decided") == []


async def test_prose_where_json_was_asked_goes_back_to_the_model_too() -> None:
    replies = [
        Reply("I would refund it."),
        Reply('{"action": "none", "amount": 0, "reason": "ok"}'),
    ]
    with ModelServer(replies) as s:
        async with (
            OpenAIProvider(s.base_url, model="stand-in") as provider,
            agent_harness(
                ModelAgent,
                subscribe=["q"],
                settings={"output_topic": "a"},
                output=Verdict,
                provider=provider,
            ) as h,
        ):
            await h.send("q", {"order": "A-1"})
        told = s.requests[1].body["messages"][-1]
    assert told["role"] == "user"
    assert told["content"].startswith("Your last answer could not be used: JSON was asked of")
    assert "I would refund it." in told["content"]
    assert h.published("a") == [{"action": "none", "amount": 0.0, "reason": "ok"}]
    assert h.calls("model.openai.chat")[0].error is not None


async def test_a_json_schema_output_is_checked_too() -> None:
    schema = {
        "type": "object",
        "properties": {"label": {"enum": ["a", "b"]}, "score": {"type": "number"}},
        "required": ["label", "score"],
        "additionalProperties": False,
    }
    replies = [Reply('{"label": "c", "score": true, "x": 1}'), Reply('{"label": "b", "score": 2}')]
    with ModelServer(replies) as s:
        async with (
            OpenAIProvider(s.base_url, model="stand-in") as provider,
            agent_harness(
                ModelAgent,
                subscribe=["q"],
                settings={"output": schema, "output_topic": "a"},
                provider=provider,
            ) as h,
        ):
            await h.send("q", "label this")
        feedback = s.requests[1].body["messages"][-1]["content"]
    assert "label: must be one of 'a', 'b', not 'c'" in feedback
    assert "score: must be of type number, not boolean" in feedback
    assert "x: not allowed (allowed: label, score)" in feedback
    assert h.published("a") == [{"label": "b", "score": 2}]


class Counter:
    """A ToolSource of one tool, started and closed with the agent."""

    def __init__(self) -> None:
        self.events: list[str] = []

    async def start(self) -> None:
        self.events.append("start")

    def tools(self) -> list[Tool]:
        return [tool(name="count")(lambda text: len(str(text).split()))]

    async def aclose(self) -> None:
        self.events.append("close")


async def test_a_tool_source_is_started_on_first_use_its_tools_offered_and_closed() -> None:
    source = Counter()
    assert isinstance(source, ToolSource)
    replies = [Reply(tool_calls=[{"name": "count", "arguments": {"text": "a b c"}}]), "3 words"]
    replies *= 2
    with ModelServer(replies) as s:
        async with (
            OpenAIProvider(s.base_url, model="stand-in") as provider,
            agent_harness(
                ModelAgent,
                subscribe=["q"],
                settings={"output_topic": "a"},
                tools=[source],
                provider=provider,
            ) as h,
        ):
            assert source.events == [] and h.agent.tool_names == []
            await h.send("q", "count a b c")
            assert source.events == ["start"] and h.agent.tool_names == ["count"]
            await h.send("q", "count a b c")  # started once
        assert [t["function"]["name"] for t in s.requests[0].body["tools"]] == ["count"]
    assert source.events == ["start", "close"]
    assert h.published("a") == [{"answer": "3 words"}] * 2
    assert h.calls("tool.count")[0].result == 3
    assert [c.name for c in h.effects][:3] == ["tools.list", "model.openai.chat", "tool.count"]
    assert h.calls("tools.list")[0].result == [
        {
            "name": "count",
            "description": "",
            "parameters": {
                "type": "object",
                "additionalProperties": False,
                "properties": {"text": {}},
                "required": ["text"],
            },
        }
    ]


# -- declared in a scenario, recorded, replayed with the model server gone ---------------------

MODULE = '''
"""Tools and the answer type of a refund desk (test module)."""
from typing import Literal

from pydantic import BaseModel

from agents import tool

ORDERS = {"A-1": {"status": "delivered", "paid": 40.0}, "A-2": {"status": "lost", "paid": 95.5}}


class Verdict(BaseModel):
    action: Literal["refund", "reship", "none"]
    amount: float
    reason: str


def order_status(order_id: str) -> dict:
    """The shipping status of an order and what was paid for it."""
    return {"order_id": order_id, **ORDERS[order_id]}


async def customer_tier(customer: str) -> str:
    """The customer's loyalty tier: gold, silver or none."""
    await asyncio.sleep(0)
    return {"Cy": "gold"}.get(customer, "silver")


def customer_tier(customer: str) -> str:
    """The customer's loyalty tier."""
    return {"Cy": "gold"}.get(customer, "silver")


async def refund_limit(status: str, paid: float, vip: bool = False) -> float:
    """How much may be refunded for an order in this state."""
    return paid if vip or status == "lost" else 0.0


class Notes:
    """A tool source, as an MCP server is: a replay must not need it."""

    def __init__(self) -> None:
        self.starts = 0
        self.up = True

    async def start(self) -> None:
        if not self.up:
            raise RuntimeError("the notes service is down")
        self.starts += 1

    def tools(self) -> list:
        return [tool(self.note)]

    def note(self, ticket: str) -> str:
        """Note on the ticket that it was handled."""
        return f"noted {ticket}"

    async def aclose(self) -> None:
        pass


NOTES = Notes()
'''

SCENARIO = """\
version: 1
name: refund-desk
input:
  kind: jsonl
  path: asks.jsonl
  topic: refund.asked
agents:
  refunds:
    class: "agents:ModelAgent"
    subscribe: [refund.asked]
    settings:
      instructions: "You handle refunds for {customer}. Use the tools."
      tools:
        - "ma_refund_mod:order_status"
        - "ma_refund_mod:customer_tier"
        - "ma_refund_mod:refund_limit"
        - "ma_refund_mod:NOTES"
      output: "ma_refund_mod:Verdict"
      output_topic: refund.decided
      carry: [ticket]
expect:
  zero_lost: true
  max_dlq: 0
"""


@pytest.fixture
def desk(tmp_path: Path) -> Path:
    (tmp_path / "ma_refund_mod.py").write_text(MODULE, encoding="utf-8")
    asks = [
        {"ticket": "T-1", "customer": "Ada", "order": "A-1"},
        {"ticket": "T-2", "customer": "Bo", "order": "A-2"},
    ]
    (tmp_path / "asks.jsonl").write_text("".join(json.dumps(a) + "\n" for a in asks))
    (tmp_path / "desk.yaml").write_text(SCENARIO, encoding="utf-8")
    return tmp_path


async def test_a_scenario_run_replays_matched_with_the_model_server_stopped(desk: Path) -> None:
    store = desk / "sessions.db"
    with ModelServer(conversation) as server:
        text = SCENARIO + (
            f"provider: {{kind: openai, base_url: '{server.base_url}', model: stand-in}}\n"
        )
        scenario = parse_scenario(text, str(desk / "desk.yaml"), desk)
        summary = await pantheon.run(scenario, store=store)
        assert len(server.requests) == 6  # three turns for each of the two asks
    assert summary.passed, summary.expectations
    with SessionStore(store) as st:
        decided = sorted(
            (e.payload for e in st.envelopes(summary.session_id) if e.topic == "refund.decided"),
            key=lambda p: p["ticket"],
        )
        effects = st.effects(summary.session_id)
    # Numbered per handling in the order the model asked, whichever call finished first.
    for env_id in {e.envelope_id for e in effects}:
        mine = sorted((e.ordinal, e.name) for e in effects if e.envelope_id == env_id)
        assert [name for _, name in mine] == [
            "tools.list",
            "model.openai.chat",
            "tool.order_status",
            "tool.customer_tier",
            "model.openai.chat",
            "tool.refund_limit",
            "tool.note",
            "model.openai.chat",
        ]
    notes = sys.modules["ma_refund_mod"].NOTES
    assert notes.starts == 1
    notes.up = False  # a replay that started it would fail every message
    assert decided == [
        {
            "action": "none",
            "amount": 0.0,
            "reason": "A-1 checked, silver customer",
            "ticket": "T-1",
        },
        {
            "action": "refund",
            "amount": 95.5,
            "reason": "A-2 checked, silver customer",
            "ticket": "T-2",
        },
    ]
    # The server is closed: a live model call would be refused.
    report = await pantheon.replay(summary.session_id, store=store)
    assert report.matched, report.divergence
    assert report.effects_called == 0
    assert report.effects_served == 16  # per ask: a listing, 3 model calls, 4 tool calls
    assert notes.starts == 1


def test_a_scenario_names_a_wrong_tool_or_output_at_load(desk: Path) -> None:
    text = SCENARIO.replace("ma_refund_mod:refund_limit", "ma_refund_mod:nope").replace(
        "ma_refund_mod:Verdict", "ma_refund_mod:order_status"
    )
    with pytest.raises(ScenarioError) as info:
        parse_scenario(text, "desk.yaml", desk)
    message = str(info.value)
    assert "agents.refunds.settings.tools" in message
    assert "module 'ma_refund_mod' has no attribute 'nope'" in message
    assert "agents.refunds.settings.output" in message
    assert "output is a pydantic model" in message
    bad_template = SCENARIO.replace("{customer}", "{customer!r}")
    with pytest.raises(ScenarioError, match="format spec or conversion"):
        parse_scenario(bad_template, "desk.yaml", desk)
    # A model agent on the offline rules provider is refused where it is declared.
    with pytest.raises(ScenarioError, match=r"desk.yaml:9:5: agents.refunds.class: ModelAgent"):
        parse_scenario(SCENARIO, "desk.yaml", desk)
