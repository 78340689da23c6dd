"""One real store for the dashboard tests: a failed run with dead letters and a passing one,
recorded once per test session by ``pantheon run`` itself."""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from dashboard_store import Recorded

from pantheon.sessions import SessionStore

FAILING = Path(__file__).with_name("flaky_strict.yaml")
PASSING = Path(__file__).with_name("calm.yaml")


def _run(scenario: Path, store: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", str(scenario), "--store", str(store)],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=store.parent,
        check=False,
    )


@pytest.fixture(scope="session")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Recorded:
    """The store as recorded. Tests that change it (replay, redrive) work on a copy."""
    path = tmp_path_factory.mktemp("dashboard") / "sessions.db"
    failing = _run(FAILING, path)
    assert failing.returncode == 1, failing.stdout + failing.stderr  # an expectation failed
    passing = _run(PASSING, path)
    assert passing.returncode == 0, passing.stdout + passing.stderr
    with SessionStore(path, create=False) as store:
        by_name = {s.scenario: s for s in store.sessions()}
    assert by_name["flaky_strict"].status == "failed"
    assert store_dead_letters(path, by_name["flaky_strict"].id) > 0
    return Recorded(path, by_name["flaky_strict"].id, by_name["calm"].id)


def store_dead_letters(path: Path, sid: str) -> int:
    with SessionStore(path, create=False) as store:
        return len(store.dead_letters(sid))


@pytest.fixture
def recorded(pristine: Recorded, tmp_path: Path) -> Recorded:
    """A private copy of the recorded store (SQLite's backup API: WAL content included)."""
    copy = tmp_path / "sessions.db"
    src, dst = sqlite3.connect(pristine.path), sqlite3.connect(copy)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    return Recorded(copy, pristine.failed, pristine.passed)
