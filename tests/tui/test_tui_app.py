"""The monitor under Textual's Pilot, opened on a really recorded session.

Every number the panels show is checked against :mod:`pantheon.readmodel` over the same
store, and every key the footer offers is pressed.
"""

from __future__ import annotations

import html
import re
from collections import Counter
from pathlib import Path
from typing import Any

from invoice_team import recorded_run
from pilot_wait import until
from textual.widgets import DataTable, Static, TabbedContent

from dashboard.tui import DeadLetterScreen, MonitorApp, StoreSource, TimelineScreen
from dashboard.tui._app import MAX_ROWS
from dashboard.tui._format import count, ms, usage_cells, usage_line
from pantheon import readmodel
from pantheon.readmodel import usd
from pantheon.rerun import session_outcomes
from pantheon.runner import team_setup
from pantheon.sessions import ApprovalBook, SessionStore


def _text(widget: Static) -> str:
    return str(widget.render())


async def test_panels_show_the_sessions_numbers_in_80x24(flaky: tuple[Path, str]) -> None:
    path, sid = flaky
    source = StoreSource(path, sid)
    app = MonitorApp(source)
    with SessionStore(path) as store:
        hops = readmodel.hop_latency(store, sid)
        letters = readmodel.dead_letters(store, sid)
        published = store.envelope_counts()[sid]
        requests = readmodel.requests(store, sid)
        decided = session_outcomes(store, sid)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.snapshot is not None, "the first snapshot")
            totals = _text(app.query_one("#totals", Static))
            assert f"published {count(published)}" in totals
            assert f"DLQ {count(len(letters))}" in totals
            assert "completed" in totals
            # What the team decided, in its words, as `pantheon diff` reads the record.
            score = decided.score
            by = Counter(d["action"] for d in decided.decisions.values())
            top = ", ".join(f"{count(n)} {a}" for a, n in by.most_common(8))
            assert (
                f"decided {count(score.decided)} emails, {score.correct / score.scored:.1%} "
                f"right of {count(score.scored)} labelled: {top}"
            ) in totals

            latency = app.query_one("#latency-table", DataTable)
            assert latency.row_count == len(hops)
            for h in hops:
                row = latency.get_row(f"{h.kind}:{h.name}")
                assert [str(c) for c in row[1:]] == [
                    count(h.count),
                    ms(h.wait_p50_ms), ms(h.wait_p95_ms), ms(h.wait_p99_ms),
                    ms(h.handle_p50_ms), ms(h.handle_p95_ms), ms(h.handle_p99_ms),
                ]  # fmt: skip

            dlq = app.query_one("#dlq-table", DataTable)
            assert sorted(int(k.value or 0) for k in dlq.rows) == [d.entry_id for d in letters]
            traces = app.query_one("#trace-table", DataTable)
            # The newest requests, at most MAX_ROWS of them (the run has a few more), a
            # hundred per turn of the loop (test_tui_fill.py).
            shown = min(len(requests), MAX_ROWS)
            await until(pilot, lambda: traces.row_count == shown, f"{shown} requests")
            newest = max(requests, key=lambda r: r.start_ms)
            assert str(newest.correlation_id) in {k.value for k in traces.rows}

            breakers = app.query_one("#breaker-table", DataTable)
            assert "actor" in {k.value for k in breakers.rows}
            assert str(breakers.get_row("actor")[1]) == "closed"

            # Throughput: one sparkline row per topic and per agent, totals as recorded.
            series = {(s.kind, s.key): s for s in app.snapshot.series}  # type: ignore[union-attr]
            actor = next(h for h in hops if h.name == "actor")
            assert series[("agent", "actor")].total == actor.count
            assert sum(s.total for (kind, _), s in series.items() if kind == "topic") == published
    finally:
        await source.aclose()


async def test_keys_switch_open_redrive_and_show_a_timeline(
    flaky: tuple[Path, str], fixed_setup: Any
) -> None:
    path, sid = flaky
    source = StoreSource(path, sid, setup=fixed_setup)
    app = MonitorApp(source)
    with SessionStore(path) as store:
        letters = [d for d in readmodel.dead_letters(store, sid) if not d.redriven]
    assert letters, "the session needs a dead letter not yet redriven"
    newest = letters[-1]  # the DLQ table lists newest first
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.snapshot is not None, "the first snapshot")
            panels = app.query_one("#panels", TabbedContent)
            await pilot.press("2")
            assert panels.active == "latency"
            await pilot.press("3")
            assert panels.active == "breakers"
            await pilot.press("4")
            assert panels.active == "dlq"

            # Open the selected (newest) dead letter: its payload and traceback.
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, DeadLetterScreen), "DLQ detail")
            screen = app.screen
            assert isinstance(screen, DeadLetterScreen)
            assert screen.letter.entry_id == newest.entry_id
            shown = _text(screen.query_one("#dlq-traceback", Static))
            assert newest.traceback and newest.traceback.strip().splitlines()[-1] in shown
            assert newest.payload["email_id"] in _text(screen.query_one("#dlq-payload", Static))

            # t: the timeline of that dead letter's request, hop by hop.
            await pilot.press("t")
            await until(
                pilot,
                lambda: isinstance(app.screen, TimelineScreen) and app.screen.hops is not None,
                "the dead letter's waterfall",
            )
            timeline = app.screen
            assert isinstance(timeline, TimelineScreen)
            with SessionStore(path) as store:
                bars = readmodel.waterfall(store, sid, newest.correlation_id or 0)
            assert timeline.hops is not None and len(timeline.hops) == len(bars)
            drawn = _text(timeline.query_one("#waterfall", Static))
            assert all(b.agent[:16] in drawn for b in bars) and "█" in drawn
            await pilot.press("escape")
            assert isinstance(app.screen, DeadLetterScreen)

            # r: redrive it to the fixed team; the store marks it and the list says so.
            await pilot.press("r")

            def redriven() -> bool:
                with SessionStore(path) as store:
                    return any(
                        d.redriven and d.entry_id == newest.entry_id
                        for d in store.dead_letters(sid)
                    )

            await until(pilot, redriven, "the store to mark the entry redriven")
            await pilot.press("escape")
            dlq = app.query_one("#dlq-table", DataTable)
            await until(
                pilot,
                lambda: str(dlq.get_row(str(newest.entry_id))[4]) == "yes",
                "the DLQ list to show the entry redriven",
            )

            # 5 and enter: any request's waterfall from the timeline list.
            await pilot.press("5")
            assert panels.active == "timeline"
            table = app.query_one("#trace-table", DataTable)
            # The newest requests are Monitor alerts nobody handles; walk down to an email.
            while int(str(table.get_row_at(table.cursor_row)[2])) == 0:
                await pilot.press("down")
            first = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
            await pilot.press("enter")
            await until(
                pilot,
                lambda: isinstance(app.screen, TimelineScreen) and app.screen.hops is not None,
                "a request's waterfall",
            )
            assert isinstance(app.screen, TimelineScreen)
            assert app.screen.trace.correlation_id == int(first or 0)
            assert app.screen.hops
            await pilot.press("q")
        assert app.return_code == 0
    finally:
        await source.aclose()


async def test_redrive_without_a_team_says_how(flaky: tuple[Path, str]) -> None:
    path, sid = flaky
    source = StoreSource(path, sid)
    app = MonitorApp(source)
    try:
        async with app.run_test(size=(80, 24), notifications=True) as pilot:
            await until(pilot, lambda: app.snapshot is not None, "the first snapshot")
            await pilot.press("r")  # not on the DLQ panel
            await pilot.press("4")
            dlq = app.query_one("#dlq-table", DataTable)
            while str(dlq.get_row_at(dlq.cursor_row)[4]) == "yes":  # another test redrove it
                await pilot.press("down")
            await pilot.press("r")
            await until(
                pilot,
                lambda: any("--setup" in str(n.message) for n in app._notifications),
                "the refusal",
            )
            assert any("DLQ panel" in str(n.message) for n in app._notifications)
    finally:
        await source.aclose()


def _screen_lines(app: MonitorApp, width: int = 80) -> list[str]:
    """What the terminal shows, line by line, from the app's own SVG screenshot: each text
    run sits at its column (runs of blanks are not drawn as text, so place by ``x``)."""
    rows: dict[float, list[tuple[float, str, float]]] = {}
    for attrs, body in re.findall(r"<text([^>]*)>(.*?)</text>", app.export_screenshot(), re.S):
        x = re.search(r'\bx="([\d.]+)"', attrs)
        y = re.search(r'\by="([\d.]+)"', attrs)
        length = re.search(r'textLength="([\d.]+)"', attrs)
        if x is None or y is None or length is None:
            continue
        text = html.unescape(body).replace("\xa0", " ").rstrip("\n")
        rows.setdefault(float(y.group(1)), []).append(
            (float(x.group(1)), text, float(length.group(1)))
        )
    cell = min(n / len(t) for runs in rows.values() for _, t, n in runs if t)
    lines = []
    for y in sorted(rows):
        line = [" "] * width
        for x, text, _ in rows[y]:
            start = round(x / cell)
            for i, ch in enumerate(text):
                if 0 <= start + i < width:
                    line[start + i] = ch
        lines.append("".join(line).rstrip())
    return lines


async def test_usage_panel_shows_the_read_models_numbers_in_80x24(model_session: Any) -> None:
    """Key 6 on a session that asked a real model server: per agent and in total, what is
    on screen is the read model's usage (which is the run summary's)."""
    path, sid = model_session.store, model_session.session_id
    with SessionStore(path) as store:
        usage = readmodel.usage(store, sid)
    source = StoreSource(path, sid)
    app = MonitorApp(source)
    try:
        async with app.run_test(size=(80, 24)) as pilot:
            await until(pilot, lambda: app.snapshot is not None, "the first snapshot")
            await pilot.press("6")
            assert app.query_one("#panels", TabbedContent).active == "usage"
            table = app.query_one("#usage-table", DataTable)
            assert table.row_count == len(usage.by_agent) + 1
            for name, u in usage.by_agent.items():
                assert [str(c) for c in table.get_row(name)] == [name, *usage_cells(u)]
            assert [str(c) for c in table.get_row("<total>")] == [
                "total",
                *usage_cells(usage.total),
            ]
            await pilot.pause(0.1)
            screen = _screen_lines(app)
            assert len(screen) == 24
            t = usage.total
            headline = (
                f"{count(t.calls)} model calls  tokens {count(t.input_tokens)} in / "
                f"{count(t.output_tokens)} out  cost {usd(t.cost_usd)}"
            )
            assert headline == usage_line(usage, live=False).splitlines()[0]
            assert any(line.strip() == headline for line in screen), screen
            words = [line.split() for line in screen]
            for name, u in [*usage.by_agent.items(), ("total", t)]:
                assert [name, *usage_cells(u)] in words, (name, screen)
            # Every key the monitor has is in the footer, at 80 columns: the eight panel
            # keys as one entry (each tab says which panel its number shows).
            assert screen[-1].split() == [
                *("1", "2", "3", "4", "5", "6", "7", "8", "panels"),
                *("r", "Redrive", "a", "Approve", "x", "Reject", "q", "Quit"),
            ]
    finally:
        await source.aclose()


async def test_the_monitor_s_redrive_asks_for_approval_as_the_run_did(tmp_path: Path) -> None:
    """``r`` on a dead letter whose handling asks a person: the redrive's team gets the
    approval desk of its own session (the recorded scenario's scripted person decides), so
    the entry is delivered rather than failing for want of anyone to ask."""
    store, sid, letters = recorded_run(tmp_path)
    with SessionStore(store, create=False) as st:
        inputs = {e.id: e.payload for e in st.envelopes(sid)}
    asking = [d for d in letters if inputs[d.envelope_id]["amount"] > 1_000]
    assert asking, "an invoice the incident dead-lettered needs a person's approval"
    source = StoreSource(store, sid, setup=lambda text: team_setup(text, base_dir=tmp_path))
    try:
        said = await source.redrive(asking[0].entry_id)
    finally:
        await source.aclose()
    assert said.startswith(f"entry {asking[0].entry_id}: delivered (redrive session "), said
    with SessionStore(store, create=False) as st:
        (redrive,) = [s.id for s in st.sessions() if s.kind == "redrive"]
        book = ApprovalBook(st)
        asked = book.entries(book.origin(redrive))
        assert [(a.status, a.decided_by) for a in asked] == [("approved", "auto")]
        assert st.dead_letters(redrive) == []
