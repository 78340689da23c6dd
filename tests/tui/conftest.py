"""A really recorded flaky_actor session (it has dead letters) shared by the monitor tests."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from bus import Bus
from pantheon.runner._build import team_setup

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def flaky(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """(store path, session id) of one ``pantheon run scenarios/flaky_actor.yaml``."""
    store = tmp_path_factory.mktemp("tui") / "sessions.db"
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "pantheon.cli", "run", "scenarios/flaky_actor.yaml"),
            *("--store", str(store), "--json"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert sum(summary["dlq"].values()) > 0, "flaky_actor should dead-letter some emails"
    return store, summary["session_id"]


def fixed_team(scenario_text: str | None):  # type: ignore[no-untyped-def]
    """The recorded team with its tool fixed (the scenario's faults removed): what a user
    redrives dead letters to once the cause is gone."""
    data = yaml.safe_load(scenario_text or "")
    data.pop("faults", None)
    setup = team_setup(yaml.safe_dump(data))

    async def fixed(bus: Bus) -> None:
        await setup(bus)

    return fixed


@pytest.fixture
def fixed_setup():  # type: ignore[no-untyped-def]
    return fixed_team
