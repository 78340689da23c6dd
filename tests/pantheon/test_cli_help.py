"""``pantheon --help`` and every command's ``--help`` read as paragraphs at 80 columns:
a sentence breaks only where the terminal's width makes it, never where the docstring's
source line ended (the issue's ``decision changed`` / ``(grouped before→after``)."""

from __future__ import annotations

import inspect
import re
from itertools import pairwise
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from pantheon.cli import app

WIDTH = 80


def _commands(group: Any, path: tuple[str, ...] = ()) -> list[tuple[tuple[str, ...], Any]]:
    found = [(path, group)]
    for name, sub in sorted(getattr(group, "commands", {}).items()):
        found += _commands(sub, (*path, name))
    return found


COMMANDS = _commands(typer.main.get_command(app))


def _help(path: tuple[str, ...]) -> list[str]:
    result = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": str(WIDTH)})
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert max(len(line) for line in lines) <= WIDTH
    return lines


def _assert_greedy(cell: list[str], width: int, where: str) -> None:
    """Wrapped greedily at ``width``: the next line's first word did not fit on this one.
    A hard break from the source leaves a short line whose successor would have fitted."""
    for line, after in pairwise(cell):
        if not line or not after:
            continue  # a paragraph break
        assert len(line) + 1 + len(after.split()[0]) > width, f"{where}: {line!r} / {after!r}"


@pytest.mark.parametrize("path", [p for p, _ in COMMANDS], ids=lambda p: " ".join(p) or "-")
def test_the_description_wraps_only_at_the_width(path: tuple[str, ...]) -> None:
    lines = _help(path)
    top = lines.index(next(line for line in lines if line.startswith("╭")))
    text = [line.strip() for line in lines[:top] if not line.strip().startswith("Usage:")]
    while text and not text[0]:
        text.pop(0)
    _assert_greedy(text, WIDTH - 2, " ".join(path) or "pantheon")


@pytest.mark.parametrize(
    "path",
    [p for p, c in COMMANDS if getattr(c, "commands", None)],
    ids=lambda p: " ".join(p) or "-",
)
def test_each_command_in_a_list_reads_as_one_paragraph(path: tuple[str, ...]) -> None:
    lines = _help(path)
    start = lines.index(next(line for line in lines if line.startswith("╭─ Commands")))
    rows = [line[1:-1].rstrip() for line in lines[start + 1 :] if line.startswith("│")]
    first = re.match(r" \S+ +", rows[0])  # " export     Export a session's ..."
    assert first is not None, rows[0]
    column = first.end()
    cells: list[list[str]] = []
    for row in rows:
        if row[1:2].strip():  # a command's name starts a new cell
            cells.append([])
        cells[-1].append(row[column:].strip())
    assert len(cells) == len(dict(COMMANDS)[path].commands)
    for cell in cells:
        _assert_greedy(cell, WIDTH - 3 - column, " ".join(path) or "pantheon")


def test_the_issues_example_is_one_sentence() -> None:
    text = " ".join(_help(()))
    assert "decision changed (grouped before→after" in " ".join(text.replace("│", " ").split())
    assert "\n" in (inspect.getdoc(dict(COMMANDS)[("diff",)].callback) or "")  # in the source
    assert "\n" not in dict(COMMANDS)[("diff",)].help  # one paragraph, one line: rich wraps it
