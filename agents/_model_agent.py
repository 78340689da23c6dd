"""The model agent: instructions, a model, tools and an answer type, looping until done.

Each message it handles starts one conversation: the ``instructions`` (rendered over the
message) as the system message, the ``prompt`` (or the payload) as the user's, then turns:
the model is asked (:meth:`agents.Agent.chat`, the recorded ``model.<provider>.chat``
effect) with the tools' schemas; every tool it calls runs as the recorded effect
``tool.<name>`` and its result (or its error) goes back to it; when it answers without
calling a tool, the answer is checked against ``output`` (a pydantic model or a JSON
schema), and on success published to ``output_topic`` and returned (so a ``request`` gets
it). An answer that does not fit, or that the provider could not use at all (prose where
JSON was asked), goes back to the model with the reasons, a bounded number of times.
Since every model and tool call is an effect, a session replays with the model server and
the tools' services stopped, and a what-if can change the instructions.

Tool sources (:class:`~agents.ToolSource`, an MCP server for one) start on the first
message handled live, not when the agent starts, and each message records their tool list
as the effect ``tools.list``: a replay offers the model the same tools without them. A
start that fails fails that message with its cause, and the next message tries again.
:meth:`ModelAgent.stop` closes them once no handling uses them, and they are never started
again by a stopping agent: a message that needs them after that fails with
:class:`AgentStopping`, which a resume runs again live rather than serving.

Bounds, each a setting: ``max_turns`` model calls per message, ``max_tool_errors`` failed
tool calls, ``max_output_retries`` answers that do not fit. Past one, the message fails with
the error below, and the bus retries or dead-letters it with that reason. A failed tool call
(a Python tool's exception, an MCP tool's error result or timeout) goes back to the model as
the tool's result; an MCP server that is gone (:class:`agents.MCPServerUnavailable`) fails
the message at once with that error instead.

Errors (a branch of :class:`agents.AgentError`)::

    ModelAgentError                a conversation could not finish
    ├── AnswerInvalid              the answer did not fit ``output`` (or called a tool with
    │                              arguments that are not JSON), every time it was asked
    ├── TooManyTurns               ``max_turns`` model calls without a final answer
    ├── TooManyToolErrors          more tool calls failed than ``max_tool_errors``
    ├── TemplateError              the instructions or prompt name a field the message lacks
    ├── OutputSchemaInvalid        an inline JSON schema ``output`` the answer check cannot honour
    └── AgentStopping              a message needed the tool sources after the agent's stop
"""

from __future__ import annotations

import asyncio
import json
import string
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from agents._base import Agent, AgentSettings
from agents._errors import AgentError
from agents._mcp import MCPServerUnavailable
from agents._providers import ChatResult, ProviderResponseError, ToolArgumentsNotJSON, ToolCall
from agents._tools import (
    Tool,
    ToolError,
    ToolSource,
    _did_you_mean,
    _load,
    load_tools,
    tool_schema,
)
from bus import Envelope

__all__ = [
    "AgentStopping",
    "AnswerInvalid",
    "ModelAgent",
    "ModelAgentError",
    "OutputSchemaInvalid",
    "Template",
    "TemplateError",
    "TooManyToolErrors",
    "TooManyTurns",
]

#: Characters of a tool's result or error kept in the conversation; a longer one is cut
#: with a note, so one huge result cannot crowd everything else out of the model's context.
MAX_TOOL_RESULT = 16_000


class ModelAgentError(AgentError, RuntimeError):
    """A model agent's conversation could not finish."""


class AnswerInvalid(ModelAgentError):
    """The model's answer could not be used, as many times as it was allowed: it did not fit
    the output type, or it called a tool with arguments that are not JSON (the message says
    which the last one did)."""


class TooManyTurns(ModelAgentError):
    """The model was asked ``max_turns`` times and still called tools."""


class TooManyToolErrors(ModelAgentError):
    """More tool calls failed in one conversation than ``max_tool_errors``."""


class TemplateError(ModelAgentError, ValueError):
    """A template is malformed, or names a field the message does not have."""


class AgentStopping(ModelAgentError):
    """A message needed the agent's tool sources after its :meth:`~ModelAgent.stop` closed
    them (or before any was started): a stopping agent starts none again. An artifact of
    the shutdown, not an answer of the tools: a resume runs the call again, live, instead of
    serving the recorded failure."""


class Template:
    """``str.format``-style text over a message's fields, without its attribute and index
    access: ``{customer.name}`` reads key ``name`` of the mapping ``customer``, never an
    attribute, so a template from a scenario file cannot reach into Python objects.
    ``{{`` and ``}}`` are literal braces. A field that is a mapping or a list renders as
    JSON; a missing one raises :class:`TemplateError` naming it."""

    __slots__ = ("_parts", "text")

    def __init__(self, text: str) -> None:
        self.text = text
        parts: list[tuple[str, tuple[str, ...] | None]] = []
        try:
            for literal, field, spec, conversion in string.Formatter().parse(text):
                if field is None:
                    parts.append((literal, None))
                    continue
                if spec or conversion:
                    raise TemplateError(
                        f"template field {{{field}}} has a format spec or conversion; "
                        "write plain {name} fields"
                    )
                path = tuple(field.split("."))
                if not field or any(not p.isidentifier() for p in path):
                    raise TemplateError(
                        f"template field {{{field}}} is not a name or a dotted path of names"
                    )
                parts.append((literal, path))
        except ValueError as exc:
            if isinstance(exc, TemplateError):
                raise
            raise TemplateError(f"template {text!r} is malformed: {exc}") from None
        self._parts = tuple(parts)

    def render(self, fields: Mapping[str, Any]) -> str:
        out: list[str] = []
        for literal, path in self._parts:
            out.append(literal)
            if path is None:
                continue
            value: Any = fields
            for i, key in enumerate(path):
                if not isinstance(value, Mapping) or key not in value:
                    where = ".".join(path[: i + 1])
                    have = ", ".join(sorted(map(str, value))) if isinstance(value, Mapping) else ""
                    raise TemplateError(
                        f"template field {{{'.'.join(path)}}}: the message has no {where!r}"
                        + (f" (it has {have})" if have else "")
                    )
                value = value[key]
            out.append(_text(value))
        return "".join(out)


def _text(value: Any) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(value, ensure_ascii=False, default=str)


class OutputSchemaInvalid(ModelAgentError, ValueError):
    """A JSON schema given as ``output`` that the answer check cannot honour: an unknown
    type, a keyword it does not apply, a value of the wrong shape. Refused when the agent is
    made (a scenario: at load, each problem on its own line), because an answer checked
    against a schema the check half-understands would pass unchecked. ``problems`` holds
    each as (its path in the schema, what is wrong)."""

    def __init__(self, problems: Sequence[tuple[tuple[str | int, ...], str]]) -> None:
        self.problems = tuple(problems)
        super().__init__(
            "the output schema cannot be checked: "
            + "; ".join(f"{_schema_path(at) or 'output'}: {what}" for at, what in self.problems)
        )


def _schema_path(at: tuple[str | int, ...]) -> str:
    return "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in at).lstrip(".")


class _JsonSchemaCheck:
    """The subset of JSON Schema a structured answer is usually given in (``type``,
    ``properties``, ``required``, ``additionalProperties``, ``items``, ``enum``, ``const``,
    ``anyOf``, ``minimum``/``maximum``, ``minLength``/``maxLength``), checked without a
    dependency; for anything richer give a pydantic model.

    A schema is read whole when the check is made, and one it cannot honour (an unknown
    type, a keyword outside the subset, a keyword's value of the wrong shape) raises
    :class:`OutputSchemaInvalid`: a misspelt ``type: strng`` would otherwise check nothing,
    and every answer would pass."""

    _TYPES: ClassVar[dict[str, tuple[type, ...]]] = {
        "object": (dict,),
        "array": (list,),
        "string": (str,),
        "integer": (int,),
        "number": (int, float),
        "boolean": (bool,),
        "null": (type(None),),
    }
    #: The keywords :meth:`problems` applies.
    CHECKED: ClassVar[tuple[str, ...]] = (
        "type",
        "properties",
        "required",
        "additionalProperties",
        "items",
        "enum",
        "const",
        "anyOf",
        "minimum",
        "maximum",
        "minLength",
        "maxLength",
    )
    #: Keywords that describe and never constrain: sent to the model, not checked.
    _ANNOTATIONS: ClassVar[frozenset[str]] = frozenset(
        {"title", "description", "default", "examples", "$schema", "$id", "$comment",
         "deprecated", "readOnly", "writeOnly"}
    )  # fmt: skip
    #: JSON Schema keywords that constrain an answer but that this check does not apply.
    _UNCHECKED: ClassVar[frozenset[str]] = frozenset(
        {"allOf", "oneOf", "not", "if", "then", "else", "$ref", "$defs", "definitions",
         "$anchor", "$dynamicRef", "$dynamicAnchor", "pattern", "format", "multipleOf",
         "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "uniqueItems",
         "contains", "minContains", "maxContains", "prefixItems", "additionalItems",
         "minProperties", "maxProperties", "patternProperties", "propertyNames",
         "dependentRequired", "dependentSchemas", "dependencies", "unevaluatedProperties",
         "unevaluatedItems", "contentEncoding", "contentMediaType", "contentSchema"}
    )  # fmt: skip

    def __init__(self, schema: Mapping[str, Any]) -> None:
        found = self.schema_problems(schema)
        if found:
            raise OutputSchemaInvalid(found)
        self.schema = dict(schema)

    @classmethod
    def schema_problems(cls, schema: Any) -> list[tuple[tuple[str | int, ...], str]]:
        """What keeps ``schema`` from being checked as written, each with its path in it."""
        if not isinstance(schema, Mapping):
            return [((), f"a JSON schema is a mapping, not {type(schema).__name__}")]
        out = cls._subschema_problems(schema, ())
        if "type" not in schema and "anyOf" not in schema:
            out.insert(0, ((), "a JSON schema for output needs a 'type' (e.g. type: object)"))
        return out

    @classmethod
    def _subschema_problems(
        cls, s: Any, at: tuple[str | int, ...]
    ) -> list[tuple[tuple[str | int, ...], str]]:
        if not isinstance(s, Mapping):
            return [(at, f"a schema here is a mapping (e.g. {{type: string}}), not {s!r}")]
        out: list[tuple[tuple[str | int, ...], str]] = []
        for key, value in s.items():
            here = (*at, key)
            if key in cls._ANNOTATIONS:
                continue
            if key in cls._UNCHECKED:
                out.append(
                    (
                        here,
                        f"{key!r} is not applied by the inline schema check, so answers "
                        f"would pass it unchecked; it checks {', '.join(cls.CHECKED)}. "
                        'For more, give a pydantic model (output: "module:Model")',
                    )
                )
            elif key not in cls.CHECKED:
                hint = _did_you_mean(str(key), [*cls.CHECKED, *cls._UNCHECKED])
                out.append(
                    (here, f"unknown keyword {key!r}{hint}; it checks {', '.join(cls.CHECKED)}")
                )
            else:
                out += cls._keyword_problems(str(key), value, here)
        return out

    @classmethod
    def _keyword_problems(
        cls, key: str, value: Any, here: tuple[str | int, ...]
    ) -> list[tuple[tuple[str | int, ...], str]]:
        types = ", ".join(cls._TYPES)
        if key == "type":
            if value is None:
                return [
                    (here, "type null is written 'null' (quoted): unquoted, YAML reads no value")
                ]
            kinds = value if isinstance(value, list) else [value]
            if not kinds:
                return [(here, f"an empty list of types; JSON Schema's types are {types}")]
            return [
                (
                    (*here, i) if isinstance(value, list) else here,
                    f"unknown type {k!r}{_did_you_mean(str(k), cls._TYPES)}; "
                    f"JSON Schema's types are {types}",
                )
                for i, k in enumerate(kinds)
                if not isinstance(k, str) or k not in cls._TYPES
            ]
        if key == "properties":
            if not isinstance(value, Mapping):
                return [(here, "properties is a mapping of field name to schema")]
            return [
                p
                for name, sub in value.items()
                for p in cls._subschema_problems(sub, (*here, name))
            ]
        if key == "required":
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                return [(here, "required is a list of field names")]
            return []
        if key == "additionalProperties":
            if isinstance(value, bool):
                return []
            return cls._subschema_problems(value, here)
        if key == "items":
            if not isinstance(value, list):
                return cls._subschema_problems(value, here)
            return [
                (
                    here,
                    "items as a list (a schema per position) is not applied by the inline "
                    "schema check; give one schema for every item, or a pydantic model",
                )
            ]
        if key == "enum":
            if not isinstance(value, list) or not value:
                return [(here, "enum is a list of the allowed values")]
            return []
        if key == "anyOf":
            if not isinstance(value, list) or not value:
                return [(here, "anyOf is a list of schemas, one of which the answer must fit")]
            return [
                p for i, sub in enumerate(value) for p in cls._subschema_problems(sub, (*here, i))
            ]
        if key in ("minimum", "maximum"):
            if isinstance(value, bool) or not isinstance(value, int | float):
                return [(here, f"{key} is a number, not {value!r}")]
            return []
        if key in ("minLength", "maxLength"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                return [(here, f"{key} is a whole number of characters (0 or more), not {value!r}")]
            return []
        return []  # const: any value

    def problems(
        self, value: Any, schema: Mapping[str, Any] | None = None, at: str = ""
    ) -> list[str]:
        """What is wrong with ``value`` (at path ``at``), one line each; empty: it fits."""
        s = self.schema if schema is None else schema
        where = at or "the answer"
        if "anyOf" in s and all(self.problems(value, sub, at) for sub in s["anyOf"]):
            return [f"{where}: matches none of the allowed shapes"]
        if "const" in s and value != s["const"]:
            return [f"{where}: must be {s['const']!r}"]
        if "enum" in s and value not in s["enum"]:
            return [f"{where}: must be one of {', '.join(map(repr, s['enum']))}, not {value!r}"]
        kind = s.get("type")
        if kind is not None:
            kinds = kind if isinstance(kind, list) else [kind]
            # Every name is one of _TYPES: the schema was read whole when the check was made.
            ok = any(
                isinstance(value, self._TYPES[k])
                and not (isinstance(value, bool) and k in ("integer", "number"))
                for k in kinds
            )
            if not ok:
                return [f"{where}: must be of type {' or '.join(kinds)}, not {_json_type(value)}"]
        out: list[str] = []
        if isinstance(value, dict):
            props = s.get("properties") or {}
            prefix = f"{at}." if at else ""
            out += [
                f"{prefix}{name}: required, missing"
                for name in s.get("required") or ()
                if name not in value
            ]
            extra = s.get("additionalProperties")
            for name, item in value.items():
                sub = f"{at}.{name}" if at else str(name)
                if name in props:
                    out += self.problems(item, props[name], sub)
                elif extra is False:
                    out.append(f"{sub}: not allowed (allowed: {', '.join(props)})")
                elif isinstance(extra, Mapping):
                    out += self.problems(item, extra, sub)
        elif isinstance(value, list) and isinstance(s.get("items"), Mapping):
            for i, item in enumerate(value):
                out += self.problems(item, s["items"], f"{at}[{i}]")
        elif isinstance(value, int | float) and not isinstance(value, bool):
            if "minimum" in s and value < s["minimum"]:
                out.append(f"{where}: must be at least {s['minimum']}")
            if "maximum" in s and value > s["maximum"]:
                out.append(f"{where}: must be at most {s['maximum']}")
        elif isinstance(value, str):
            if "minLength" in s and len(value) < s["minLength"]:
                out.append(f"{where}: must have at least {s['minLength']} characters")
            if "maxLength" in s and len(value) > s["maxLength"]:
                out.append(f"{where}: must have at most {s['maxLength']} characters")
        return out


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    for name, types in _JsonSchemaCheck._TYPES.items():
        if isinstance(value, types):
            return name
    return type(value).__name__


#: The output type: a pydantic model class, or a JSON schema.
Output = type[BaseModel] | Mapping[str, Any]


def _resolve_output(value: Any) -> Output | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = _load(value)
    if isinstance(value, type) and issubclass(value, BaseModel):
        return value
    if isinstance(value, Mapping):
        return _JsonSchemaCheck(value).schema  # OutputSchemaInvalid: it cannot be checked
    raise ValueError(
        "output is a pydantic model (or its import path 'module:Model') or a JSON schema, "
        f"not {type(value).__name__}"
    )


class ModelAgent(Agent):
    """An agent that thinks with a model and acts with tools (see the module docstring).

    Declared in a scenario with ``class: "agents:ModelAgent"``, ``subscribe:`` and its
    settings (tools and output by import path, or output as an inline JSON schema), or
    subclassed in Python with ``tools`` and ``output`` as class attributes (functions,
    :class:`~agents.Tool`\\ s, :class:`~agents.ToolSource`\\ s; a pydantic model), which
    the settings' add to (tools) or replace (output). ``tools=`` and ``output=`` given to the
    constructor do the same."""

    role = "model"
    uses_model = True
    #: Tools every instance has: functions, Tools, ToolSources or import paths.
    tools: ClassVar[Sequence[Any]] = ()
    #: The answer's type: a pydantic model or a JSON schema; None: the answer's text.
    output: ClassVar[Output | str | None] = None

    class Settings(AgentSettings):
        """What a scenario sets. ``instructions`` and ``prompt`` are :class:`Template`\\ s
        over the message's payload fields (plus ``payload``, the whole payload as text, and
        ``topic``); without ``prompt`` the user message is the payload as text."""

        model_config = ConfigDict(frozen=True, extra="forbid", arbitrary_types_allowed=True)

        instructions: str = ""
        prompt: str | None = None
        #: Import paths "module:name" of functions, Tools or ToolSources (or the objects).
        tools: tuple[Any, ...] = ()
        #: A pydantic model's import path, the model, or a JSON schema.
        output: Any = None
        #: Where the validated answer is published; a handoff is a topic another agent
        #: subscribes to. None: only returned (to a request).
        output_topic: str | None = None
        #: Payload fields copied into the published answer (e.g. the item's id).
        carry: tuple[str, ...] = ()
        max_turns: int = Field(8, ge=1)
        max_tool_errors: int = Field(3, ge=0)
        max_output_retries: int = Field(2, ge=0)
        #: Run the tool calls of one model answer concurrently (each still its own effect,
        #: numbered in the order the model gave them, so a replay serves each its own).
        parallel_tools: bool = True
        temperature: float | None = None
        max_tokens: int | None = Field(None, ge=1)

        @field_validator("instructions", "prompt")
        @classmethod
        def _template(cls, value: str | None) -> str | None:
            if value is not None:
                try:
                    Template(value)
                except TemplateError as exc:
                    raise ValueError(str(exc)) from None
            return value

        @field_validator("tools")
        @classmethod
        def _tools(cls, value: tuple[Any, ...]) -> tuple[Any, ...]:
            try:
                load_tools(value)
            except ToolError as exc:
                raise ValueError(str(exc)) from None
            return value

        @field_validator("output")
        @classmethod
        def _output(cls, value: Any) -> Any:
            try:
                _resolve_output(value)
            except ToolError as exc:
                raise ValueError(str(exc)) from None
            return value

    def __init__(
        self,
        name: str | None = None,
        *,
        tools: Sequence[Any] = (),
        output: Output | str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(name, **kwargs)
        if not self.subscriptions:
            raise ValueError(
                f"model agent {self.name!r} subscribes to nothing: give it subscribe: "
                "(the topics whose messages it answers)"
            )
        s = self.settings
        self._instructions = Template(s.instructions)
        self._prompt = None if s.prompt is None else Template(s.prompt)
        self._given = load_tools([*type(self).tools, *s.tools, *tools])
        chosen = next((o for o in (output, s.output, type(self).output) if o is not None), None)
        self._output = _resolve_output(chosen)
        self._check = _JsonSchemaCheck(self._output) if isinstance(self._output, Mapping) else None
        #: The tools known at construction (functions, Tools), by name.
        self._tools: dict[str, Tool] = {}
        self._sources: list[ToolSource] = []
        for item in self._given:
            if isinstance(item, ToolSource):
                self._sources.append(item)
            else:
                self._add(self._tools, item)
        self._schemas = [tool_schema(t) for t in self._tools.values()]
        #: The sources' tools by name once they are started (on the first live listing).
        self._source_tools: dict[str, Tool] | None = None
        self._starting = asyncio.Lock()
        #: Handlings under way: the sources are closed only once none is (see :meth:`stop`).
        self._handling = 0
        #: Set by :meth:`stop`, cleared by :meth:`start`: no source is started meanwhile.
        self._stopping = False
        self._through_sources = _SourceCalls(self)

    def _add(self, into: dict[str, Tool], t: Tool) -> None:
        if t.name in self._tools or t.name in into:
            raise ToolError(f"model agent {self.name!r} has two tools named {t.name!r}")
        into[t.name] = t

    async def start(self) -> None:
        """Ready to handle messages; after a :meth:`stop`, the next message handled live
        starts the tool sources again."""
        self._stopping = False
        await super().start()

    async def stop(self) -> None:
        """Close the tool sources it started, once no handling uses them, and start none
        again until :meth:`start`.

        The runtime stops the agents and then drains the bus, so a handling may be under way
        (a node whose driver died stops with messages in flight): it keeps the sources open
        to its end, its tool calls answered, and the last such handling closes them (the
        drain waits for it). With none under way they are closed before this returns. A
        message that needs the sources once they are closed fails at once with
        :class:`AgentStopping` rather than starting them again (nothing would close them)."""
        self._stopping = True
        if not self._handling:
            await self._close_sources()

    async def _close_sources(self) -> None:
        if self._source_tools is None:
            return
        # Unset before the first await: a handling that starts meanwhile finds them closed.
        self._source_tools = None
        await _close_all(self._sources)

    async def _started(self) -> dict[str, Tool]:
        """The sources' tools, starting the sources on first use. Not at :meth:`start`: a
        replay serves the listing and every call from the record, and must not need the
        sources' servers at all. A start that fails closes those it had started (nothing is
        left running) and raises its error, which the next message's start tries again."""
        async with self._starting:
            if self._source_tools is None:
                if self._stopping:
                    raise AgentStopping(
                        f"model agent {self.name!r} is stopping: its tool sources are closed "
                        "and a stopping agent does not start them again"
                    )
                found: dict[str, Tool] = {}
                started: list[ToolSource] = []
                try:
                    for source in self._sources:
                        await source.start()
                        started.append(source)
                        for t in source.tools():
                            self._add(found, t)
                except BaseException:
                    try:
                        await _close_all(started)
                    except Exception:
                        self.log.warning("closing the tool sources failed", exc_info=True)
                    raise
                self._source_tools = found
            return self._source_tools

    async def _list_sources(self) -> list[dict[str, Any]]:
        return [
            {"name": t.name, "description": t.description, "parameters": t.parameters}
            for t in (await self._started()).values()
        ]

    async def _call_source_tool(self, name: str, arguments: dict[str, Any]) -> Any:
        return await (await self._started())[name](arguments)

    @property
    def tool_names(self) -> list[str]:
        """The names of the tools the model is offered, in the order it is shown them: the
        sources' only once they are started (by the first message handled live)."""
        return [*self._tools, *(self._source_tools or {})]

    def response_format(self) -> dict[str, Any] | None:
        """What ``chat(response_format=...)`` is given: the output type's JSON schema."""
        if self._output is None:
            return None
        if isinstance(self._output, Mapping):
            schema, title = dict(self._output), f"{self.name}_answer"
        else:
            schema, title = self._output.model_json_schema(), self._output.__name__
        name = "".join(c if c.isalnum() or c in "_-" else "_" for c in title)[:64]
        return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}

    def messages(self, env: Envelope) -> list[dict[str, Any]]:
        """The conversation's start for ``env``: the system and the user message."""
        payload = env.payload
        text = _text(payload)
        fields: dict[str, Any] = {"payload": text, "topic": env.topic}
        if isinstance(payload, Mapping):
            fields.update(payload)
        out: list[dict[str, Any]] = []
        system = self._instructions.render(fields)
        if system:
            out.append({"role": "system", "content": system})
        prompt = text if self._prompt is None else self._prompt.render(fields)
        out.append({"role": "user", "content": prompt})
        return out

    async def handle(self, env: Envelope) -> Any:
        self._handling += 1
        try:
            return await self._converse(env)
        finally:
            self._handling -= 1
            if self._stopping and not self._handling:
                # The last handling of a stopping agent: the sources' time is up.
                try:
                    await self._close_sources()
                except Exception:
                    # Not this message's failure: it has its outcome already.
                    self.log.warning("closing the tool sources failed", exc_info=True)

    async def _converse(self, env: Envelope) -> Any:
        """One message's conversation (see the module docstring)."""
        s = self.settings
        messages = self.messages(env)
        options: dict[str, Any] = {}
        schemas = self._schemas
        listed: set[str] = set()
        if self._sources:
            # The sources' tools as this handling saw them, recorded: what the model was
            # offered replays without the sources, and a source whose tools changed
            # between messages (a restarted MCP server) is seen changing.
            specs = await self.effect("tools.list", self._through_sources.list)
            listed = {str(spec["name"]) for spec in specs}
            schemas = [*schemas, *({"type": "function", "function": dict(x)} for x in specs)]
        if schemas:
            options["tools"] = schemas
        fmt = self.response_format()
        if fmt is not None:
            options["response_format"] = fmt
        if s.temperature is not None:
            options["temperature"] = s.temperature
        if s.max_tokens is not None:
            options["max_tokens"] = s.max_tokens
        tool_errors = 0
        invalid = 0
        for _turn in range(s.max_turns):
            try:
                result = await self.chat(messages, **options)
            except ProviderResponseError as exc:
                if exc.status is not None:
                    raise  # the server failed, not the model's answer
                # An answer the provider could not use (prose where JSON was asked, tool
                # arguments that are not JSON): the model's mistake, so it is told, like an
                # answer that does not fit. A replay rebuilds the same error (status None).
                invalid += 1
                unusable = (
                    "the model called a tool with arguments that are not JSON"
                    if isinstance(exc, ToolArgumentsNotJSON)
                    else None
                )
                self._give_up_after(invalid, [str(exc)], unusable)
                messages.append(
                    {
                        "role": "user",
                        "content": f"Your last answer could not be used: {exc}. Answer again.",
                    }
                )
                continue
            if result.tool_calls:
                messages.append(_assistant(result))
                calls = result.tool_calls
                if s.parallel_tools and len(calls) > 1:
                    # Each task takes its effect's ordinal before its first await, and tasks
                    # first run in creation order: the numbering is the model's order. Every
                    # call ends (and is recorded) before a server's death fails the message.
                    ran = await asyncio.gather(
                        *(self._run_tool(c, listed) for c in calls), return_exceptions=True
                    )
                    for item in ran:
                        if isinstance(item, BaseException):
                            raise item
                    done = [item for item in ran if not isinstance(item, BaseException)]
                else:
                    done = [await self._run_tool(c, listed) for c in calls]
                for call, (content, failed) in zip(calls, done, strict=True):
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": content})
                    if failed:
                        tool_errors += 1
                        if tool_errors > s.max_tool_errors:
                            raise TooManyToolErrors(
                                f"model agent {self.name!r}: {tool_errors} tool calls failed "
                                f"(max_tool_errors {s.max_tool_errors}); the last: {content}"
                            )
                continue
            answer, problems = self._validate(result)
            if not problems:
                return await self._publish(env, answer)
            invalid += 1
            self._give_up_after(invalid, problems)
            messages.append({"role": "assistant", "content": result.content or ""})
            messages.append(
                {
                    "role": "user",
                    "content": "Your answer does not fit the required output schema: "
                    + "; ".join(problems)
                    + ". Answer again with JSON that fits it.",
                }
            )
        raise TooManyTurns(
            f"model agent {self.name!r}: no final answer in max_turns {s.max_turns} model calls"
        )

    def _give_up_after(self, invalid: int, problems: list[str], what: str | None = None) -> None:
        """Fail the message once ``invalid`` answers could not be used; ``what`` names the
        last one's trouble when it was not the answer's fit (tool arguments not JSON)."""
        retries = self.settings.max_output_retries
        if invalid > retries:
            raise AnswerInvalid(
                f"model agent {self.name!r}: {what or 'the answer did not fit the output type'} "
                f"after {invalid} tries (max_output_retries {retries}): " + "; ".join(problems)
            )

    async def _run_tool(self, call: ToolCall, listed: set[str]) -> tuple[str, bool]:
        """The tool message's content for ``call``, and whether the call failed. An unknown
        tool costs no effect: the answer is known without calling anything."""
        name = call.name
        arguments = dict(call.arguments)
        try:
            if name in self._tools:
                result = await self.effect(f"tool.{name}", self._tools[name], arguments)
            elif name in listed:
                result = await self.effect(
                    f"tool.{name}", self._through_sources.call, name, arguments
                )
            else:
                have = ", ".join([*self._tools, *sorted(listed)]) or "none"
                return f"Error: there is no tool named {name!r} (tools: {have})", True
        except (MCPServerUnavailable, AgentStopping):
            # The server is gone (or closed for the agent's stop): no answer the model could
            # act on, and every later call would fail alike. The message fails, dead-lettered
            # with this reason.
            raise
        except Exception as exc:
            # Named by the type's own name and message, which a replay rebuilds the same
            # (pantheon.sessions.rebuild_error), so the model is told the same words. An MCP
            # tool's error or timeout is one of these: the model may try otherwise.
            return _cut(f"Error: {type(exc).__name__}: {exc}"), True
        return _cut(_text(result)), False

    def _validate(self, result: ChatResult) -> tuple[Any, list[str]]:
        """The answer and what is wrong with it (nothing: it is the answer)."""
        if self._output is None:
            return result.content or "", []
        data = result.data
        if data is None:
            try:
                data = json.loads(result.content or "")
            except ValueError:
                return None, [f"the answer is not JSON: {(result.content or '')[:200]!r}"]
        if self._check is not None:
            return data, self._check.problems(data)
        assert isinstance(self._output, type)
        try:
            return self._output.model_validate(data).model_dump(mode="json"), []
        except ValidationError as exc:
            return None, [
                f"{'.'.join(map(str, e['loc'])) or 'the answer'}: {e['msg']}" for e in exc.errors()
            ]

    async def _publish(self, env: Envelope, answer: Any) -> Any:
        s = self.settings
        if s.carry:
            body = dict(answer) if isinstance(answer, Mapping) else {"answer": answer}
            payload = env.payload if isinstance(env.payload, Mapping) else {}
            body.update({k: payload[k] for k in s.carry if k in payload})
            answer = body
        if s.output_topic is not None:
            await self.emit(
                s.output_topic, answer if isinstance(answer, Mapping) else {"answer": answer}
            )
        return answer


class _SourceCalls:
    """The effects a model agent makes of its tool sources (``tools.list``, a source's
    tool call), as methods of an object that stands, in a request digest, for the sources
    alone (:class:`agents.RequestIdentity`): a what-if that edits the agent's instructions
    then serves a source's tool call asked with the recorded arguments. A source with no
    request identity of its own leaves these calls without a digest."""

    __slots__ = ("_agent",)

    def __init__(self, agent: ModelAgent) -> None:
        self._agent = agent

    def request_identity(self) -> Any:
        return self._agent._sources

    async def list(self) -> list[dict[str, Any]]:
        return await self._agent._list_sources()

    async def call(self, name: str, arguments: dict[str, Any]) -> Any:
        return await self._agent._call_source_tool(name, arguments)


async def _close_all(sources: Sequence[ToolSource]) -> None:
    """Close ``sources`` in reverse order, each even if one before it failed to close; the
    first failure is raised after."""
    failed: BaseException | None = None
    for source in reversed(sources):
        try:
            await source.aclose()
        except Exception as exc:
            failed = failed or exc
    if failed is not None:
        raise failed


def _assistant(result: ChatResult) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": result.content,
        "tool_calls": [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
            }
            for c in result.tool_calls
        ],
    }


def _cut(text: str) -> str:
    if len(text) <= MAX_TOOL_RESULT:
        return text
    return text[:MAX_TOOL_RESULT] + f"... [cut: {len(text)} characters in all]"
