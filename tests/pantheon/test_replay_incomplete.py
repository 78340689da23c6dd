"""Replaying a recording that stops short, and one with no scenario text (issue #14, item 10).

A killed run leaves a prefix of its record: the replay says the recording is incomplete,
replays up to the last committed message and says how far it got, rather than calling the
missing tail a divergence. A session recorded without scenario text cannot rebuild its team
by itself: one line asks for ``--setup``.
"""

from __future__ import annotations

import json
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from sessions_team import email, make_setup
from typer.testing import CliRunner

from bus import Bus
from pantheon.cli import app
from pantheon.sessions import Recorder, SessionStore

TEAM = str(Path(__file__).with_name("sessions_team.py")) + ":team_setup"
CHANGED = str(Path(__file__).with_name("sessions_team.py")) + ":changed_team"


async def _record(path: Path, sid: str, scenario_text: str | None = "base") -> None:
    with SessionStore(path) as store:
        recorder = Recorder(store, session_id=sid, scenario="emails", scenario_text=scenario_text)
        async with Bus() as bus:
            recorder.attach(bus)
            await make_setup("base")(bus)
            for i in range(5):
                await bus.emit("email.received", email(i))
            await bus.drain()
        await recorder.finish("completed", {"emails": 5})
        store.materialize(sid)


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _kill_mid_run(path: Path, sid: str, keep: int) -> int:
    """Make the record what a SIGKILL leaves: everything committed up to the ``keep``-th
    message (by time), the session still ``running`` under a pid that is gone."""
    conn = sqlite3.connect(path)
    with conn:
        (cut,) = conn.execute(
            "SELECT created_ns FROM envelopes WHERE session = ? ORDER BY created_ns "
            "LIMIT 1 OFFSET ?",
            (sid, keep - 1),
        ).fetchone()
        conn.execute("DELETE FROM envelopes WHERE session = ? AND created_ns > ?", (sid, cut))
        conn.execute("DELETE FROM deliveries WHERE session = ? AND ended_ns > ?", (sid, cut))
        conn.execute("DELETE FROM effects WHERE session = ? AND ended_ns > ?", (sid, cut))
        conn.execute("DELETE FROM dead_letters WHERE session = ?", (sid,))
        conn.execute("DELETE FROM metrics WHERE session = ?", (sid,))
        conn.execute(
            "UPDATE sessions SET status = 'running', ended = NULL, summary = '{}', pid = ?, "
            "host = ? WHERE id = ?",
            (_dead_pid(), socket.gethostname(), sid),
        )
        (n,) = conn.execute("SELECT count(*) FROM envelopes WHERE session = ?", (sid,)).fetchone()
    conn.close()
    return int(n)


@pytest.fixture
async def killed(tmp_path: Path) -> tuple[Path, int]:
    path = tmp_path / "sessions.db"
    await _record(path, "killed")
    return path, _kill_mid_run(path, "killed", keep=9)


def test_replay_of_a_killed_run_says_the_recording_is_incomplete(
    killed: tuple[Path, int],
) -> None:
    path, recorded = killed
    result = CliRunner().invoke(app, ["replay", "killed", "--store", str(path), "--setup", TEAM])
    out = result.output
    assert "Traceback" not in out and "diverged" not in out, out
    assert result.exit_code == 0, out
    assert (
        "recording of killed is incomplete (aborted: its recording process died); replayed up "
        f"to its last committed message: {recorded} of {recorded} recorded messages reproduced"
    ) in out, out

    result = CliRunner().invoke(
        app, ["replay", "killed", "--store", str(path), "--setup", TEAM, "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert report["incomplete"] == "aborted: its recording process died"
    assert report["recorded_messages"] == recorded == report["reproduced_messages"]
    assert report["divergence"] is None and report["matched"]


def test_a_real_divergence_before_the_cut_is_still_one(killed: tuple[Path, int]) -> None:
    path, _ = killed
    result = CliRunner().invoke(app, ["replay", "killed", "--store", str(path), "--setup", CHANGED])
    assert result.exit_code == 1, result.output
    assert "incomplete" in result.output and "diverged" in result.output
    assert "'ham' -> 'urgent'" in result.output


@pytest.fixture
async def bare(tmp_path: Path) -> Path:
    path = tmp_path / "sessions.db"
    await _record(path, "bare", scenario_text=None)
    return path


def test_replay_without_scenario_text_asks_for_setup(bare: Path) -> None:
    path = bare
    for args in (["replay", "bare"], ["dlq", "redrive", "bare"], ["monitor", "bare"]):
        result = CliRunner().invoke(app, [*args, "--store", str(path)])
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        assert result.output.strip() == (
            f"error: session bare in {path} has no scenario text, so its team cannot be "
            "rebuilt from the record: pass --setup MODULE:FACTORY"
        )
    result = CliRunner().invoke(app, ["replay", "bare", "--store", str(path), "--setup", TEAM])
    assert result.exit_code == 0 and "matched" in result.output, result.output
