"""The session page of a run that stopped before the end of its input, under ``AppTest``,
on real claims runs: one stopped by Ctrl-C, one killed. Its expectations have no verdict,
whatever checks its summary holds of the part that ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from stopped_runs import crashed_run, interrupted_run
from streamlit.testing.v1 import AppTest

from dashboard.web import APP
from pantheon.sessions import STORE_ENV


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
