"""After a decision the approvals list re-sorts (waiting first, then the decided ones): the
cursor goes on to the next request still waiting, never sits on the one just decided, and
stays on its request when someone else's decision moves the rows around it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pilot_wait import until
from textual.pilot import Pilot
from textual.widgets import DataTable, Input

from dashboard.tui import MonitorApp, StoreSource
from dashboard.tui._approvals import DecisionScreen
from pantheon.sessions import ApprovalBook, SessionStore


def _three_waiting(store: Path) -> str:
    with SessionStore(store) as st:
        sid = st.begin_session(scenario="desk", seed=1)
        book = ApprovalBook(st)
        for n in (1, 2, 3):
            book.ask(
                origin=sid, session=sid, agent="guardian", key=f"k{n}",
                request={"summary": f"refund {n}"}, timeout=600, default_approve=False,
            )  # fmt: skip
    return sid


async def _decide(pilot: Pilot[Any], app: MonitorApp, key: str, note: str) -> None:
    await pilot.press(key)
    assert isinstance(app.screen, DecisionScreen)
    app.screen.query_one(Input).value = note
    await pilot.press("enter")


def _selected(app: MonitorApp) -> int | None:
    approval = app.selected_approval()
    return None if approval is None else approval.id


async def test_the_cursor_moves_on_to_the_next_waiting_request(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    sid = _three_waiting(store)
    app = MonitorApp(StoreSource(store, sid))
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            table = app.query_one("#approval-table", DataTable)
            await until(pilot, lambda: table.row_count == 3, "three requests")
            await pilot.press("7")
            assert _selected(app) == 1
            await _decide(pilot, app, "a", "fine")
            await until(pilot, lambda: not app._approvals["1"].pending, "the approval")
            # #1 went below the waiting ones; the cursor is on #2, not on #1.
            assert [str(k.value) for k in table.rows] == ["2", "3", "1"]
            assert _selected(app) == 2 and table.cursor_row == 0

            # Someone else decides #3: the rows move, the cursor stays on #2.
            with SessionStore(store) as st:
                ApprovalBook(st).decide(sid, 3, approved=True, by="someone else")
            await until(pilot, lambda: not app._approvals["3"].pending, "the other decision")
            assert [str(k.value) for k in table.rows] == ["2", "3", "1"]
            assert _selected(app) == 2

            # The last one waiting decided: nothing waits, the cursor stays on it.
            await _decide(pilot, app, "x", "no")
            await until(pilot, lambda: not app._approvals["2"].pending, "the reject")
            assert _selected(app) == 2 and app._approvals["2"].status == "rejected"
    finally:
        await app.source.aclose()


async def test_deciding_the_last_in_the_list_goes_back_to_the_one_before(tmp_path: Path) -> None:
    store = tmp_path / "s.db"
    sid = _three_waiting(store)
    app = MonitorApp(StoreSource(store, sid))
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            table = app.query_one("#approval-table", DataTable)
            await until(pilot, lambda: table.row_count == 3, "three requests")
            await pilot.press("7")
            table.move_cursor(row=table.get_row_index("3"))
            await _decide(pilot, app, "a", "ok")
            await until(pilot, lambda: not app._approvals["3"].pending, "the approval")
            assert [str(k.value) for k in table.rows] == ["1", "2", "3"]
            assert _selected(app) == 2
    finally:
        await app.source.aclose()
