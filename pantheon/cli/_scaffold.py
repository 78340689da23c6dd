"""``pantheon new``: a working team folder written from the templates in ``pantheon/_templates``.

The templates are files, not strings in code, so each reads as what it becomes (YAML, Python,
Markdown) and a change to one shows in review as a change to that file. Substitution is
deliberately dumb: ``{{key}}`` replaced by a fixed set of values, with an unknown key an
error, so no template engine is needed and no brace in YAML, JSON or Python is ever special.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator, Mapping
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path, PurePosixPath

from pantheon._errors import PantheonError

__all__ = [
    "TEMPLATE",
    "TeamNameError",
    "check_team_name",
    "new_team",
    "render",
    "team_values",
    "template_files",
]

#: The template folder a new team is written from, under ``pantheon/_templates``.
TEMPLATE = "team"

# A letter first (the name becomes a module name and a scenario name); lower case, since a
# scenario name is; '-' allowed in the folder and scenario names, '_' in its place in code.
# At most 32 characters, so every generated line that holds the name stays within 100.
_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_KEY = re.compile(r"\{\{(\w+)\}\}")
_SUFFIX = ".tmpl"
# setuptools' package-data globs skip dotfiles, so `.gitignore` ships as `dot-gitignore`.
_DOT = "dot-"


class TeamNameError(PantheonError, ValueError):
    """A team name that cannot be a folder, scenario name and module name all at once."""


def check_team_name(name: str) -> str:
    """``name`` if it works as the team's folder, scenario name and (with ``-`` as ``_``) the
    start of its module name; :class:`TeamNameError` saying what would, otherwise."""
    if _NAME.fullmatch(name):
        return name
    suggestion = re.sub(r"[^a-z0-9_-]+", "_", name.lower()).strip("_-")
    suggestion = re.sub(r"^[^a-z]+", "", suggestion)[:32]
    hint = f" (e.g. {suggestion!r})" if suggestion and _NAME.fullmatch(suggestion) else ""
    raise TeamNameError(
        f"invalid team name {name!r}: use lower-case letters, digits, '_' and '-', starting "
        f"with a letter, at most 32 characters{hint}"
    )


def render(text: str, values: Mapping[str, str]) -> str:
    """``text`` with every ``{{key}}`` replaced by ``values[key]``; ``KeyError`` for a key
    with no value, which is a mistake in a template, never something to pass through."""

    def sub(match: re.Match[str]) -> str:
        key = match.group(1)
        if key not in values:
            raise KeyError(f"template key {{{{{key}}}}} has no value (known: {sorted(values)})")
        return values[key]

    return _KEY.sub(sub, text)


def _walk(folder: Traversable, at: PurePosixPath) -> Iterator[tuple[PurePosixPath, str]]:
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        if entry.is_dir():
            if entry.name != "__pycache__":
                yield from _walk(entry, at / entry.name)
        elif entry.name.endswith(_SUFFIX):
            yield at / entry.name, entry.read_text(encoding="utf-8")


def template_files(template: str = TEMPLATE) -> list[tuple[PurePosixPath, str]]:
    """Every file of a template: its path inside the template (still with placeholders and
    the ``.tmpl`` suffix) and its text."""
    root = resources.files("pantheon").joinpath("_templates", template)
    return list(_walk(root, PurePosixPath()))


def team_values(name: str) -> dict[str, str]:
    """What the placeholders stand for: ``name`` (folder and scenario), ``ident`` (the name
    as a Python identifier) and ``module`` (the team's agents module, named after the team so
    it never shadows Pantheon's own ``agents`` package)."""
    ident = name.replace("-", "_")
    return {"name": name, "ident": ident, "module": f"{ident}_agents"}


def new_team(name: str, parent: Path) -> list[Path]:
    """Write a new team folder ``parent/name`` and return the files written, in order.

    Raises :class:`TeamNameError` for a bad name and ``FileExistsError`` if anything already
    has that path: an existing folder is never written into. The folder appears whole or not
    at all: a failure halfway removes what was written.
    """
    check_team_name(name)
    values = team_values(name)
    files = sorted(
        (_target(path, values), render(text, values)) for path, text in template_files(TEMPLATE)
    )
    parent.mkdir(parents=True, exist_ok=True)
    root = parent / name
    root.mkdir()  # exclusive: FileExistsError if a file or folder is already there
    written: list[Path] = []
    try:
        for rel, text in files:
            path = root.joinpath(*rel.parts)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            written.append(path)
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    return written


def _target(path: PurePosixPath, values: Mapping[str, str]) -> PurePosixPath:
    name = render(path.name.removesuffix(_SUFFIX), values)
    if name.startswith(_DOT):
        name = "." + name.removeprefix(_DOT)
    return path.with_name(name)
