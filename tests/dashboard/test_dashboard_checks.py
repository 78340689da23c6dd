"""The web dashboard's session page: expectations in their three states, and sessions
recorded before checks had a state."""

from __future__ import annotations

from pathlib import Path

import pytest
from checks_session import WHY, checks_session
from streamlit.testing.v1 import AppTest

from dashboard.web import APP
from pantheon.sessions import STORE_ENV


def test_session_page_shows_inconclusive_beside_passed_and_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    sid = checks_session(path, status="completed", passed=True)
    monkeypatch.setenv(STORE_ENV, str(path))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["session"] = sid
    at.run()
    assert not at.exception, at.exception
    assert {m.label: m.value for m in at.metric}["expectations"] == "passed, 1 inconclusive"
    (table,) = [d.value for d in at.dataframe if "expectation" in d.value.columns]
    assert list(table["state"]) == ["passed", "inconclusive", "failed"]
    assert list(table[""]) == ["✔", "?", "✖"]
    assert list(table["why"]) == ["", WHY, ""]
    assert [w.value for w in at.warning] == [
        f"? `timing: p99 handling reasoner <= 50 ms`: actual `226.5`, inconclusive: {WHY}"
    ]
    # Only the failed check is an error (streamlit shows the leading mark as the icon).
    assert [e.value for e in at.error] == [
        "Failed expectations: `accuracy >= 0.9`",
        "`accuracy >= 0.9`: actual `0.8`",
    ]
