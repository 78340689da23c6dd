"""The monitor under its pilot on a session really recorded on ZeroMQ nodes: the node of each
dead letter and hop, and the processes' lines; a single-process session shows no node."""

from __future__ import annotations

from node_session import NodeSessions
from pilot_wait import until
from textual.widgets import DataTable, Static, TabbedContent

from dashboard.tui import DeadLetterScreen, MonitorApp, StoreSource, TimelineScreen
from pantheon import readmodel
from pantheon.sessions import SessionStore


def _columns(table: DataTable[object]) -> list[str]:
    return [str(c.label) for c in table.columns.values()]


async def test_the_monitor_shows_the_node_of_each_dead_letter_and_hop(
    node_sessions: NodeSessions,
) -> None:
    s = node_sessions
    with SessionStore(s.store, create=False) as store:
        letters = readmodel.dead_letters(store, s.three)
        nodes = readmodel.nodes(store, s.three)
    newest = letters[-1]
    with SessionStore(s.store, create=False) as store:
        bars = readmodel.waterfall(store, s.three, newest.correlation_id or 0)
    source = StoreSource(s.store, s.three)
    app = MonitorApp(source)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.snapshot is not None, "the first snapshot")
            await pilot.press("4")
            dlq = app.query_one("#dlq-table", DataTable)
            await until(pilot, lambda: dlq.row_count == len(letters), "the dead letters")
            assert _columns(dlq)[:3] == ["entry", "subscriber", "node"]
            assert [str(dlq.get_row(str(d.entry_id))[2]) for d in letters] == ["action"] * len(
                letters
            )

            # Its screen names the node; its request's waterfall has a node per hop.
            dlq.focus()
            await pilot.press("enter")
            await until(pilot, lambda: isinstance(app.screen, DeadLetterScreen), "its screen")
            summary = str(app.screen.query_one("#dlq-summary", Static).render())
            assert f"subscriber {newest.subscriber}  node action  " in summary
            await pilot.press("t")
            await until(
                pilot,
                lambda: isinstance(app.screen, TimelineScreen) and app.screen.hops is not None,
                "the dead letter's waterfall",
            )
            timeline = app.screen
            assert isinstance(timeline, TimelineScreen)
            assert [h.node for h in timeline.hops or ()] == [b.node for b in bars]
            drawn = str(timeline.query_one("#waterfall", Static).render()).splitlines()
            assert drawn[0].split()[:2] == ["agent", "node"]
            for b, line in zip(bars, drawn[1:], strict=True):
                assert line.split()[:2] == [b.agent[:16], b.node], line
            await pilot.press("escape", "escape")

            # 3: each breaker and each of its transitions names its process.
            with SessionStore(s.store, create=False) as store:
                changes = readmodel.breaker_timeline(store, s.three)
            assert {(e.name, e.node) for e in changes} == {("actor", "action")}
            await pilot.press("3")
            breakers = app.query_one("#breaker-table", DataTable)
            events = app.query_one("#breaker-events", DataTable)
            await until(pilot, lambda: events.row_count == len(changes), "the transitions")
            assert _columns(breakers)[:3] == ["breaker", "node", "state"]
            assert [str(c) for c in breakers.get_row("actor")[:2]] == ["actor", "action"]
            assert _columns(events)[:3] == ["t (s)", "breaker", "node"]
            assert {str(events.get_row_at(i)[2]) for i in range(events.row_count)} == {"action"}

            # 8: the processes, a line each, as `pantheon sessions show` prints them.
            await pilot.press("8")
            assert app.query_one("#panels", TabbedContent).active == "checks"
            lines = str(app.query_one("#nodes-lines", Static).render()).splitlines()
            assert lines == [n.text for n in nodes]
    finally:
        await source.aclose()


async def test_a_single_process_session_has_no_node_column(node_sessions: NodeSessions) -> None:
    source = StoreSource(node_sessions.store, node_sessions.alone)
    app = MonitorApp(source)
    try:
        async with app.run_test(size=(100, 30)) as pilot:
            await until(pilot, lambda: app.snapshot is not None, "the first snapshot")
            dlq = app.query_one("#dlq-table", DataTable)
            await until(pilot, lambda: dlq.row_count > 0, "the dead letters")
            assert _columns(dlq) == ["entry", "subscriber", "reason", "tries", "redriven", "error"]
            breakers = app.query_one("#breaker-table", DataTable)
            assert _columns(breakers) == ["breaker", "state", "trips", "next probe", "last reason"]
            assert str(app.query_one("#nodes-lines", Static).render()) == ""
    finally:
        await source.aclose()
