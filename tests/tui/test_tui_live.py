"""The monitor on a real run's live feed, past the run's end: the feed closes, the source
switches to the store, and the keys still switch panels at once (issue #13, item 7)."""

from __future__ import annotations

import asyncio
import subprocess
import sys
import time
from itertools import pairwise
from pathlib import Path

from pilot_wait import until
from textual.widgets import DataTable, TabbedContent, TabPane

from dashboard.tui import LiveSource, MonitorApp, StoreSource
from dashboard.tui._app import MAX_ROWS
from pantheon.cli._cmd_monitor import _child_session
from pantheon.live import connect

ROOT = Path(__file__).resolve().parents[2]
#: Longer than any pause of the event loop a user would accept after pressing a key; the
#: monitor used to stall for seconds once the flood run's record replaced its feed. Measured
#: in CPU time of the loop's thread (``time.thread_time``): what the monitor's own work
#: holds the loop for. On a loaded machine (the suite's other worker, two busy loops beside
#: it) the wall clock also counts the time the OS ran someone else, which is no stall of
#: the monitor's making; on a quiet one the two are the same.
KEY_LATENCY = 1.5


def _start_flood(store: Path, out: Path) -> subprocess.Popen[bytes]:
    """``pantheon run scenarios/flood.yaml`` in a child, as ``run --tui`` starts it."""
    args = [sys.executable, "-m", "pantheon.cli", "run", "scenarios/flood.yaml"]
    args += ["--store", str(store), "--json"]
    with out.open("wb") as sink:
        return subprocess.Popen(
            args, cwd=ROOT, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT
        )


async def test_keys_switch_panels_after_the_feed_hands_over_to_the_store(
    tmp_path: Path,
) -> None:
    store = tmp_path / "sessions.db"
    child = _start_flood(store, tmp_path / "out")
    try:
        found = await asyncio.to_thread(_child_session, child, store)
        assert found is not None, (tmp_path / "out").read_text()
        sid, feed, _info = found
        assert feed is not None, "the run should serve a live feed"
        source = LiveSource(await connect(feed), StoreSource(store, sid))
        app = MonitorApp(source)
        try:
            async with app.run_test(size=(120, 40)) as pilot:
                panels = app.query_one("#panels", TabbedContent)
                # The real sequence: the feed runs, the run ends, the feed closes, the
                # source switches to the store and its record reaches the panels.
                await until(pilot, lambda: app.snapshot is not None, "a live snapshot")
                assert app.sub_title.startswith("live feed")
                await until(
                    pilot,
                    lambda: app.snapshot is not None and not app.snapshot.live,
                    "the run to end",
                    deadline=120,
                )
                # From here on, a timer measures how long the event loop goes unanswered:
                # the loop thread's CPU time between two ticks (see KEY_LATENCY).
                ticks: list[tuple[float, float]] = []
                app.set_interval(0.05, lambda: ticks.append((time.monotonic(), time.thread_time())))
                await until(
                    pilot, lambda: app.sub_title.startswith("store"), "the store", deadline=120
                )
                await pilot.pause(1.0)  # the tables measure their new rows when idle
                busy, wall = max((b[1] - a[1], b[0] - a[0]) for a, b in pairwise(ticks))
                assert busy < KEY_LATENCY, (
                    f"the monitor stopped answering for {wall:.1f}s ({busy:.1f}s of its own work)"
                )
                snap = app.snapshot
                assert snap is not None and len(snap.traces) > MAX_ROWS
                for key, panel in (("4", "dlq"), ("5", "timeline"), ("2", "latency")):
                    start = time.thread_time()
                    await pilot.press(key)
                    await until(pilot, lambda p=panel: panels.active == p, f"panel {panel}")
                    assert time.thread_time() - start < KEY_LATENCY, f"key {key} was slow"
                    # The panel is the one on screen, not only the one selected.
                    await pilot.pause()
                    table = app.query_one(f"#{panel}", TabPane).query(DataTable).first()
                    assert table.region.height > 0
                for name in ("#dlq-table", "#trace-table"):
                    assert app.query_one(name, DataTable).row_count == MAX_ROWS
                await pilot.press("q")
            assert app.return_code == 0
        finally:
            await source.aclose()
    finally:
        if child.poll() is None:
            child.kill()
        child.wait()
