"""A recorded session whose summary holds a check in each state (passed, inconclusive, and
a failed one recorded before checks had a ``state``), for both dashboards' tests."""

from __future__ import annotations

from pathlib import Path

from pantheon.sessions import SessionStore

__all__ = ["WHY", "checks_session"]

WHY = "the process waited 41% of its busy time for a CPU; the handlers' own CPU time p99 is 1.2 ms"


def checks_session(path: Path, *, status: str, passed: bool) -> str:
    """Record the session in the store at ``path``; returns its id."""
    summary = {
        "passed": passed,
        "expectations": [
            {"name": "zero lost", "passed": True, "expected": True, "actual": True,
             "state": "passed"},
            {"name": "timing: p99 handling reasoner <= 50 ms", "passed": True, "expected": 50,
             "actual": 226.5, "state": "inconclusive", "why": WHY},
            # Recorded before checks had a state: read from ``passed``.
            {"name": "accuracy >= 0.9", "passed": False, "expected": 0.9, "actual": 0.8},
        ],
    }  # fmt: skip
    with SessionStore(path) as store:
        sid = store.begin_session(scenario="checks", seed=1)
        store.end_session(sid, status, summary)
    return sid
