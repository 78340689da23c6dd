"""Tools a model may call: the :class:`Tool` and :class:`ToolSource` protocols, and
:func:`tool`, which turns any typed Python function into a Tool.

A tool is what a model sees (a name, a description, a JSON schema of its arguments) plus
an async call with the arguments the model chose. Anything can be one (a Python function,
an MCP server's tool, a hand-written class), so the model agent's loop knows only the
protocol. A :class:`ToolSource` is where tools come from when an agent starts (an MCP
server lists its tools then) and what is closed when it stops.

A function becomes a tool by its signature and docstring, as in Pydantic AI and the OpenAI
Agents SDK: the parameters' annotations are a pydantic model, whose JSON schema is what the
model is shown and whose validation checks the model's arguments before the function runs;
the docstring's first paragraph is the description, and an ``Args:`` (or ``Parameters``)
section describes each parameter. A function that cannot be shown so is refused when it is
made, naming its ``module:function``: a parameter whose type has no JSON schema (a plain
class), or an ``Args:`` entry for a parameter it does not have. Arguments that do not fit
raise :class:`ToolArgumentsInvalid` naming each bad field, which the model agent hands back
to the model as the tool's result so it can correct itself.

Errors (a branch of :class:`agents.AgentError`)::

    ToolError                      a tool could not be made or called
    └── ToolArgumentsInvalid       the model's arguments do not fit the tool's parameters
"""

from __future__ import annotations

import asyncio
import difflib
import importlib
import inspect
import re
import typing
from collections.abc import Callable, Iterable
from typing import Any, Protocol, get_type_hints, overload, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model
from pydantic_core import to_jsonable_python

from agents._errors import AgentError

__all__ = [
    "FunctionTool",
    "Tool",
    "ToolArgumentsInvalid",
    "ToolError",
    "ToolSource",
    "load_tools",
    "tool",
    "tool_schema",
]

#: What a tool may be called, as model APIs accept it (OpenAI's and Anthropic's rule).
TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class ToolError(AgentError, RuntimeError):
    """A tool could not be made from what was given, or could not be called."""


class ToolArgumentsInvalid(ToolError):
    """The arguments a model gave do not fit the tool's parameters; the message names each
    field and what is wrong with it, in words a model can act on."""


@runtime_checkable
class Tool(Protocol):
    """One tool a model may call.

    ``name`` is what the model calls it (``[A-Za-z0-9_-]{1,64}``), ``parameters`` the JSON
    schema of the arguments object (``{"type": "object", ...}``). Calling it with the
    arguments the model chose returns a JSON-able result (recorded in the session as it
    is), or raises; the model agent gives either back to the model."""

    name: str
    description: str
    parameters: dict[str, Any]

    async def __call__(self, arguments: dict[str, Any]) -> Any: ...


@runtime_checkable
class ToolSource(Protocol):
    """Where tools come from at start (an MCP server, a module of functions): started when
    the agent that holds it starts, asked for its tools then, closed when the agent stops."""

    async def start(self) -> None: ...

    def tools(self) -> list[Tool]: ...

    async def aclose(self) -> None: ...


def tool_schema(t: Tool) -> dict[str, Any]:
    """``t`` as an OpenAI chat-completions function tool: what ``chat(tools=...)`` takes."""
    return {
        "type": "function",
        "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
    }


# -- functions as tools ------------------------------------------------------------------------

#: Section headings that start a docstring's list of parameters (Google and NumPy style).
_ARGS_HEADINGS = ("args", "arguments", "parameters", "params")


def _docstring(fn: Callable[..., Any]) -> tuple[str, dict[str, str]]:
    """The first paragraph of ``fn``'s docstring (joined into one line), and each
    parameter's description from a Google ``Args:`` or NumPy ``Parameters`` section."""
    lines = (inspect.getdoc(fn) or "").splitlines()
    first: list[str] = []
    for line in lines:
        if not line.strip() or _heading(line):
            break
        first.append(line.strip())
    return " ".join(first), _param_lines(lines)


def _heading(line: str) -> bool:
    return line.strip().rstrip(":").lower() in _ARGS_HEADINGS


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _param_lines(lines: list[str]) -> dict[str, str]:
    start = next((i for i, line in enumerate(lines) if _heading(line)), None)
    if start is None:
        return {}
    base = _indent(lines[start])
    body = lines[start + 1 :]
    numpy = bool(body) and set(body[0].strip()) == {"-"}
    if numpy:
        body = body[1:]
    params: dict[str, str] = {}
    current: str | None = None
    entry = None  # the indent of an entry line; deeper lines continue it
    for i, line in enumerate(body):
        if not line.strip():
            continue
        indent = _indent(line)
        nxt = body[i + 1] if i + 1 < len(body) else ""
        if indent < base or (indent == base and not numpy):
            break  # Google: the next section starts at the heading's indent
        if numpy and indent == base and nxt.strip() and set(nxt.strip()) == {"-"}:
            break  # NumPy: the next section's heading, underlined
        if entry is None or indent <= entry:
            m = re.match(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:(.*)$", line.strip())
            if m is None:
                break
            entry, current = indent, m.group(1)
            # NumPy's ``name : type`` has the type after the colon, the text below it.
            params[current] = "" if numpy else m.group(2).strip()
        elif current is not None:
            params[current] = f"{params[current]} {line.strip()}".strip()
    return {k: v for k, v in params.items() if v}


class FunctionTool:
    """A Python function (sync or async) as a :class:`Tool`. Usually made by :func:`tool`.

    The schema and the validating model are built once here; a call validates the
    arguments (:class:`ToolArgumentsInvalid` when they do not fit: unknown, missing or of
    the wrong type), calls the function with the validated values (a pydantic model
    parameter gets an instance), and returns its result as plain JSON-able data. A sync
    function runs in a worker thread, so a tool that blocks (a file read, a database query)
    does not stop every other agent on the loop meanwhile."""

    __slots__ = ("_fields", "_fn", "_is_async", "_model", "description", "name", "parameters")

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> None:
        if not callable(fn):
            raise ToolError(f"a tool is made from a function, not {type(fn).__name__}")
        self._fn = fn
        self.name: str = name or str(getattr(fn, "__name__", ""))
        if not TOOL_NAME.fullmatch(self.name):
            raise ToolError(
                f"tool name {self.name!r} is not 1-64 letters, digits, '_' or '-' (give name=...)"
            )
        summary, described = _docstring(fn)
        self.description = description if description is not None else summary
        where = f"tool {self.name!r} ({_origin(fn)})"
        # A callable object's annotations are on its class's ``__call__``.
        annotated = fn if inspect.isroutine(fn) else type(fn).__call__
        try:
            hints = get_type_hints(annotated)
        except Exception as exc:
            raise ToolError(
                f"{where}: cannot read the type annotations of its function: {exc}"
            ) from exc
        fields: dict[str, Any] = {}
        #: Validated field name -> the function's parameter name. Fields are named p0, p1...
        #: and carry the parameter's name as alias, so a parameter called ``json`` or
        #: ``schema`` does not collide with BaseModel's own attributes.
        self._fields: dict[str, str] = {}
        for i, param in enumerate(inspect.signature(fn).parameters.values()):
            if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
                raise ToolError(
                    f"{where}: parameter {param.name!r} is *args or **kwargs; a "
                    "tool's parameters are named, so the model can be shown them"
                )
            if param.kind is param.POSITIONAL_ONLY:
                raise ToolError(
                    f"{where}: parameter {param.name!r} is positional-only; the "
                    "model passes arguments by name"
                )
            annotation = hints.get(param.name, Any)
            default = ... if param.default is param.empty else param.default
            field = f"p{i}"
            fields[field] = (
                annotation,
                Field(default, alias=param.name, description=described.get(param.name)),
            )
            self._fields[field] = param.name
        # A description for a name that is no parameter is a renamed or misspelt parameter:
        # the model would be shown the real one undescribed.
        strays = [name for name in described if name not in self._fields.values()]
        if strays:
            names = ", ".join(self._fields.values()) or "none"
            raise ToolError(
                f"{where}: its docstring describes "
                + ", ".join(f"{n!r}{_did_you_mean(n, self._fields.values())}" for n in strays)
                + f" under Args:, but the function has no such parameter (its parameters: "
                f"{names})"
            )
        try:
            self._model, schema = _arguments_model(f"{self.name}_arguments", fields)
        except Exception as exc:
            raise ToolError(f"{where}: {_no_schema(fields, self._fields, exc)}") from exc
        schema.pop("title", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        schema.setdefault("properties", {})
        self.parameters: dict[str, Any] = schema
        # An instance with an ``async def __call__`` is async too.
        self._is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(
            type(fn).__call__
        )

    async def __call__(self, arguments: dict[str, Any]) -> Any:
        try:
            validated = self._model.model_validate(arguments)
        except ValidationError as exc:
            raise ToolArgumentsInvalid(
                f"tool {self.name!r} was called with arguments that do not fit: "
                + "; ".join(_error_line(e) for e in exc.errors())
            ) from None
        kwargs = {param: getattr(validated, field) for field, param in self._fields.items()}
        if self._is_async:
            result = await self._fn(**kwargs)
        else:
            result = await asyncio.to_thread(self._fn, **kwargs)
            if inspect.isawaitable(result):  # a sync wrapper handing back a coroutine
                result = await result
        return to_jsonable_python(result)

    def request_identity(self) -> Any:
        """Its function: what it answers (see :class:`agents.RequestIdentity`)."""
        return self._fn

    def __repr__(self) -> str:
        return f"FunctionTool({self.name!r})"


def _arguments_model(name: str, fields: dict[str, Any]) -> tuple[type[BaseModel], dict[str, Any]]:
    """The model validating a tool's arguments, and its JSON schema (by the parameters' names)."""
    model = create_model(
        name, __config__=ConfigDict(extra="forbid", arbitrary_types_allowed=False), **fields
    )
    return model, model.model_json_schema(by_alias=True)


#: What a tool's parameter may be typed with: what has a JSON schema to show the model.
_SCHEMA_TYPES = (
    "str, int, float, bool, None, a list or dict of those, Literal[...], an Enum, a "
    "TypedDict, a dataclass or a pydantic model"
)


def _no_schema(fields: dict[str, Any], params: dict[str, str], exc: Exception) -> str:
    """Why a tool's parameters have no JSON schema, in one line: the first parameter whose
    type has none, tried alone (pydantic's own error runs to several lines of advice about
    its configuration, none of it what a tool's author can act on)."""
    for field, spec in fields.items():
        try:
            _arguments_model("parameter", {field: spec})
        except Exception:
            return (
                f"parameter {params[field]!r} is typed {_type_name(spec[0])}, which has no JSON "
                f"schema to show the model; type it with {_SCHEMA_TYPES}"
            )
    first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"its parameters have no JSON schema: {type(exc).__name__}: {first}"


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not typing.get_args(tp):
        return (
            tp.__qualname__ if tp.__module__ == "builtins" else f"{tp.__module__}.{tp.__qualname__}"
        )
    return repr(tp).removeprefix("typing.")


def _origin(fn: Callable[..., Any]) -> str:
    """Where ``fn`` is defined, as an import path ``module:name`` says it."""
    target = fn if inspect.isroutine(fn) else type(fn)
    module = getattr(target, "__module__", None)
    name = getattr(target, "__qualname__", None) or getattr(target, "__name__", None)
    return f"{module}:{name}" if module and name else repr(fn)


def _did_you_mean(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _error_line(error: Any) -> str:
    where = ".".join(str(p) for p in error.get("loc", ())) or "arguments"
    return f"{where}: {error.get('msg', 'invalid')}"


@overload
def tool(fn: Callable[..., Any], /) -> FunctionTool: ...


@overload
def tool(
    *, name: str | None = None, description: str | None = None
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a :class:`Tool` of a typed function, bare (``@tool``) or with a name or a
    description other than the function's (``@tool(name="lookup")``)::

        @tool
        async def order_status(order_id: str) -> dict[str, str]:
            \"\"\"The shipping status of an order.

            Args:
                order_id: The order number, e.g. "A-1001".
            \"\"\"
    """
    if fn is not None:
        return FunctionTool(fn, name=name, description=description)
    return lambda f: FunctionTool(f, name=name, description=description)


def _load(spec: str) -> Any:
    module_name, colon, attr = spec.partition(":")
    if not colon or not module_name or not attr:
        raise ToolError(f"{spec!r} is not an import path: write it as 'module:name'")
    try:
        obj: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ToolError(f"cannot import module {module_name!r} for tool {spec!r}: {exc}") from None
    for part in attr.split("."):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            raise ToolError(f"module {module_name!r} has no attribute {attr!r}") from None
    return obj


def load_tools(items: Iterable[Any]) -> list[Tool | ToolSource]:
    """Tools and tool sources from what a scenario or a caller gives: a :class:`Tool` or a
    :class:`ToolSource` as it is, a function (made a :class:`FunctionTool`), or an import
    path ``"module:name"`` to any of those. :class:`ToolError` says what is wrong with the
    first that is none of them."""
    out: list[Tool | ToolSource] = []
    for item in items:
        obj = _load(item) if isinstance(item, str) else item
        if isinstance(obj, ToolSource | Tool):
            out.append(obj)
        elif callable(obj) and not isinstance(obj, type):
            out.append(FunctionTool(obj))
        else:
            what = f"{item!r}" if isinstance(item, str) else type(obj).__name__
            raise ToolError(
                f"{what} is not a tool: give a function, a Tool or a ToolSource "
                f"(it is a {type(obj).__name__})"
            )
    return out
