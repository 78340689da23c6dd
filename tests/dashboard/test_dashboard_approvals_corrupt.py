"""A corrupt row of the approvals table on both dashboards: said in one line, offered no
buttons, and the other requests shown and decided as ever. Before, the row's JSONDecodeError
failed the whole approvals panel."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from dashboard.tui._approvals import approval_cells, read_approvals
from dashboard.web import APP
from pantheon.sessions import STORE_ENV, ApprovalBook, SessionStore


def _store(path: Path) -> None:
    with SessionStore(path) as st:
        st.begin_session("s", scenario="x", scenario_text="x", seed=1)
        book = ApprovalBook(st)
        for i in range(2):
            book.ask(origin="s", session="s", agent="guard", key=f"k#{i}",
                     request={"summary": f"refund {i}"}, timeout=600,
                     default_approve=False)  # fmt: skip
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE approvals SET request = '{oops', deadline = 'soon' WHERE id = 2")
    conn.close()


CORRUPT = (
    "approval 2 of session s is corrupt in the store: request is not JSON (JSONDecodeError: "
    "Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
)


def test_the_web_page_says_the_corrupt_row_and_decides_the_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = tmp_path / "s.db"
    _store(store)
    monkeypatch.setenv(STORE_ENV, str(store))
    at = AppTest.from_file(str(APP), default_timeout=60)
    at.query_params["session"] = "s"
    at.run()
    assert not at.exception, at.exception
    assert CORRUPT in [e.value for e in at.error]
    buttons = {b.key for b in at.button if b.key and b.key.startswith(("approve_", "reject_"))}
    assert buttons == {"approve_s_1", "reject_s_1"}
    at.button(key="approve_s_1").click().run()
    assert not at.exception, at.exception
    assert "#1 approved" in [s.value for s in at.success]


def test_the_terminal_monitor_lists_the_corrupt_row_as_corrupt(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    _store(store)
    cells = [approval_cells(a) for a in read_approvals(store, "s")]
    assert cells[0][:3] == ("1", cells[0][1], "guard") and cells[0][1].startswith("pending (")
    assert cells[1][:2] == ("2", f"corrupt: {CORRUPT.split('store: ', 1)[1]}")
