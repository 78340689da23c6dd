"""The monitor's usage panel says what each budget scope spent and whether it stopped
model calls, read from a real budgeted run's store."""

from __future__ import annotations

import asyncio
from pathlib import Path

from budget_session import PER_CALL, TICKETS, budgeted_run
from pilot_wait import until as _until
from textual.widgets import Static, TabbedContent

from dashboard.tui import MonitorApp, StoreSource


async def test_usage_panel_shows_the_budget_that_stopped_the_run(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    # A run is synchronous (it has its own loop): in a thread, off this test's loop.
    summary = await asyncio.to_thread(budgeted_run, tmp_path / "team", path)
    calls = summary.usage["calls"]
    assert summary.session_id is not None and calls < TICKETS
    source = StoreSource(path, summary.session_id)
    app = MonitorApp(source)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            line = app.query_one("#usage-budget", Static)
            await _until(pilot, lambda: "budget run" in str(line.render()), "the budget line")
            await pilot.press("6")
            panels = app.query_one("#panels", TabbedContent)
            await _until(pilot, lambda: panels.active == "usage", "the usage panel")
            assert str(line.render()).strip() == (
                f"budget run: {calls * PER_CALL} of 23 tokens  "
                f"STOPPED, {TICKETS - calls} calls refused"
            )
    finally:
        await source.aclose()
