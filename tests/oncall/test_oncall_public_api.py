"""The on-call team is built on Pantheon's public API and nothing else: no module or name
that starts with ``_``, and from our packages only what a public module's ``__all__``
exports."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

TEAM = Path(__file__).resolve().parents[2] / "scenarios" / "oncall"
OURS = ("agents", "bus", "pantheon", "dashboard")
# Not ours, and every module may use it.
ALLOWED_DUNDER = {"__future__"}


def private_imports(source: str) -> list[str]:
    """Every import in ``source`` of a private module or name, or of a name our packages do
    not export, described as ``line: what``."""
    problems: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if any(p.startswith("_") for p in parts) and alias.name not in ALLOWED_DUNDER:
                    problems.append(f"{node.lineno}: import {alias.name}")
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            parts = [p for p in module.split(".") if p]
            if module not in ALLOWED_DUNDER and any(p.startswith("_") for p in parts):
                problems.append(f"{node.lineno}: from {module} import ...")
                continue
            for alias in node.names:
                if alias.name.startswith("_") and module not in ALLOWED_DUNDER:
                    problems.append(f"{node.lineno}: from {module} import {alias.name}")
                elif parts and parts[0] in OURS:
                    exported = getattr(importlib.import_module(module), "__all__", ())
                    if alias.name not in exported:
                        problems.append(
                            f"{node.lineno}: from {module} import {alias.name} "
                            f"(not in {module}.__all__)"
                        )
    return problems


def team_modules() -> list[Path]:
    return sorted(TEAM.glob("*.py"))


def test_the_team_is_a_package_of_several_modules() -> None:
    names = {p.name for p in team_modules()}
    assert {"__init__.py", "agents.py", "alerts.py", "policy.py", "tools.py"} <= names


@pytest.mark.parametrize("path", team_modules(), ids=lambda p: p.name)
def test_team_module_imports_only_public_names(path: Path) -> None:
    assert private_imports(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("source", "found"),
    [
        ("from agents._action import Guardian", "from agents._action import ..."),
        ("import agents._base", "import agents._base"),
        ("from agents import _helper", "from agents import _helper"),
        ("from pantheon._team import build_team", "from pantheon._team import ..."),
        ("from bus import GlobIndex", "(not in bus.__all__)"),
        ("from agents import redact, Agent as A, _x", "from agents import _x"),
        ("from mylib._impl import thing", "from mylib._impl import ..."),
        ("from pantheon.scenario import _locate", "from pantheon.scenario import _locate"),
        ("from pantheon.scenario import agent_class", "(not in pantheon.scenario.__all__)"),
    ],
)
def test_the_check_catches_private_imports(source: str, found: str) -> None:
    [problem] = private_imports(source)
    assert found in problem


def test_the_check_lets_public_imports_through() -> None:
    source = (
        "from __future__ import annotations\n"
        "import pantheon\n"
        "from agents import Agent, Learner, Observer\n"
        "from bus import Envelope, Priority\n"
        "from bus.testing import capture_events\n"
        "import pantheon.scenario\n"
        "from oncall.estate import epoch\n"
        "from . import policy\n"
    )
    assert private_imports(source) == []
