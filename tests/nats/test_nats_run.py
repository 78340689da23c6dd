"""``pantheon run`` of a NATS scenario: a throwaway nats-server (``server: auto``) and real
node processes on loopback, deciding every email as the in-process run does."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from pantheon.sessions import SessionStore

ROOT = Path(__file__).resolve().parents[2]


def run_json(workdir: Path, scenario: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", scenario, "--json", "--store", "s.db"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=180,
        env=os.environ | {"COLUMNS": "250"},
    )
    assert proc.returncode in (0, 1), proc.stderr  # 1: a timing bound on a loaded machine
    summary: dict[str, Any] = json.loads(proc.stdout)
    return summary


def outcomes(store: Path, session: str) -> dict[str, tuple[str, str]]:
    """(Guardian verdict, action taken) per email id, from the session's action.executed."""
    with SessionStore(store) as s:
        envelopes = s.envelopes(s.resolve(session))
    return {
        e.payload["email_id"]: (e.payload["verdict"], e.payload["action"])
        for e in envelopes
        if e.topic == "action.executed"
    }


def test_nats_nodes_decide_every_email_as_in_process(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    alone = run_json(tmp_path, "scenarios/support_email.yaml")
    over_nats = run_json(tmp_path, "scenarios/support_email_nats.yaml")

    expected = outcomes(tmp_path / "s.db", alone["session_id"])
    assert len(expected) == 591
    assert outcomes(tmp_path / "s.db", over_nats["session_id"]) == expected
    for key in ("inputs", "malformed", "decisions", "outbox", "accuracy", "seed"):
        assert over_nats[key] == alone[key], key

    def team_topics(s: dict[str, Any]) -> dict[str, int]:
        return {t: n for t, n in s["topics"].items() if not t.startswith(("monitor.", "system."))}

    assert team_topics(over_nats) == team_topics(alone)
    assert over_nats["accounting_ok"] is True
    functional = [e for e in over_nats["expectations"] if not e["name"].startswith("timing:")]
    assert [e for e in functional if not e["passed"]] == []
    nodes = over_nats["nodes"]
    assert set(nodes) == {"driver", "perception", "cognition", "action"}
    assert all(n["status"] == "ok" for n in nodes.values())
    assert len({n["pid"] for n in nodes.values()}) == 4
    # Every process went over the run's own server: their transports say so.
    urls = {n["transport"]["url"] for n in nodes.values()}
    assert len(urls) == 1 and urls.pop().startswith("nats://127.0.0.1:")
