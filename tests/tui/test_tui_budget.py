"""The monitor's usage panel says what each budget scope spent and whether it stopped
model calls, read from a real budgeted run's store."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from budget_session import PER_CALL, REPLY, TICKETS, budget_scenario, budget_team, budgeted_run
from pilot_wait import until
from textual.widgets import Static, TabbedContent

from dashboard.tui import LiveSource, MonitorApp, StoreSource
from pantheon.cli._cmd_monitor import _child_session
from pantheon.live import connect
from pantheon.testing import ModelServer


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
            await until(pilot, lambda: "budget run" in str(line.render()), "the budget line")
            await pilot.press("6")
            panels = app.query_one("#panels", TabbedContent)
            await until(pilot, lambda: panels.active == "usage", "the usage panel")
            assert str(line.render()).strip() == (
                f"budget run: {calls * PER_CALL} of 23 tokens  "
                f"STOPPED, {TICKETS - calls} calls refused"
            )
    finally:
        await source.aclose()


def _start_run(scenario: Path, store: Path) -> subprocess.Popen[bytes]:
    """``pantheon run`` in a child, as ``run --tui`` starts it."""
    args = [sys.executable, "-m", "pantheon.cli", "run", scenario.name, "--store", str(store)]
    return subprocess.Popen(
        args, cwd=scenario.parent, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip


async def test_the_live_feed_shows_the_budget_stopping_calls_while_the_run_goes(
    tmp_path: Path,
) -> None:
    team = budget_team(tmp_path / "team")
    path = budget_scenario(team, "run: {tokens: 23}", 'asker: {class: "budget_team_mod:Asker"}')
    with ModelServer(reply=REPLY) as server:
        # Paced at a ticket a second: the budget is spent after 5 (5 s), and the run goes
        # on for 15 s more, refusing, while the feed is live: room for a loaded machine to
        # start the run and the monitor.
        text = path.read_text(encoding="utf-8")
        text = text.replace("http://127.0.0.1:1/v1", server.base_url)
        text = text.replace("  topic: ticket.received\n", "  topic: ticket.received\n  rate: 1\n")
        path.write_text(text, encoding="utf-8")
        store = tmp_path / "s.db"
        child = _start_run(path, store)
        try:
            found = await asyncio.to_thread(_child_session, child, store)
            assert found is not None
            sid, feed, _info = found
            assert feed is not None, "the run should serve a live feed"
            source = LiveSource(await connect(feed), StoreSource(store, sid))
            app = MonitorApp(source)
            try:
                async with app.run_test(size=(100, 30)) as pilot:
                    line = app.query_one("#usage-budget", Static)

                    def stopped_live() -> bool:
                        snap = app.snapshot
                        return (
                            snap is not None and snap.live and any(b.stopped for b in snap.budget)
                        )

                    await until(pilot, stopped_live, "a live snapshot of the spent budget")
                    await pilot.pause(0.2)
                    shown = str(line.render()).strip()
                    assert shown.startswith("budget run: 25 of 23 tokens  STOPPED, "), shown
            finally:
                await source.aclose()
        finally:
            await asyncio.to_thread(child.wait, 120)
    assert child.returncode == 0
