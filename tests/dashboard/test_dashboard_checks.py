"""The web dashboard's session page: expectations in their three states, and sessions
recorded before checks had a state."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.web import APP
from pantheon.sessions import STORE_ENV, SessionStore

WHY = "the process waited 41% of its busy time for a CPU; the handlers' own CPU time p99 is 1.2 ms"


def test_session_page_shows_inconclusive_beside_passed_and_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    summary = {
        "passed": True,
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
        store.end_session(sid, "completed", summary)
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
