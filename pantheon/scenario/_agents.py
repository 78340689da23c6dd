"""Which class runs each agent of a scenario, and whether its settings fit that class.

An agent is named by role (the nine built-ins of :data:`agents.ROLES`), by class
(``class: "myteam.agents:Triage"`` or an entry point of ``pantheon.agents``) or by handler
(``handler: "myteam.agents:on_ticket"``, an async function). All of it is checked at load,
located in the file like every other field, so a wrong path, a class that is not an agent,
a handler that is not async or a misspelt setting stops the run before anything starts.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Mapping
from types import CodeType
from typing import Any

from pydantic import ValidationError

from agents import ROLES as ROLE_CLASSES
from agents import Agent, FunctionAgent, OutputSchemaInvalid, handler_arity
from bus import validate_pattern
from pantheon._imports import AGENT_GROUP, ImportProblem, load_object
from pantheon.scenario._locate import not_a_list, suggest, union_errors

__all__ = ["agent_class", "agent_problems", "model_problem", "resolve_handler", "uses_model"]

Loc = tuple[Any, ...]


def agent_class(name: str, cfg: Mapping[str, Any] | Any) -> type[Agent]:
    """The class that runs agent ``name`` (``cfg`` raw or an ``AgentConfig``).

    Raises :class:`~pantheon._imports.ImportProblem` (or ``ValueError``) saying why not."""
    spec = _get(cfg, "class_", "class")
    if _get(cfg, "handler", "handler") is not None:
        return FunctionAgent
    if spec is not None:
        obj = load_object(str(spec), group=AGENT_GROUP)
        if not (isinstance(obj, type) and issubclass(obj, Agent)):
            what = type(obj).__name__ if not isinstance(obj, type) else f"class {obj.__name__}"
            raise ImportProblem(
                f"{spec!r} is not an Agent subclass (it is a {what}); subclass agents.Agent, "
                "or name an async function with handler:"
            )
        return obj
    role = _get(cfg, "role", "role") or name
    return ROLE_CLASSES[role]


def resolve_handler(spec: str) -> Any:
    """The async function ``spec`` names, checked to take ``(env)`` or ``(env, agent)``."""
    fn = load_object(spec)
    if not callable(fn):
        raise ImportProblem(f"{spec!r} is not callable (it is a {type(fn).__name__})")
    try:
        handler_arity(fn)
    except ValueError as exc:
        raise ImportProblem(f"handler {spec!r} {exc}") from None
    return fn


def _get(cfg: Any, attr: str, key: str) -> Any:
    return cfg.get(key) if isinstance(cfg, Mapping) else getattr(cfg, attr, None)


def agent_problems(name: str, cfg: Mapping[str, Any], settings: Any) -> list[tuple[Loc, str]]:
    """What is wrong with agent ``name``'s class, handler and settings, as (location, message)
    pairs; ``settings`` are the raw settings to check against the class's model."""
    here: Loc = ("agents", name)
    given = [k for k in ("role", "class", "handler") if cfg.get(k) is not None]
    if len(given) > 1:
        return [(here, f"give one of role, class or handler, not {' and '.join(given)}")]
    if cfg.get("handler") is not None:
        out: list[tuple[Loc, str]] = []
        try:
            resolve_handler(str(cfg["handler"]))
        except ImportProblem as exc:
            out.append(((*here, "handler"), str(exc)))
        if not cfg.get("subscribe"):
            out.append((here, "a handler agent needs subscribe: the topics its function handles"))
        return out
    if cfg.get("class") is None and cfg.get("role") is None and name not in ROLE_CLASSES:
        return [
            (
                here,
                f"unknown agent {name!r}{suggest(str(name), ROLE_CLASSES)}: name a built-in "
                f"role ({', '.join(ROLE_CLASSES)}), or give it role:, class: or handler:",
            )
        ]
    if cfg.get("role") is not None and cfg["role"] not in ROLE_CLASSES:
        return []  # the role field's own check says so
    try:
        cls = agent_class(name, cfg)
    except ImportProblem as exc:
        return [((*here, "class"), str(exc))]
    out = settings_problems(cls, settings, (*here, "settings"))
    if not cfg.get("subscribe"):
        # The class's own patterns would be refused by bus.on mid-start; say so at load, on
        # the line that picked the class.
        where = (*here, "class") if cfg.get("class") is not None else here
        for pattern in cls.subscriptions:
            try:
                validate_pattern(pattern)
            except (TypeError, ValueError) as exc:
                out.append((where, f"{cls.__name__}.subscriptions: {exc} (or give subscribe:)"))
    return out


def settings_problems(cls: type[Agent], settings: Any, loc: Loc) -> list[tuple[Loc, str]]:
    """``settings`` checked against ``cls.Settings``: each error at its own key."""
    if settings is None:
        settings = {}
    if not isinstance(settings, Mapping):
        return []  # the settings field's own type check says so
    model = cls.Settings
    try:
        model.model_validate(dict(settings))
    except ValidationError as exc:
        out = []
        fields = list(model.model_fields)
        for err in union_errors(model, exc.errors()):
            where = (*loc, *err["loc"])
            if err["type"] == "extra_forbidden":
                key = str(err["loc"][-1]) if err["loc"] else "?"
                takes = (
                    f"{cls.__name__} takes {', '.join(fields)}"
                    if fields
                    else (f"{cls.__name__} takes no settings")
                )
                out.append((where, f"unknown setting {key!r}{suggest(key, fields)}; {takes}"))
            elif (listed := not_a_list(err, tuple(err["loc"]))) is not None:
                out.append((where, listed))
            elif isinstance(error := (err.get("ctx") or {}).get("error"), OutputSchemaInvalid):
                # An inline schema's problems sit deep in it: each on its own line.
                out.extend(((*where, *at), what) for at, what in error.problems)
            else:
                msg = str(err["msg"]).removeprefix("Value error, ")
                out.append((where, msg))
        return out
    return []


def uses_model(cls: type[Agent], handler: Callable[..., Any] | None = None) -> bool:
    """Whether an agent asks a model questions of its own (see :attr:`agents.Agent.uses_model`):
    the class's declaration if it or a base makes one, else whether its code calls
    ``self.chat(...)`` (a handler function's: ``agent.chat(...)`` on its agent argument)."""
    for klass in cls.__mro__:
        declared = vars(klass).get("uses_model")
        if declared is not None:
            return bool(declared)
    if handler is not None:
        return _calls_chat(handler, 1)
    return any(
        _calls_chat(fn, 0)
        for klass in cls.__mro__
        if klass not in (Agent, object)
        for fn in vars(klass).values()
        if inspect.isfunction(fn)
    )


def _calls_chat(fn: Callable[..., Any], arg: int) -> bool:
    """Whether ``fn`` calls ``.chat(...)`` on its positional argument number ``arg``.

    The compiled code says cheaply whether the name ``chat`` is used at all (most agents
    never do, and reading source costs a file read and a parse); only then is the source
    read to see on what. Without source (a function built in a REPL), the name is all there
    is to go on."""
    code = getattr(fn, "__code__", None)
    if not isinstance(code, CodeType) or not _names_chat(code):
        return False
    params = code.co_varnames[: code.co_argcount]
    if len(params) <= arg:
        return False
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(fn)))
    except (OSError, TypeError, SyntaxError):
        return True
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "chat"
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == params[arg]
        for node in ast.walk(tree)
    )


def _names_chat(code: CodeType) -> bool:
    return "chat" in code.co_names or any(
        _names_chat(const) for const in code.co_consts if isinstance(const, CodeType)
    )


def model_problem(name: str, cfg: Mapping[str, Any], provider: Any) -> tuple[Loc, str] | None:
    """Why agent ``name`` cannot run on the scenario's ``provider`` section (raw), or None.

    An agent that asks a model its own questions on the offline rules provider (the
    default when a scenario has no ``provider:``) would get an intent classification
    whatever it asked, and fail far from the cause; so it fails here, on its own line."""
    if provider is not None and not isinstance(provider, Mapping):
        return None  # the provider field's own type check says so
    if (provider or {}).get("kind", "rules") != "rules":
        return None
    handler = cfg.get("handler")
    try:
        cls = agent_class(name, cfg)
        fn = resolve_handler(str(handler)) if handler is not None else None
    except (ImportProblem, ValueError, KeyError):
        return None  # agent_problems says what is wrong with it
    if not uses_model(cls, fn):
        return None
    who = f"handler {handler}" if fn is not None else cls.__name__
    lacks = (
        "the scenario names no model provider, and the offline rules one it gets"
        if provider is None
        else "provider kind 'rules'"
    )
    return (
        ("agents", name, "handler" if fn is not None else "class"),
        f"{who} calls chat(), but {lacks} only classifies intents: add "
        "provider: {kind: openai, base_url: ..., model: ...} (or kind: anthropic, or kind: "
        "custom), or to run offline a scripted model the run starts itself: provider: "
        '{kind: openai, model: ..., stand_in: "module:reply"}',
    )
