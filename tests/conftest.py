"""Suite-wide: an xdist worker's environment is the one ``pytest`` was started with, and the
teams of ``scenarios/`` (``support``, ``oncall``) import as their scenarios import them: with
that folder on the path.

In a worker, GNU readline (imported by pytest's debugger support) finds no terminal and
exports ``COLUMNS=80`` and ``LINES=24``; every CLI child a test starts would then print at
80 columns, where a run in one process prints at full width. The controller hands its own
values to each worker, which puts them back before any test runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest

_SIZE = ("COLUMNS", "LINES")

SCENARIOS = Path(__file__).resolve().parents[1] / "scenarios"
if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))


@pytest.hookimpl(optionalhook=True)  # xdist's hook: absent with -p no:xdist
def pytest_configure_node(node: Any) -> None:
    """On the controller (xdist's hook): what the terminal size variables are here."""
    node.workerinput["terminal_size_env"] = {name: os.environ.get(name) for name in _SIZE}


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    started_with = getattr(config, "workerinput", {}).get("terminal_size_env")
    if started_with is None:
        return  # the controller, or a run without xdist: nothing changed the environment
    for name, value in started_with.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
