"""Approving from the web dashboard: a real ``pantheon run`` waits for a person in another
process; the session page's buttons decide, under ``AppTest`` and in headless Chromium."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from approval_run import stop, waiting_run
from streamlit.testing.v1 import AppTest

from dashboard.web import APP
from pantheon.approvals._desk import who
from pantheon.sessions import STORE_ENV, ApprovalBook, SessionStore


def _decided(store: Path, sid: str) -> dict[int, tuple[str, str | None, str]]:
    with SessionStore(store, create=False) as st:
        return {a.id: (a.status, a.decided_by, a.note) for a in ApprovalBook(st).entries(sid)}


def test_the_session_pages_buttons_decide_for_the_running_team(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run, store, sid, rows = waiting_run(tmp_path)
    first, second = sorted(rows, key=lambda a: a.id)
    try:
        monkeypatch.setenv(STORE_ENV, str(store))
        at = AppTest.from_file(str(APP), default_timeout=60)
        at.query_params["session"] = sid
        at.run()
        assert not at.exception, at.exception
        assert "Approvals (2 waiting)" in [h.value for h in at.subheader]
        assert {b.key for b in at.button} >= {
            f"approve_{sid}_{first.id}",
            f"reject_{sid}_{first.id}",
            f"approve_{sid}_{second.id}",
            f"reject_{sid}_{second.id}",
        }
        at.text_input(key=f"approval_note_{sid}_{first.id}").input("receipt checked")
        at.button(key=f"approve_{sid}_{first.id}").click().run()
        assert not at.exception, at.exception
        assert f"#{first.id} approved: receipt checked" in [s.value for s in at.success]
        at.text_input(key=f"approval_note_{sid}_{second.id}").input("too much")
        at.button(key=f"reject_{sid}_{second.id}").click().run()
        assert f"#{second.id} rejected: too much" in [s.value for s in at.success]
        out, err = run.communicate(timeout=60)
    finally:
        stop(run)
    assert run.returncode == 0, err
    assert _decided(store, sid) == {
        first.id: ("approved", who(), "receipt checked"),
        second.id: ("rejected", who(), "too much"),
    }
    assert sum(json.loads(out)["decisions"].values()) == 6
    # The finished session lists both decisions, and no buttons.
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["session"] = sid
    at.run()
    assert not at.exception, at.exception
    table = next(d.value for d in at.dataframe if "decision" in d.value.columns)
    assert sorted(zip(table["#"], table["decision"], table["note"], strict=True)) == [
        (first.id, "approved", "receipt checked"),
        (second.id, "rejected", "too much"),
    ]
    assert not [b for b in at.button if b.key and b.key.startswith("approve_")]
