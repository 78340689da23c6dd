"""A table of the monitor fills a hundred rows per turn of the event loop: the store's record
of a flood run (two 500-row tables at once) held the loop for 0.5 s, and keys waited."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

from pilot_wait import until
from textual.app import App, ComposeResult
from textual.widgets import DataTable

from dashboard.tui import MonitorApp, StoreSource
from dashboard.tui._app import FILL_STEP, MAX_ROWS, _fill


class _Table(App[None]):
    def compose(self) -> ComposeResult:
        yield DataTable(id="t", cursor_type="row")

    def on_mount(self) -> None:
        self.query_one(DataTable).add_columns("key", "value")


def _rows(prefix: str, n: int) -> list[tuple[str, tuple[str, str]]]:
    return [(f"{prefix}{i}", (f"{prefix}{i}", str(i))) for i in range(n)]


def _keys(table: DataTable[Any]) -> list[str | None]:
    return [table.coordinate_to_cell_key((i, 0)).row_key.value for i in range(table.row_count)]


async def test_a_big_fill_gives_the_loop_back_after_each_step() -> None:
    app = _Table()
    async with app.run_test() as pilot:
        table = app.query_one(DataTable)
        _fill(table, _rows("a", MAX_ROWS + 50))
        # What the call itself added: one step; the rest comes in later turns.
        assert table.row_count == FILL_STEP
        await until(pilot, lambda: table.row_count == MAX_ROWS, "the whole table")
        assert _keys(table) == [key for key, _ in _rows("a", MAX_ROWS)]


async def test_a_newer_fill_drops_what_an_older_one_had_left_to_add() -> None:
    app = _Table()
    async with app.run_test() as pilot:
        table = app.query_one(DataTable)
        _fill(table, _rows("old", 400))
        _fill(table, _rows("new", 250))
        await pilot.pause(0.3)
        assert _keys(table) == [key for key, _ in _rows("new", 250)]


async def test_the_cursor_finds_its_row_in_a_later_step() -> None:
    app = _Table()
    async with app.run_test() as pilot:
        table = app.query_one(DataTable)
        _fill(table, _rows("a", 400))
        await until(pilot, lambda: table.row_count == 400, "the first fill")
        table.move_cursor(row=350, animate=False)
        # The same rows under a new first one: the selected row moved to 351, in step four.
        _fill(table, [("b", ("b", "new")), *_rows("a", 400)])
        await until(pilot, lambda: table.row_count == 401, "the second fill")
        assert table.cursor_row == 351
        assert _keys(table)[table.cursor_row] == "a350"


async def test_the_monitor_keeps_its_own_startup_out_of_every_full_collection(
    flaky: tuple[Path, str],
) -> None:
    """What the monitor started with is frozen while it runs (a full collection walked those
    63,000 objects each time: 53 ms here) and handed back when it closes."""
    path, sid = flaky
    source = StoreSource(path, sid)
    app = MonitorApp(source)
    try:
        async with app.run_test() as pilot:
            await until(pilot, lambda: app.snapshot is not None, "the first snapshot")
            assert gc.get_freeze_count() > 10_000
        assert gc.get_freeze_count() == 0
    finally:
        await source.aclose()
