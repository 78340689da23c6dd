"""A failed run of the support team for the dashboard's what-if tests, and the emails a
refund limit of 200 moves in it, computed from the record and the Guardian's rule."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pantheon.sessions import SessionStore

__all__ = ["expected_moves", "failed_run"]

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "support_email_refunds.yaml"


@pytest.fixture(scope="module")
def failed_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One failed run of the support team (accuracy under its 0.8 bound), by ``pantheon run``."""
    path = tmp_path_factory.mktemp("whatif-dashboard") / "sessions.db"
    done = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", str(SCENARIO), "--store", str(path)],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "FAIL accuracy >= 0.8" in done.stdout
    with SessionStore(path, create=False) as store:
        (session,) = store.sessions()
    return path, session.id


def expected_moves(path: Path, session: str) -> set[str]:
    """Emails a refund limit of 200 instead of 50 sends to a reply instead of a human: the
    trusted refund proposals with an amount in (50, 200], from the record and the rule."""
    policy = yaml.safe_load(SCENARIO.read_text())["policy"]
    with SessionStore(path, create=False) as store:
        plans = [e.payload for e in store.envelopes(session) if e.topic == "plan.proposed"]
    return {
        p["email_id"]
        for p in plans
        if p["intent"] == "refund"
        and p["action"] == "reply"
        and p["confidence"] >= policy["min_confidence"]
        and p["amount"] is not None
        and 50.0 < p["amount"] <= 200.0
    }
