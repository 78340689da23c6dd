"""The fields a model agent reads from its messages, checked against the records its input
will send it, where those are known before the run: a JSONL input's file (``kind: jsonl``
or ``file``), or a generator input's fixed ``payload``.

A template field (``prompt: "... {symptoms}"``) that no record has fails every message the
agent gets from the input, at run time and one by one; a ``carry`` field that no record has
is never carried, silently. Either is almost always a misspelling, so it is a located error
at load, saying which records were looked at and what fields they have.

What is checked, exactly: the records the input would publish on a topic the agent
subscribes to (routed by ``topic``, or ``topic_field`` and ``topics``; the ``label`` field
taken out, as the Observer takes it out), and a field is wrong only when *none* of them has
it. A field that some records lack is left alone: those messages fail (a template) or go
without it (``carry``) at run time, which a team may mean (records kept to test its dead
letters). Records that ``validate`` would refuse are counted in, since calling the team's
code at load is not this check's business; that can only make an error less likely.

What is not: an agent fed by other agents (a handoff topic), a generator function's,
stdin's or the HTTP inbox's records, which exist only once the run does; and a file past
:data:`MAX_FIELD_SCAN_BYTES` whose records read so far lack a field (the rest might have
it: nothing is said rather than a guess).
"""

from __future__ import annotations

import json
import string
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from agents import ModelAgent
from bus import matches
from pantheon._imports import ImportProblem
from pantheon.scenario._agents import agent_class
from pantheon.scenario._locate import Loc, suggest
from pantheon.scenario._schema import (
    FileInputConfig,
    GeneratorInputConfig,
    JsonlInputConfig,
    Scenario,
)

__all__ = ["MAX_FIELD_SCAN_BYTES", "input_field_problems"]

#: Bytes of an input file read at most to find the fields a model agent reads (64 MiB).
#: The scan stops as soon as every field is found, which is the first record for a correct
#: team; only a missing field reads on, and past this bound it is left unjudged.
MAX_FIELD_SCAN_BYTES = 64 * 1024 * 1024

#: Field names listed at most in a message ("their fields: ...").
_LISTED = 30


@dataclass(slots=True)
class _Need:
    """One field an agent reads: at ``loc`` of the scenario, ``path`` into the payload."""

    loc: Loc
    path: tuple[str, ...]
    patterns: tuple[str, ...]
    template: bool
    seen: int = 0
    found: bool = False
    fields: set[str] = field(default_factory=set)


def input_field_problems(scenario: Scenario) -> list[tuple[Loc, str]]:
    """Template and ``carry`` fields of the team's model agents that no record their input
    sends them has, each at its own line (see the module docstring)."""
    inp = scenario.input
    records: Iterator[Any]
    if isinstance(inp, JsonlInputConfig | FileInputConfig):
        source = inp.path.name
        records = _file_records(inp)
    elif isinstance(inp, GeneratorInputConfig) and inp.function is None:
        source = "the input's payload"
        records = iter([inp.payload])
    else:
        return []
    needs = [n for name, cfg in scenario.agents.items() for n in _needs(name, cfg)]
    if not needs:
        return []
    complete = True
    for record in records:
        if record is _CUT:
            complete = False
            break
        topic = _topic(inp, record)
        if topic is None:
            continue  # malformed: published on malformed_topic, to no model agent
        payload = {k: v for k, v in record.items() if k != inp.label}
        open_needs = [n for n in needs if not n.found]
        for need in open_needs:
            if not any(matches(p, topic) for p in need.patterns):
                continue
            need.seen += 1
            if _has(payload, need.path) or (
                need.template and len(need.path) == 1 and need.path[0] in ("payload", "topic")
            ):
                need.found = True
            else:
                need.fields.update(map(str, payload))
        if all(n.found for n in needs):
            break
    if not complete:
        return []
    return [(n.loc, _message(n, source, inp.label)) for n in needs if n.seen and not n.found]


def _needs(name: str, cfg: Any) -> list[_Need]:
    """The fields agent ``name`` reads of each message, if it is a model agent whose
    settings are valid (their own checks report them otherwise)."""
    if not cfg.enabled or cfg.handler is not None:
        return []
    try:
        cls = agent_class(name, cfg)
    except (ImportProblem, ValueError, KeyError):
        return []
    if not issubclass(cls, ModelAgent):
        return []
    try:
        s = cls.Settings.model_validate(dict(cfg.settings))
    except ValidationError:
        return []
    patterns = tuple(cfg.subscribe if cfg.subscribe is not None else cls.subscriptions)
    at: Loc = ("agents", name, "settings")
    out: list[_Need] = []
    for key, text in (("instructions", s.instructions), ("prompt", s.prompt)):
        paths = dict.fromkeys(_template_paths(text or ""))
        out.extend(_Need((*at, key), path, patterns, template=True) for path in paths)
    out.extend(
        _Need((*at, "carry", i), (str(carried),), patterns, template=False)
        for i, carried in enumerate(s.carry)
    )
    return out


def _template_paths(text: str) -> Iterator[tuple[str, ...]]:
    """The field paths of a template (one the settings' validation already accepted)."""
    for _, name, _, _ in string.Formatter().parse(text):
        if name:
            yield tuple(name.split("."))


_CUT = object()  # the file goes on past MAX_FIELD_SCAN_BYTES


def _file_records(inp: JsonlInputConfig | FileInputConfig) -> Iterator[Any]:
    """The JSON objects of the input file, as the input reads them (other lines are
    malformed, sent to no agent); then ``_CUT`` if the file goes on past the bound."""
    read = 0
    try:
        with inp.path.open("rb") as f:
            for line in f:
                read += len(line)
                if read > MAX_FIELD_SCAN_BYTES:
                    yield _CUT
                    return
                if not line.strip():
                    continue
                try:
                    record = json.loads(line.decode("utf-8", errors="replace"))
                except (ValueError, RecursionError):
                    continue
                if isinstance(record, dict):
                    yield record
    except OSError:
        yield _CUT  # unreadable now: the run will say so; nothing to judge here


def _topic(inp: Any, record: Mapping[str, Any]) -> str | None:
    """The topic ``record`` is published on, as the input routes it; None: malformed."""
    if inp.topic is not None:
        return str(inp.topic)
    if inp.topic_field is None or inp.topic_field not in record:
        return inp.default_topic
    value = record[inp.topic_field]
    name = value if isinstance(value, str) else json.dumps(value, default=str)
    return inp.topics.get(name, inp.default_topic)


def _has(payload: Any, path: tuple[str, ...]) -> bool:
    for key in path:
        if not isinstance(payload, Mapping) or key not in payload:
            return False
        payload = payload[key]
    return True


def _message(need: _Need, source: str, label: str | None) -> str:
    name = ".".join(need.path)
    if need.seen == 1:
        lacking = f"the one record this agent gets from {source} lacks"
    else:
        lacking = f"none of the {need.seen} records this agent gets from {source} has"
    hint = suggest(name, need.fields) if len(need.path) == 1 else ""
    listed = sorted(need.fields)
    have = ", ".join(listed[:_LISTED]) + (", ..." if len(listed) > _LISTED else "")
    theirs = f"; their fields: {have}" if have else "; they have no fields"
    if label is not None and need.path[0] == label:
        theirs += f" ({label!r} is the input's label, taken out before a record is published)"
    if need.template:
        return (
            f"template field {{{name}}}: {lacking} {name!r}{hint}, so every message would "
            f"fail{theirs}"
        )
    return f"carried field {name!r}{hint}: {lacking} it, so it would never be carried{theirs}"
