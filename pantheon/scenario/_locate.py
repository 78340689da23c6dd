"""Where things are in a scenario file: YAML key paths mapped to line and column, and the
:class:`Problem`/:class:`ScenarioError` that report them in the file's own words.

Kept apart from the schema so anything that validates part of a scenario (agent settings
checked against an agent's own model, imports of agent classes) can report through the same
``file:line:column: field: message`` lines.
"""

from __future__ import annotations

import difflib
import json
import types
import typing
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypeAlias

import yaml
from pydantic import BaseModel, Discriminator, Tag

from pantheon._errors import PantheonError

__all__ = ["MAX_SCENARIO_BYTES", "MAX_SCENARIO_DEPTH", "Problem", "ScenarioError"]


def suggest(word: str, choices: Iterable[str]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def not_a_list(error: Mapping[str, Any], loc: Loc) -> str | None:
    """pydantic's "Input should be a valid tuple" for a list field given something else, in
    the file's words: a string is the usual slip (``tools: "mod:fn"`` for ``tools:
    ["mod:fn"]``), so the message writes the list it meant. None for any other error."""
    if error.get("type") not in ("tuple_type", "list_type", "set_type", "frozen_set_type"):
        return None
    value = error.get("input")
    key = loc[-1] if loc and isinstance(loc[-1], str) else "it"
    if isinstance(value, str):
        return f"a list, got a string; write {key}: [{json.dumps(value)}]"
    what = "a mapping" if isinstance(value, Mapping) else _kind(value)
    return f"a list, got {what}; write {key}: [...]"


def _kind(value: Any) -> str:
    if value is None:
        return "no value"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    return f"a {type(value).__name__}"


# -- errors ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Problem:
    """One thing wrong with a scenario, located in its file (line and column are 1-based)."""

    file: str
    line: int
    column: int
    field: str
    """Dotted path to the offending key (``agents.actor.retry.attempts``, ``rules.spam[2]``);
    empty for problems with the document as a whole (YAML syntax)."""
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}:{self.column}"
        return (
            f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"
        )


class ScenarioError(PantheonError, ValueError):
    """A scenario could not be loaded; ``problems`` lists every reason, in file order.

    The message has one ``file:line:column: field: message`` line per problem, so an editor or
    CI log can jump to each.
    """

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.line, p.column, p.field))
        self.source = self.problems[0].file if self.problems else "<string>"
        lines = [str(p) for p in self.problems]
        if len(lines) > 1:
            lines.insert(0, f"{len(lines)} problems in scenario {self.source}:")
        super().__init__("\n".join(lines))


# -- loading -----------------------------------------------------------------------------------

Loc: TypeAlias = tuple[Any, ...]


#: Key paths a scenario may expand to. A real one has a few hundred; aliases to aliases
#: ("billion laughs") reach millions, which validation would then walk one by one.
_MAX_PATHS = 50_000

#: Bytes of a scenario file read at most (1 MiB). A real scenario is a few kilobytes; the
#: cap keeps ``/dev/zero`` or a multi-gigabyte file from being read into memory at all.
MAX_SCENARIO_BYTES = 1024 * 1024

#: Levels of nesting a scenario may have (a mapping in a sequence in a mapping...), aliases
#: followed. A real one has under ten; PyYAML's composer, the key walk and validation all
#: recurse once per level, so thousands of ``[`` would otherwise end in a ``RecursionError``.
MAX_SCENARIO_DEPTH = 100


#: Characters an integer may be written with. Python refuses to convert decimal strings of
#: over 4,300 digits, and to print ints that long; no setting needs more than twenty.
_MAX_INT_CHARS = 1000


class _Refused(yaml.MarkedYAMLError):
    """YAML that parses but that a scenario may not contain (too deep, an integer too long to
    convert, an impossible date); its ``problem`` is the whole message, at ``problem_mark``."""

    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        super().__init__(problem=problem, problem_mark=mark)


class MarkingLoader(yaml.SafeLoader):
    """A safe loader; :func:`_marks` walks the node tree it composes for key positions.

    It refuses what would otherwise escape as a Python error rather than a located one:
    nesting deeper than :data:`MAX_SCENARIO_DEPTH` (checked while composing, before the
    recursion gets deep) and scalars whose conversion fails (``int`` of 100,000 digits is a
    ``ValueError`` past Python's conversion limit; ``2020-13-01`` is no date).
    """

    _depth = 0

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        self._depth += 1
        try:
            if self._depth > MAX_SCENARIO_DEPTH:
                raise _Refused(_too_deep(), self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_object(self, node: yaml.Node, deep: bool = False) -> Any:
        text = node.value if isinstance(node.value, str) else ""
        if node.tag == "tag:yaml.org,2002:int" and len(text) > _MAX_INT_CHARS:
            # Refused before conversion: 5,000 hex digits convert, but the value then has
            # too many decimal digits for any message that shows it (a ValueError again).
            message = f"an integer of {len(text)} characters is too long to read as a number"
            raise _Refused(message, node.start_mark)
        try:
            return super().construct_object(node, deep)
        except (ValueError, OverflowError) as exc:
            kind = node.tag.rsplit(":", 1)[-1]
            if kind == "int":
                message = f"{text[:40]!r} is not an integer YAML can read: {exc}"
            else:
                shown = text if len(text) <= 40 else f"{text[:20]}... ({len(text)} characters)"
                message = f"cannot read {shown!r} as {kind}: {exc}"
            raise _Refused(message, node.start_mark) from None


def _too_deep() -> str:
    return f"nested deeper than {MAX_SCENARIO_DEPTH} levels; a scenario is a shallow YAML file"


class _TooLarge(Exception):
    pass


class _TooDeep(Exception):
    def __init__(self, node: yaml.Node) -> None:
        self.node = node


def bounded_marks(
    loader: MarkingLoader, root: yaml.Node, source: str, what: str = "scenario"
) -> tuple[dict[Loc, tuple[int, int]], list[Problem]]:
    """:func:`_marks` within the loader's limits, a breach as one located
    :class:`ScenarioError`: every YAML file Pantheon validates (a scenario, an overlay) is
    held to the same bounds, so aliases of aliases cannot expand one of them instead."""
    try:
        return _marks(loader, root, source)
    except _TooLarge:
        message = f"the {what} expands to over {_MAX_PATHS} keys (aliases of aliases?)"
        raise ScenarioError([Problem(source, 1, 1, "", message)]) from None
    except _TooDeep as exc:
        mark = exc.node.start_mark
        deep = Problem(source, mark.line + 1, mark.column + 1, "", _too_deep())
        raise ScenarioError([deep]) from None


def read_marked(
    text: str, source: str, *, empty: str, what: str = "scenario"
) -> tuple[Any, dict[Loc, tuple[int, int]], list[Problem]]:
    """Parse the YAML file ``text`` (a scenario, an overlay) under the loader's bounds: its
    data, the position of every key path, and the problems found while marking them
    (duplicate keys), which the caller reports with its own. Anything that stops the parse
    (an unreadable character, an empty document, a syntax error, YAML a scenario may not
    contain, a breach of the bounds) raises one located :class:`ScenarioError`; ``empty``
    says what an empty document means."""
    try:
        # The reader checks every character up front, before any parsing.
        loader = MarkingLoader(text)
    except yaml.reader.ReaderError as exc:
        raise ScenarioError([_unreadable(source, text, exc)]) from None
    try:
        root = loader.get_single_node()
        if root is None:
            raise ScenarioError([Problem(source, 1, 1, "", empty)])
        marks, problems = bounded_marks(loader, root, source, what)
        data = loader.construct_document(root)
    except _Refused as exc:
        mark = exc.problem_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        raise ScenarioError([Problem(source, line, column, "", str(exc.problem))]) from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line, column = (mark.line + 1, mark.column + 1) if mark else (1, 1)
        what_ = "; ".join(filter(None, [exc.context, exc.problem]))
        raise ScenarioError([Problem(source, line, column, "", f"YAML syntax: {what_}")]) from None
    except yaml.YAMLError as exc:  # unmarked, which PyYAML should not raise for a string
        raise ScenarioError([Problem(source, 1, 1, "", f"YAML: {exc}")]) from None
    finally:
        loader.dispose()
    return data, marks, problems


def _unreadable(source: str, text: str, exc: yaml.reader.ReaderError) -> Problem:
    """A character YAML does not allow (NUL, BEL, ESC...), at its line and column."""
    position = exc.position if isinstance(exc.position, int) else 0
    line = text.count("\n", 0, position) + 1
    column = position - (text.rfind("\n", 0, position) + 1) + 1
    char = exc.character if isinstance(exc.character, str) else chr(exc.character)
    return Problem(
        source,
        line,
        column,
        "",
        f"control character U+{ord(char):04X} is not allowed in YAML; a scenario is plain text",
    )


def _marks(
    loader: MarkingLoader, root: yaml.Node, source: str
) -> tuple[dict[Loc, tuple[int, int]], list[Problem]]:
    """Position (1-based line, column) of every key path, and any duplicate keys.

    A mapping entry is placed at its key, a sequence item at its first character, so an error
    about a value points at the line that names it. Keys brought in by a ``<<`` merge keep the
    position of the anchored mapping; the mapping's own keys win, as in YAML.
    """
    marks: dict[Loc, tuple[int, int]] = {}
    duplicates: list[Problem] = []

    def at(node: yaml.Node) -> tuple[int, int]:
        return node.start_mark.line + 1, node.start_mark.column + 1

    def walk(node: yaml.Node, loc: Loc, merged: bool, seen: set[int]) -> None:
        if id(node) in seen:  # an alias cycle; YAML allows them, we need not follow
            return
        if len(marks) > _MAX_PATHS:
            raise _TooLarge
        if len(loc) > MAX_SCENARIO_DEPTH:  # aliases of aliases nest without being nested
            raise _TooDeep(node)
        seen = seen | {id(node)}
        if isinstance(node, yaml.MappingNode):
            own: list[tuple[yaml.Node, yaml.Node]] = []
            merges: list[yaml.Node] = []
            for key_node, value_node in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    if isinstance(value_node, yaml.SequenceNode):
                        merges.extend(value_node.value)
                    else:
                        merges.append(value_node)
                else:
                    own.append((key_node, value_node))
            first: dict[Any, tuple[int, int]] = {}
            for key_node, value_node in own:
                key = _key(loader, key_node)
                child = (*loc, key)
                if key in first and not merged:
                    line, _ = first[key]
                    duplicates.append(
                        Problem(
                            source,
                            *at(key_node),
                            dotted(child),
                            f"duplicate key {key!r} (first defined on line {line}); "
                            "YAML keeps only the last",
                        )
                    )
                first.setdefault(key, at(key_node))
                if merged:
                    marks.setdefault(child, at(key_node))
                else:
                    marks[child] = at(key_node)
                walk(value_node, child, merged, seen)
            for merge in merges:
                walk(merge, loc, True, seen)
        elif isinstance(node, yaml.SequenceNode):
            for i, item in enumerate(node.value):
                child = (*loc, i)
                if merged:
                    marks.setdefault(child, at(item))
                else:
                    marks[child] = at(item)
                walk(item, child, merged, seen)

    marks[()] = at(root)
    walk(root, (), False, set())
    return marks, duplicates


def _key(loader: MarkingLoader, node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        try:
            return loader.construct_object(node)
        except yaml.YAMLError:
            return node.value
    return f"<{node.id} key>"


def dotted(loc: Loc) -> str:
    """``("rules", "spam", 2)`` -> ``rules.spam[2]``."""
    out = ""
    for part in loc:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out += f".{part}" if out else str(part)
    return out


def _clean_loc(loc: Loc) -> Loc:
    """Drop union tags (``@zmq``), which pydantic adds to ``loc`` but the file never has."""
    return tuple(p for p in loc if not (isinstance(p, str) and p.startswith("@")))


def _or(words: list[str]) -> str:
    quoted = [f"'{w}'" for w in words]
    return quoted[0] if len(quoted) == 1 else f"{', '.join(quoted[:-1])} or {quoted[-1]}"


def locate(marks: Mapping[Loc, tuple[int, int]], loc: Loc) -> tuple[int, int]:
    """The position of ``loc``, or of its nearest ancestor the file has (a missing key)."""
    while loc not in marks and loc:
        loc = loc[:-1]
    return marks.get(loc, (1, 1))


# -- unions ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Expects:
    """Field metadata saying what a union field takes, in a scenario author's words
    (``'driver' or a mapping of process -> agents``), for its one-line error when a value
    fits none of the union's members. Without it, the members are described in general
    terms (a mapping, a list, a number, the literal values)."""

    text: str


#: pydantic error types that mean "not this member's kind of value" (a string where a
#: mapping goes): a union member that fails only so did not take the value at all.
_SHAPE_ERRORS = ("literal_error", "enum", "is_instance_of", "none_required")


def _is_shape_error(kind: str) -> bool:
    return kind.endswith(("_type", "_parsing")) or kind in _SHAPE_ERRORS


def union_errors(
    root: type[BaseModel], errors: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """pydantic's ``errors`` (locations relative to model ``root``) without the union member
    labels pydantic puts in a location (``transport.standby.dict[constrained-str,...]``,
    ``...literal['driver']``), which are no key of the file and name internal types.

    For each value of a plain union that failed: the errors of the members that took its
    shape (an error below the member, or one about the value rather than its kind), label
    dropped; when every member refused the value's kind, one error at the value saying what
    the union takes (:class:`Expects`, else its members described)."""
    # In the order pydantic gave them: an error as it is, or the key of a union's group.
    order: list[dict[str, Any] | tuple[Any, ...]] = []
    groups: dict[tuple[Any, ...], tuple[str, list[tuple[int, dict[str, Any]]]]] = {}
    for error in errors:
        loc = tuple(error["loc"])
        split = _union_split(root, loc)
        if split is None:
            order.append(dict(error))
            continue
        i, expects = split
        if loc[:i] not in groups:
            groups[loc[:i]] = (expects, [])
            order.append(loc[:i])
        groups[loc[:i]][1].append((i, dict(error)))
    result: list[dict[str, Any]] = []
    for entry in order:
        if isinstance(entry, dict):
            result.append(entry)
            continue
        expects, members = groups[entry]
        taken = [
            {**e, "loc": (*e["loc"][:i], *e["loc"][i + 1 :])}
            for i, e in members
            if len(e["loc"]) > i + 1 or not _is_shape_error(str(e["type"]))
        ]
        if taken:
            result.extend(taken)
        else:
            message = f"Input should be {expects}"
            result.append({**members[0][1], "loc": entry, "type": "union", "msg": message})
            result[-1].pop("ctx", None)
    return result


def _union_split(root: type[BaseModel], loc: tuple[Any, ...]) -> tuple[int, str] | None:
    """Where in ``loc`` the first plain (untagged) union's member label sits, with what that
    union takes; None when ``loc`` crosses no plain union."""
    tp: Any = root
    meta: tuple[Any, ...] = ()
    for i, part in enumerate(loc):
        tp, more = _strip(tp)
        meta += more
        if isinstance(part, str) and part.startswith("@"):
            tp, meta = tagged_member(tp, part), ()
            continue
        args = _members(tp)
        if len(args) > 1 and not any(isinstance(m, Discriminator) for m in meta):
            said = next((m.text for m in meta if isinstance(m, Expects)), None)
            return i, said or _or_words([_describe_type(a) for a in args])
        meta = ()
        if isinstance(tp, type) and issubclass(tp, BaseModel):
            field = next(
                (
                    f
                    for name, f in tp.model_fields.items()
                    if part in (name, f.alias, f.validation_alias)
                ),
                None,
            )
            if field is None:
                return None
            tp, meta = field.annotation, tuple(field.metadata)
        elif typing.get_origin(tp) is dict and part != "[key]":
            tp = typing.get_args(tp)[1]
        elif typing.get_origin(tp) in (tuple, list) and isinstance(part, int):
            tp = typing.get_args(tp)[0]
        else:
            return None
    return None


def _strip(tp: Any) -> tuple[Any, tuple[Any, ...]]:
    """``tp`` without ``Annotated`` (its metadata returned) and a lone ``| None``."""
    meta: tuple[Any, ...] = ()
    while True:
        if typing.get_origin(tp) is Annotated:
            tp, *more = typing.get_args(tp)
            meta += tuple(more)
            continue
        args = _members(tp)
        if len(args) == 1 and args[0] is not tp:
            tp = args[0]
            continue
        return tp, meta


def _members(tp: Any) -> list[Any]:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(tp) if a is not type(None)]
    return [tp]


def tagged_member(tp: Any, tag: str) -> Any:
    """The member of the union ``tp`` (a discriminated one, at any depth) tagged ``tag``,
    or None."""
    for arg in typing.get_args(tp):
        if typing.get_origin(arg) is Annotated:
            inner, *meta = typing.get_args(arg)
            if any(isinstance(m, Tag) and m.tag == tag for m in meta):
                return inner
        found = tagged_member(arg, tag) if typing.get_origin(arg) else None
        if found is not None:
            return found
    return None


def _describe_type(tp: Any) -> str:
    """A union member in a scenario author's words."""
    tp, _ = _strip(tp)
    origin = typing.get_origin(tp)
    if origin is typing.Literal:
        return _or([str(v) for v in typing.get_args(tp)])
    if origin in (dict, Mapping) or (isinstance(tp, type) and issubclass(tp, BaseModel | dict)):
        return "a mapping"
    if origin in (tuple, list) or tp in (tuple, list):
        return "a list"
    words = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    if tp is Path:
        return "a path"
    return words.get(tp, "a valid value") if isinstance(tp, type) else "a valid value"


def _or_words(words: list[str]) -> str:
    words = list(dict.fromkeys(words))
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} or {words[-1]}"
