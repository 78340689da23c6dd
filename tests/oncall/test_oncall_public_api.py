"""The on-call team is built on Pantheon's public API and nothing else: no module or name
that starts with ``_``, no ``internals`` module (a room's face for its sibling rooms), and
from our packages only what a public module's ``__all__`` exports."""

from __future__ import annotations

from pathlib import Path

import pytest
from public_api import private_imports

TEAM = Path(__file__).resolve().parents[2] / "scenarios" / "oncall"


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
        ("from agents import Outbox, Agent as A, _x", "from agents import _x"),
        ("from mylib._impl import thing", "from mylib._impl import ..."),
        ("from pantheon.scenario import _locate", "from pantheon.scenario import _locate"),
        ("from pantheon.scenario import agent_class", "(not in pantheon.scenario.__all__)"),
        (
            "from pantheon.scenario.internals import agent_class",
            "from pantheon.scenario.internals import ...",
        ),
        ("import pantheon.sessions.internals", "import pantheon.sessions.internals"),
        ("from pantheon.sessions import internals", "from pantheon.sessions import internals"),
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
