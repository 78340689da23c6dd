"""The monitor's checks panel: a finished run's expectations in their three states."""

from __future__ import annotations

from pathlib import Path

from checks_session import WHY, checks_session
from pilot_wait import until as _until
from stopped_runs import interrupted_run
from textual.widgets import DataTable, Static, TabbedContent

from dashboard.tui import MonitorApp, StoreSource


async def test_checks_panel_shows_passed_failed_and_inconclusive(tmp_path: Path) -> None:
    path = tmp_path / "s.db"
    sid = checks_session(path, status="failed", passed=False)
    source = StoreSource(path, sid)
    app = MonitorApp(source)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            table = app.query_one("#check-table", DataTable)
            await _until(pilot, lambda: table.row_count == 3, "the checks")  # read in a thread
            await pilot.press("8")
            panels = app.query_one("#panels", TabbedContent)
            await _until(pilot, lambda: panels.active == "checks", "the checks panel")
            rows = [table.get_row(k) for k in ("0", "1", "2")]
            assert [(str(r[0]), r[0].style) for r in rows] == [
                ("PASSED", "green"),
                ("INCONCLUSIVE", "bold yellow"),
                ("FAILED", "bold red"),
            ]
            assert [str(c) for c in rows[1][1:]] == [
                "timing: p99 handling reasoner <= 50 ms", "50", "226.5",
            ]  # fmt: skip
            why = str(app.query_one("#checks-why", Static).render())
            assert why.strip() == f"INCONCLUSIVE timing: p99 handling reasoner <= 50 ms: {WHY}"
            line = str(app.query_one("#checks-line", Static).render())
            assert line == "1 failed, 1 inconclusive, 1 passed"
    finally:
        await source.aclose()


async def test_an_interrupted_run_s_checks_are_of_the_part_that_ran(tmp_path: Path) -> None:
    """A claims run stopped by Ctrl-C judged the part that ran (four checks passed): the
    panel says the run was not judged, and of what the four speak."""
    path, sid, summary = interrupted_run(tmp_path)
    inputs = summary["inputs"] + summary["malformed"]
    source = StoreSource(path, sid)
    app = MonitorApp(source)
    try:
        async with app.run_test(size=(120, 24)) as pilot:
            table = app.query_one("#check-table", DataTable)
            await _until(pilot, lambda: table.row_count == 4, "the checks")
            line = str(app.query_one("#checks-line", Static).render())
            assert line == (
                f"not judged, interrupted by SIGINT after {inputs} inputs; "
                "on the part that ran: 4 passed"
            )
    finally:
        await source.aclose()
