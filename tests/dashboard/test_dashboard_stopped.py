"""The session page of a run that stopped before the end of its input, under ``AppTest``,
on real claims runs: one stopped by Ctrl-C, others killed (in one process, over ZeroMQ).
Its expectations have no verdict, whatever checks its summary holds of the part that ran;
its caption says what finishes it, as ``pantheon resume`` would."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from claims_team import placed
from cli_run import pantheon
from stopped_runs import crashed_run, interrupted_run
from streamlit.testing.v1 import AppTest

from dashboard.web import APP
from pantheon.sessions import STORE_ENV, SessionStore
from pantheon.sessions.internals import Status


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    return interrupted_run(tmp_path_factory.mktemp("interrupted"))


def _page(store: Path, sid: str, monkeypatch: pytest.MonkeyPatch) -> AppTest:
    monkeypatch.setenv(STORE_ENV, str(store))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["session"] = sid
    at.run()
    assert not at.exception, at.exception
    return at


def _expectations(at: AppTest) -> tuple[str, str]:
    (metric,) = [m for m in at.metric if m.label == "expectations"]
    return metric.value, metric.proto.help


def test_an_interrupted_session_does_not_say_its_expectations_passed(
    interrupted: tuple[Path, str, dict[str, Any]], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its summary says ``passed`` (of the part that ran); the header said "expectations:
    passed" under the caption saying the input was stopped."""
    store, sid, summary = interrupted
    assert summary["passed"] is True
    inputs = summary["inputs"] + summary["malformed"]
    at = _page(store, sid, monkeypatch)
    assert _expectations(at) == (
        "not judged",
        f"Not judged: interrupted by SIGINT after {inputs} inputs, and expectations judge a "
        "whole run. On the part that ran: 4 passed, 0 failed.",
    )
    assert not at.error


def test_a_killed_session_says_its_expectations_were_not_judged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, sid = crashed_run(tmp_path)
    at = _page(store, sid, monkeypatch)
    assert _expectations(at) == (
        "not judged",
        "Not judged: its process died before the run ended, and expectations judge a whole run.",
    )


def _captions(at: AppTest) -> list[str]:
    return [c.value for c in at.caption if c.value.startswith(("Aborted", "Interrupted"))]


def test_a_killed_session_says_how_to_finish_it_then_which_session_did(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run whose process died is what ``pantheon resume`` is for: its page says so (it
    said nothing, where an interrupted one named the command), then names the resume."""
    store, sid = crashed_run(tmp_path)
    at = _page(store, sid, monkeypatch)
    assert _captions(at) == [
        "Aborted: its recording process died; the record stops there. "
        f"`pantheon resume {sid}` finishes the run."
    ]
    done = pantheon("resume", sid, "--store", str(store), "--json", cwd=tmp_path, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    new = json.loads(done.stdout)["resume"]["new_session_id"]
    at = _page(store, sid, monkeypatch)
    assert _captions(at) == [
        "Aborted: its recording process died; the record stops there. "
        f"It was resumed as {new} (completed), which finished the run."
    ]
    at.button(key="open_resumed").click().run()
    assert at.query_params["session"] == new


def test_a_killed_zeromq_session_says_why_it_cannot_be_resumed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ZeroMQ run's nodes' records go through its driver: one whose driver died cannot be
    resumed, and its page says why, in the words ``pantheon resume`` refuses it with,
    rather than a command that fails."""
    store, sid = crashed_run(tmp_path, placed("zmq"))
    refused = pantheon("resume", sid, "--store", str(store), cwd=tmp_path)
    why = (
        f"session {sid} is a ZeroMQ run: its nodes' records died with its driver, so "
        "resuming would do again what they did (a NATS run's survive)"
    )
    assert (refused.returncode, refused.stderr.splitlines()) == (2, [f"error: {why}"])
    at = _page(store, sid, monkeypatch)
    assert _captions(at) == [
        "Aborted: its recording process died; the record stops there. "
        f"`pantheon resume` refuses it: {why}."
    ]


def _resume_of(store: Path, original: str, status: Status, summary: dict[str, Any]) -> str:
    """A resume of ``original`` as ``pantheon resume`` records one (the run's recorded
    scenario), ended ``status``: its id."""
    with SessionStore(store) as st:
        info = st.session(original)
        new = st.begin_session(
            kind="resume",
            replay_of=original,
            scenario=info.scenario,
            scenario_text=info.scenario_text,
            scenario_dir=info.scenario_dir,
        )
        st.end_session(new, status, summary)
    return new


def test_a_resume_that_stopped_and_was_resumed_in_turn_is_followed_to_the_end(
    interrupted: tuple[Path, str, dict[str, Any]],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Resumed as A, whose process died, and A resumed as B, which completed: the run is
    finished, by B. The page named A and told the user to resume it, which ``pantheon
    resume`` would refuse (A was resumed already)."""
    store = tmp_path / "s.db"
    src, dst = sqlite3.connect(interrupted[0]), sqlite3.connect(store)
    try:
        src.backup(dst)
    finally:
        src.close()
        dst.close()
    sid = interrupted[1]
    first = _resume_of(store, sid, "aborted", {"aborted": "recording process is gone"})
    at = _page(store, sid, monkeypatch)
    whole = "its input was stopped and what was in flight finished; the record is whole."
    assert _captions(at) == [
        f"Interrupted (SIGINT): {whole} It was resumed as {first}, which stopped too: "
        f"`pantheon resume {first}` finishes the input."
    ]
    second = _resume_of(store, first, "completed", {"passed": True})
    at = _page(store, sid, monkeypatch)
    assert _captions(at) == [
        f"Interrupted (SIGINT): {whole} It was resumed as {second} (completed), which "
        "finished the input."
    ]
    at = _page(store, first, monkeypatch)
    assert _captions(at) == [
        "Aborted: its recording process died; the record stops there. "
        f"It was resumed as {second} (completed), which finished the run."
    ]
