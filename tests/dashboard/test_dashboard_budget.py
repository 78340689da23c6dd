"""The web dashboard's session page says what each budget scope spent and whether it
stopped model calls, read from a real budgeted run's store."""

from __future__ import annotations

from pathlib import Path

import pytest
from budget_session import PER_CALL, TICKETS, budgeted_run
from streamlit.testing.v1 import AppTest

from dashboard.web import APP
from pantheon.sessions import STORE_ENV


def test_session_page_shows_the_budget_that_stopped_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.db"
    summary = budgeted_run(tmp_path / "team", path)
    calls = summary.usage["calls"]
    assert calls < TICKETS  # the budget stopped it
    monkeypatch.setenv(STORE_ENV, str(path))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["session"] = summary.session_id
    at.run()
    assert not at.exception, at.exception
    budget = [m.value for m in at.markdown if m.value.startswith("**Budget")]
    assert budget == [
        f"**Budget run**: {calls * PER_CALL:,} of 23 tokens "
        f":red-badge[stopped] {TICKETS - calls:,} call(s) refused"
    ]
