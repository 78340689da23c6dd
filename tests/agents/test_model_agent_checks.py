"""What a model agent refuses when it is made rather than failing, or checking nothing, later:
an inline JSON schema ``output`` the answer check cannot honour, a tool whose parameter has
no JSON schema or whose docstring describes a parameter it lacks; and, once the model
called a tool with arguments that are not JSON past the bound, a dead letter that says so.
Against the real stand-in model server where a model answers."""

from __future__ import annotations

from typing import Any

import pytest

from agents import (
    AnswerInvalid,
    ModelAgent,
    OpenAIProvider,
    OutputSchemaInvalid,
    ProviderResponseError,
    ToolArgumentsNotJSON,
    ToolError,
    tool,
)
from pantheon.testing import AgentFailed, ModelServer, Reply, agent_harness

TYPES = "JSON Schema's types are object, array, string, integer, number, boolean, null"
CHECKED = (
    "type, properties, required, additionalProperties, items, enum, const, anyOf, minimum, "
    "maximum, minLength, maxLength"
)


def refused(schema: Any) -> list[tuple[tuple[str | int, ...], str]]:
    with pytest.raises(OutputSchemaInvalid) as info:
        ModelAgent("triage", subscribe=["alert.raised"], output=schema)
    return list(info.value.problems)


def test_an_unknown_type_is_refused_not_checked_as_anything() -> None:
    assert refused({"type": "objekt"}) == [
        (("type",), f"unknown type 'objekt' (did you mean 'object'?); {TYPES}")
    ]
    schema = {
        "type": "object",
        "properties": {"action": {"type": "strng"}, "score": {"type": ["number", "nul"]}},
        "items": {"anyOf": [{"type": "string"}, {"type": "int"}]},
    }
    assert refused(schema) == [
        (
            ("properties", "action", "type"),
            f"unknown type 'strng' (did you mean 'string'?); {TYPES}",
        ),
        (("properties", "score", "type", 1), f"unknown type 'nul' (did you mean 'null'?); {TYPES}"),
        (
            ("items", "anyOf", 1, "type"),
            f"unknown type 'int' (did you mean 'integer'?); {TYPES}",
        ),
    ]


def test_a_keyword_the_check_would_skip_is_refused_and_a_misspelt_one_named() -> None:
    schema = {
        "type": "object",
        "title": "Triage",  # an annotation: sent to the model, nothing to check
        "properties": {
            "action": {"type": "string", "pattern": "^(restart|ignore)$", "description": "x"},
            "level": {"type": "integer", "minimun": 1},
        },
        "requried": ["action"],
    }
    assert refused(schema) == [
        (
            ("properties", "action", "pattern"),
            "'pattern' is not applied by the inline schema check, so answers would pass it "
            f"unchecked; it checks {CHECKED}. "
            'For more, give a pydantic model (output: "module:Model")',
        ),
        (
            ("properties", "level", "minimun"),
            f"unknown keyword 'minimun' (did you mean 'minimum'?); it checks {CHECKED}",
        ),
        (
            ("requried",),
            f"unknown keyword 'requried' (did you mean 'required'?); it checks {CHECKED}",
        ),
    ]


def test_a_keyword_of_the_wrong_shape_is_refused() -> None:
    schema = {
        "type": "object",
        "properties": {"a": "string", "b": {"type": None}, "c": {"enum": []}},
        "required": "a",
        "items": [{"type": "string"}],
        "maxLength": -1,
    }
    assert refused(schema) == [
        (("properties", "a"), "a schema here is a mapping (e.g. {type: string}), not 'string'"),
        (
            ("properties", "b", "type"),
            "type null is written 'null' (quoted): unquoted, YAML reads no value",
        ),
        (("properties", "c", "enum"), "enum is a list of the allowed values"),
        (("required",), "required is a list of field names"),
        (
            ("items",),
            "items as a list (a schema per position) is not applied by the inline schema "
            "check; give one schema for every item, or a pydantic model",
        ),
        (("maxLength",), "maxLength is a whole number of characters (0 or more), not -1"),
    ]
    assert refused({"properties": {}}) == [
        ((), "a JSON schema for output needs a 'type' (e.g. type: object)")
    ]


def test_the_error_names_every_problem_with_its_path() -> None:
    with pytest.raises(OutputSchemaInvalid) as info:
        schema = {"type": "objekt", "properties": {"a": {"type": "strng"}}}
        ModelAgent("triage", subscribe=["alert.raised"], output=schema)
    assert isinstance(info.value, ValueError)
    assert str(info.value) == (
        f"the output schema cannot be checked: type: unknown type 'objekt' (did you mean "
        f"'object'?); {TYPES}; properties.a.type: unknown type 'strng' (did you mean "
        f"'string'?); {TYPES}"
    )


async def test_an_additional_properties_schema_is_applied_to_the_other_fields() -> None:
    schema = {
        "type": "object",
        "properties": {"action": {"enum": ["restart", "ignore"]}},
        "additionalProperties": {"type": "integer"},
    }
    replies = [
        Reply('{"action": "ignore", "web1": "high"}'),
        Reply('{"action": "ignore", "web1": 3}'),
    ]
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
            await h.send("q", "how loaded is web1?")
        feedback = s.requests[1].body["messages"][-1]["content"]
    assert feedback == (
        "Your answer does not fit the required output schema: web1: must be of type integer, "
        "not string. Answer again with JSON that fits it."
    )
    assert h.published("a") == [{"action": "ignore", "web1": 3}]


# -- tools whose definition is wrong -----------------------------------------------------------


class Host:
    """A plain class: pydantic has no schema for it."""

    def __init__(self, name: str) -> None:
        self.name = name


def by_host(host: Host, lines: int = 3) -> dict[str, Any]:
    """Takes a plain class.

    Args:
        host: The host.
        lines: How many.
    """
    return {}


def by_hosts(names: list[str], hosts: list[Host]) -> dict[str, Any]:
    """Takes a list of a plain class."""
    return {}


def misdocumented(host: str, service: str) -> dict[str, Any]:
    """Disk usage.

    Args:
        hostname: The host.
        service: The service.
        lines: How many lines.
    """
    return {}


SCHEMA_TYPES = (
    "str, int, float, bool, None, a list or dict of those, Literal[...], an Enum, a TypedDict, "
    "a dataclass or a pydantic model"
)


def test_a_parameter_typed_with_a_plain_class_is_one_line_naming_it() -> None:
    with pytest.raises(ToolError) as info:
        tool(by_host)
    assert str(info.value) == (
        f"tool 'by_host' ({__name__}:by_host): parameter 'host' is typed {__name__}.Host, which "
        f"has no JSON schema to show the model; type it with {SCHEMA_TYPES}"
    )
    with pytest.raises(ToolError) as info:
        tool(name="hosts")(by_hosts)
    assert str(info.value) == (
        f"tool 'hosts' ({__name__}:by_hosts): parameter 'hosts' is typed "
        f"list[{__name__}.Host], which has no JSON schema to show the model; type it with "
        f"{SCHEMA_TYPES}"
    )


def test_a_docstring_describing_a_parameter_the_function_lacks_is_refused() -> None:
    with pytest.raises(ToolError) as info:
        tool(misdocumented)
    assert str(info.value) == (
        f"tool 'misdocumented' ({__name__}:misdocumented): its docstring describes 'hostname' "
        "(did you mean 'host'?), 'lines' under Args:, but the function has no such parameter "
        "(its parameters: host, service)"
    )


# -- a tool call whose arguments are not JSON --------------------------------------------------


def disk_usage(host: str) -> dict[str, Any]:
    """Disk usage of a host, in percent.

    Args:
        host: The host name, e.g. "web1".
    """
    return {"host": host, "disk_pct": 50}


async def test_tool_arguments_that_are_not_json_are_named_in_the_heading_too() -> None:
    called = Reply(tool_calls=[{"name": "disk_usage", "arguments": "host=web1"}])
    with ModelServer(called) as s:
        async with (
            OpenAIProvider(s.base_url, model="stand-in") as provider,
            agent_harness(
                ModelAgent,
                subscribe=["alert.raised"],
                tools=[disk_usage],
                settings={"max_output_retries": 1, "output_topic": "alert.triaged"},
                provider=provider,
            ) as h,
        ):
            with pytest.raises(AgentFailed) as info:
                await h.send("alert.raised", {"host": "web1"})
        told = s.requests[1].body["messages"][-1]["content"]
        url = f"{s.base_url}/chat/completions"
    detail = f"{url} called tool 'disk_usage' with arguments that are not JSON: host=web1"
    assert told == f"Your last answer could not be used: {detail}. Answer again."
    [dead] = info.value.dead_letters
    assert dead.error_type == AnswerInvalid.__name__
    assert dead.error == (
        "model agent 'model': the model called a tool with arguments that are not JSON after "
        f"2 tries (max_output_retries 1): {detail}"
    )
    [call, _] = h.calls("model.openai.chat")
    assert isinstance(call.error, ToolArgumentsNotJSON)
    assert isinstance(call.error, ProviderResponseError)  # what callers caught before


async def test_an_answer_that_does_not_fit_keeps_its_own_heading() -> None:
    with ModelServer(Reply('{"action": 1}')) as s:
        async with (
            OpenAIProvider(s.base_url, model="stand-in") as provider,
            agent_harness(
                ModelAgent,
                subscribe=["q"],
                settings={"max_output_retries": 0, "output": {"type": "array"}},
                provider=provider,
            ) as h,
        ):
            with pytest.raises(AgentFailed) as info:
                await h.send("q", "list them")
    [dead] = info.value.dead_letters
    assert dead.error == (
        "model agent 'model': the answer did not fit the output type after 1 tries "
        "(max_output_retries 0): the answer: must be of type array, not object"
    )
