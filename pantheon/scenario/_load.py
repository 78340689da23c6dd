"""Loading a scenario: compose the YAML node tree to remember where every key sits, validate
against the schema, and map each pydantic error location back to a line and column."""

from __future__ import annotations

import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, Discriminator, ValidationError

from pantheon.scenario._fields import input_field_problems
from pantheon.scenario._locate import (
    MAX_SCENARIO_BYTES,
    Loc,
    Problem,
    ScenarioError,
    _clean_loc,
    _or,
    dotted,
    locate,
    not_a_list,
    read_marked,
    suggest,
    tagged_member,
    union_errors,
)
from pantheon.scenario._schema import _NAME, _PATTERN, _TOPIC, SCENARIO_VERSION, Scenario

__all__ = ["load_scenario", "parse_scenario"]


def _model_at(loc: Loc) -> type[BaseModel] | None:
    """The model class validating the value at raw pydantic ``loc`` (tags included), if any."""
    tp: Any = Scenario
    for part in loc:
        tp = _unwrap(tp)
        if isinstance(part, str) and part.startswith("@"):
            tp = tagged_member(tp, part)
        elif isinstance(tp, type) and issubclass(tp, BaseModel):
            field = tp.model_fields.get(part) if isinstance(part, str) else None
            if field is None:
                return None
            tp = field.annotation
            if any(isinstance(m, Discriminator) for m in field.metadata):
                continue  # the next part is the tag
        elif typing.get_origin(tp) is dict:
            tp = typing.get_args(tp)[1]
        elif typing.get_origin(tp) in (tuple, list):
            tp = typing.get_args(tp)[0]
        else:
            return None
        if tp is None:
            return None
    tp = _unwrap(tp)
    return tp if isinstance(tp, type) and issubclass(tp, BaseModel) else None


def _unwrap(tp: Any) -> Any:
    """Strip ``Annotated`` and a trailing ``| None`` (but keep tagged unions whole)."""
    while True:
        if typing.get_origin(tp) is Annotated:
            tp = typing.get_args(tp)[0]
            continue
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if len(args) == 1:
                tp = args[0]
                continue
        return tp


def _describe(error: Mapping[str, Any]) -> tuple[Loc, str]:
    """A pydantic error as (location in the file, message a scenario author understands)."""
    raw: Loc = tuple(error["loc"])
    loc = _clean_loc(raw)
    kind = error["type"]
    msg: str = error["msg"]
    ctx = error.get("ctx") or {}
    if kind == "extra_forbidden":
        key = loc[-1] if loc else "?"
        model = _model_at(raw[:-1])
        if model is not None:
            fields = [f.alias or name for name, f in model.model_fields.items()]
            hint = suggest(str(key), fields)
            msg = f"unknown key {key!r}{hint}; expected one of {', '.join(fields)}"
        else:
            msg = f"unknown key {key!r}"
    elif (listed := not_a_list(error, loc)) is not None:
        msg = listed
    elif kind == "union_tag_invalid":
        tags = [
            t.strip().strip("'").lstrip("@") for t in str(ctx.get("expected_tags", "")).split(",")
        ]
        msg = f"Input should be {_or(tags)}"
        loc = (*loc, "kind")
    elif kind == "union_tag_not_found":
        msg = "Input should be a mapping"
    elif kind == "string_pattern_mismatch" and ctx.get("pattern") in _PATTERN_HELP:
        msg = _PATTERN_HELP[ctx["pattern"]]
        if loc and loc[-1] == "[key]":
            loc = loc[:-1]
    elif loc and loc[-1] == "[key]":
        loc = loc[:-1]
        # A key outside a fixed set (a dead-letter reason) is a misspelt key, not a bad name.
        if kind == "literal_error":
            msg = f"unknown key {loc[-1]!r}: {msg}"
        elif kind != "value_error":  # a validator's own message already says what is wrong
            msg = f"invalid name: {msg}"
    for prefix in ("Value error, ", "Assertion failed, "):
        if msg.startswith(prefix):
            msg = msg[len(prefix) :]
    return loc, msg


_PATTERN_HELP = {
    _NAME: "use lowercase letters, digits, '_' and '-' only",
    _TOPIC: "should be a dotted topic name such as observation.email.received",
    _PATTERN: "a topic pattern has no whitespace: tokens between dots, '*' or '>'",
}


def parse_scenario(
    text: str,
    source: str = "<string>",
    base_dir: Path | None = None,
    *,
    check_files: bool = True,
) -> Scenario:
    """Validate scenario ``text``; ``source`` names it in errors, ``base_dir`` anchors
    ``input.path`` (default: the working directory).

    ``check_files=False`` skips the check that the input file exists, for callers that
    rebuild a recorded scenario without reading its input (replay, redrive).

    Raises :class:`ScenarioError` listing every problem found, YAML syntax errors included.
    """
    data, marks, problems = read_marked(text, source, empty="the scenario is empty")

    def problem(loc: Loc, message: str) -> Problem:
        return Problem(source, *locate(marks, loc), dotted(loc), message)

    if not isinstance(data, Mapping):
        raise ScenarioError(
            [problem((), f"a scenario is a mapping of keys, not a {type(data).__name__}")]
        )
    version = data.get("version", SCENARIO_VERSION)
    if version != SCENARIO_VERSION or type(version) is not int:
        # Another version is another schema: its other keys would only add noise.
        raise ScenarioError(
            [
                problem(
                    ("version",),
                    f"unsupported scenario version {version!r}: this Pantheon reads version "
                    f"{SCENARIO_VERSION}",
                )
            ]
        )

    cross: list[tuple[Loc, str]] = []
    context = {"base_dir": base_dir, "check_files": check_files, "cross_problems": cross}
    try:
        scenario = Scenario.model_validate(data, context=context)
    except ValidationError as exc:
        problems.extend(problem(*_describe(e)) for e in union_errors(Scenario, exc.errors()))
    else:
        if check_files:  # a recorded scenario rebuilt for a replay never reads its input
            cross.extend(input_field_problems(scenario))
    problems.extend(problem(loc, msg) for loc, msg in cross)
    if problems:
        raise ScenarioError(problems)
    scenario._text = text
    scenario._source = source
    scenario._base_dir = None if base_dir is None else base_dir.resolve()
    return scenario


def recorded_scenario(text: str | None, scenario_dir: str | None) -> Scenario | None:
    """A session's recorded scenario (its text, and the folder it was loaded from), or
    None when there is none or it no longer parses (written for an older Pantheon):
    readers of an old record fall back to defaults rather than fail. Its input file is
    not checked: a record is read without its input."""
    if not text:
        return None
    base = None if scenario_dir is None else Path(scenario_dir)
    try:
        return parse_scenario(text, base_dir=base, check_files=False)
    except ScenarioError:
        return None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate the scenario file at ``path``.

    Relative paths inside it (``input.path``) are taken from the file's directory. Raises
    :class:`ScenarioError` for anything wrong with the content (a file over
    :data:`MAX_SCENARIO_BYTES`, 1 MiB, included: only that much is ever read) and ``OSError``
    if the file cannot be read.
    """
    path = Path(path)
    # Read one byte past the cap, never the whole file: it may be /dev/zero.
    with path.open("rb") as stream:
        raw = stream.read(MAX_SCENARIO_BYTES + 1)
    if len(raw) > MAX_SCENARIO_BYTES:
        raise ScenarioError(
            [
                Problem(
                    str(path),
                    1,
                    1,
                    "",
                    f"larger than {_size(MAX_SCENARIO_BYTES)}; a scenario is a small YAML file",
                )
            ]
        )
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise ScenarioError(
            [Problem(str(path), line, column, "", "not UTF-8 text: a scenario is a YAML text file")]
        ) from None
    return parse_scenario(text, source=str(path), base_dir=path.resolve().parent)


def _size(n: int) -> str:
    return f"{n // (1024 * 1024)} MiB" if n % (1024 * 1024) == 0 else f"{n} bytes"
