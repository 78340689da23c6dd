"""Suite-wide: an xdist worker's environment is the one ``pytest`` was started with, and the
teams of ``scenarios/`` (``support``, ``oncall``) import as their scenarios import them: with
that folder on the path.

In a worker, GNU readline (imported by pytest's debugger support) finds no terminal and
exports ``COLUMNS=80`` and ``LINES=24``; every CLI child a test starts would then print at
80 columns, where a run in one process prints at full width. The controller hands its own
values to each worker, which puts them back before any test runs.

The sessions several folders read (``model_session``, ``node_sessions``) are recorded once
per run, not once per folder and worker: a fixture of a folder's conftest is a fixture of
its own, cached apart from the same function imported by another folder's, and each xdist
worker is a test session of its own. The first worker to need one records it; the other
waits on a lock and reads the same store (the tests only read it; one that changes a store
works on a copy). Measured on the 2-vCPU VM: the three-process ``node_sessions`` took 19-24 s
of set-up in each of three folders, ``model_session`` about 5 s in each of four.

The suite writes bytecode even where ``PYTHONDONTWRITEBYTECODE`` is set (as in the
developers' shells here): without it each worker rewrote and compiled all 300 test modules
on every run (collection 13.8 s against 4.3 s with their cached bytecode, one process,
2-vCPU VM), and each of the hundreds of ``pantheon`` child processes compiled the project's
modules from source (``pantheon --help``: 1.4-1.7 s against 1.1-1.3 s). ``__pycache__/`` is
ignored by git."""

from __future__ import annotations

import fcntl
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from model_session import ModelSession, record_model_session, write_model_scenario
from node_session import NodeSessions, record_node_sessions

sys.dont_write_bytecode = False  # this process's modules, the test modules among them
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)  # the workers and every child process

_SIZE = ("COLUMNS", "LINES")
_T = TypeVar("_T")

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


def _once_per_run(factory: pytest.TempPathFactory, name: str, record: Callable[[Path], _T]) -> _T:
    """``record(folder)`` run by the first worker that asks; every other worker, waiting on
    the lock meanwhile, gets the same result (pickled beside the folder)."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        return record(factory.mktemp(name))
    shared = factory.getbasetemp().parent  # the run's folder, above each worker's own
    with (shared / f"{name}.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        done = shared / f"{name}.pickle"
        if done.exists():
            result: _T = pickle.loads(done.read_bytes())
            return result
        folder = shared / name
        folder.mkdir()
        result = record(folder)
        done.write_bytes(pickle.dumps(result))
        return result


@pytest.fixture(scope="session")
def model_scenario() -> Callable[..., Path]:
    """:func:`model_session.write_model_scenario`, for tests that run the scenario their own
    way."""
    return write_model_scenario


@pytest.fixture(scope="session")
def model_session(tmp_path_factory: pytest.TempPathFactory) -> ModelSession:
    """The support team's run against a model server, with prices, recorded once."""
    return _once_per_run(tmp_path_factory, "model_session", record_model_session)


@pytest.fixture(scope="session")
def node_sessions(tmp_path_factory: pytest.TempPathFactory) -> NodeSessions:
    """:func:`node_session.record_node_sessions`, recorded once."""
    return _once_per_run(tmp_path_factory, "nodes", record_node_sessions)
