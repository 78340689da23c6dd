"""The monitor's approvals panel under Textual's Pilot, on a real ``pantheon run`` waiting
for a person in another process: ``a`` approves and ``x`` rejects, each with a note, and
the run goes on with those decisions."""

from __future__ import annotations

import json
from pathlib import Path

from approval_run import stop, waiting_run
from pilot_wait import until
from textual.widgets import DataTable, Input, Static, TabbedContent

from dashboard.tui import MonitorApp, StoreSource
from dashboard.tui._approvals import DecisionScreen
from pantheon.approvals._desk import who
from pantheon.sessions import ApprovalBook, SessionStore


async def test_keys_approve_and_reject_with_a_note_and_the_run_goes_on(tmp_path: Path) -> None:
    run, store, sid, rows = waiting_run(tmp_path)
    by_email = {a.request["email_id"]: a.id for a in rows}
    app = MonitorApp(StoreSource(store, sid))
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            table = app.query_one("#approval-table", DataTable)
            await until(pilot, lambda: table.row_count == 2, "two requests in the table")
            assert {str(k.value) for k in table.rows} == {str(a.id) for a in rows}
            # Outside the panel the key says where to go, and decides nothing.
            await pilot.press("a")
            assert not isinstance(app.screen, DecisionScreen)
            await pilot.press("7")
            tabs = app.query_one("#panels", TabbedContent)
            assert tabs.active == "approvals"
            line = app.query_one("#approvals-line", Static)
            assert str(line.render()).startswith("2 waiting for a decision")
            first = app.selected_approval()
            assert first is not None and first.pending
            await pilot.press("a")
            assert isinstance(app.screen, DecisionScreen)
            app.screen.query_one(Input).value = "receipt checked"
            await pilot.press("enter")
            await until(pilot, lambda: not app._approvals[str(first.id)].pending, "the approval")
            second = next(a for a in rows if a.id != first.id)
            table.move_cursor(row=table.get_row_index(str(second.id)))
            await pilot.press("x")
            assert isinstance(app.screen, DecisionScreen)
            app.screen.query_one(Input).value = "too much"
            await pilot.press("enter")
            await until(pilot, lambda: not app._approvals[str(second.id)].pending, "the reject")
            # A request decided already is not asked about again.
            await pilot.press("a")
            assert not isinstance(app.screen, DecisionScreen)
            assert str(line.render()) == "2 requests, none waiting"
        out, err = run.communicate(timeout=60)
    finally:
        stop(run)
        await app.source.aclose()
    assert run.returncode == 0, err
    with SessionStore(store, create=False) as st:
        decided = {a.id: (a.status, a.decided_by, a.note) for a in ApprovalBook(st).entries(sid)}
    assert decided == {
        first.id: ("approved", who(), "receipt checked"),
        second.id: ("rejected", who(), "too much"),
    }
    summary = json.loads(out)
    assert summary["decisions"] == {"approved": 5, "rejected": 1}
    assert set(by_email) == {"e0046", "e0081"}
