"""The monitor: a Textual app over one session's snapshots, live or recorded.

Snapshots reach the widgets as :class:`MonitorApp.SnapshotArrived` messages posted by one
worker that reads the :class:`~dashboard.tui.Source`; each panel redraws from the newest
snapshot only (a panel never queues work per snapshot). Keys: ``1``-``8`` switch panel,
``enter`` opens the selected dead letter or request, ``r`` redrives the selected dead
letter, ``t`` opens the timeline of a dead letter's request, ``a``/``x`` approve/reject the
selected approval request (panel 7) with a note, ``escape`` goes back, ``q`` quits. Laid
out for 80x24 and up.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Iterable, Sequence
from itertools import islice
from pathlib import Path
from typing import Any, ClassVar

from rich.text import Text
from textual import on, work
from textual.app import App, ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.css.query import NoMatches
from textual.message import Message
from textual.screen import Screen
from textual.widgets import (
    DataTable,
    Footer,
    Header,
    Label,
    Sparkline,
    Static,
    TabbedContent,
    TabPane,
)

from dashboard.tui._approvals import (
    APPROVALS_POLL,
    DecisionScreen,
    decide,
    read_approvals,
)
from dashboard.tui._approvals import rows as approval_rows
from dashboard.tui._format import (
    budget_line,
    count,
    ms,
    payload_text,
    rate,
    totals_line,
    usage_cells,
    usage_line,
    waterfall_text,
)
from dashboard.tui._sources import Source
from pantheon.live import DeadLetterView, HopBar, HopLatency, Series, Snapshot, Trace
from pantheon.sessions import Approval, SessionError

__all__ = ["DeadLetterScreen", "MonitorApp", "TimelineScreen"]

PANELS = (
    "throughput",
    "latency",
    "breakers",
    "dlq",
    "timeline",
    "usage",
    "approvals",
    "checks",
)
#: The footer's one entry for the panel keys 1-8 (see ``MonitorApp.BINDINGS``).
PANEL_KEYS = Binding.Group("panels")
#: The row key of the usage table's totals (no agent is named with angle brackets).
TOTAL_ROW = "<total>"
#: Rows at most in the dead letter, request and breaker transition tables: the newest ones
#: (the totals line counts them all). A table is rebuilt on the event loop, and a DataTable
#: measures every cell of every new row on the next idle: the record of a flood run (20,000
#: requests, as many dead letters) took the monitor away from its keys for seconds.
MAX_ROWS = 500


#: Rows a table takes in one turn of the event loop. Adding a row and measuring its cells
#: (the table does that on its next idle) cost 0.3-0.6 ms here: the store's record of a
#: flood run filled two 500-row tables in one go and held the loop for 0.5-0.6 s (1.6 s
#: under the test suite's load). A hundred rows hold it for 30-60 ms; the rest follow in
#: the next turns, the newest first, while keys and timers get their turns between.
FILL_STEP = 100


def _fill(
    table: DataTable[Any], rows: Iterable[tuple[str, Sequence[Any]]], cursor: str | None = None
) -> None:
    """Replace a table's rows, keeping the cursor on the same row key when it is still
    there (or putting it on ``cursor``'s row). Skips the redraw when nothing changed (most
    ticks, for most tables). Takes the first :data:`MAX_ROWS` rows only, :data:`FILL_STEP`
    rows per turn of the loop; a newer fill of the same table drops what an older one had
    still to add."""
    rows = list(islice(rows, MAX_ROWS))
    signature = [(key, tuple(str(c) for c in cells)) for key, cells in rows]
    if getattr(table, "_signature", None) == signature:
        return
    table._signature = signature  # type: ignore[attr-defined]
    selected = cursor
    if selected is None and table.row_count and table.cursor_row >= 0:
        selected = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
    table.clear()
    _add_rows(table, rows, 0, selected, signature)


def _add_rows(
    table: DataTable[Any],
    rows: list[tuple[str, Sequence[Any]]],
    start: int,
    selected: str | None,
    signature: list[tuple[str, tuple[str, ...]]],
) -> None:
    """One step of :func:`_fill`: rows ``start`` to ``start + FILL_STEP``, then the next
    step on the loop's next turn, unless the table was refilled or taken down since."""
    if getattr(table, "_signature", None) is not signature or not table.is_attached:
        return
    step = rows[start : start + FILL_STEP]
    for key, cells in step:
        table.add_row(*cells, key=key)
    if selected is not None and any(key == selected for key, _cells in step):
        table.move_cursor(row=table.get_row_index(selected), animate=False)
    if start + FILL_STEP < len(rows):
        asyncio.get_running_loop().call_soon(
            _add_rows, table, rows, start + FILL_STEP, selected, signature
        )


class SeriesRow(Horizontal):
    """One topic's or agent's throughput: its name, total and latest rate, a sparkline."""

    def __init__(self, series: Series, live: bool) -> None:
        super().__init__(classes="series")
        self._series = series
        self._live = live

    def compose(self) -> ComposeResult:
        yield Label(self._caption(self._series, self._live), classes="series-label")
        yield Sparkline(self._series.counts, summary_function=max)

    @staticmethod
    def _caption(s: Series, live: bool) -> str:
        """Name, total, and the rate now (live) or at the peak (finished)."""
        rates = s.rates
        shown = (rates[-1] if live else max(rates)) if rates else 0.0
        return f"{_clip(s.key, 21):<21} {count(s.total):>7} {rate(shown):>7}"

    def show(self, series: Series, live: bool) -> None:
        self._series = series
        self._live = live
        self.query_one(Label).update(self._caption(series, live))
        self.query_one(Sparkline).data = series.counts


class ThroughputPanel(VerticalScroll):
    """Sparklines per topic (published) and per agent (handled), one bucket per column."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._keys: tuple[tuple[str, str], ...] = ()
        self._live: bool | None = None

    def show(self, snap: Snapshot) -> None:
        ordered = [s for k in ("topic", "agent") for s in snap.series if s.kind == k]
        keys = tuple((s.kind, s.key) for s in ordered)
        if keys == self._keys and snap.live == self._live:
            for row, series in zip(self.query(SeriesRow), ordered, strict=False):
                row.show(series, snap.live)
            return
        self._keys = keys
        self._live = snap.live
        self.remove_children()
        widgets: list[Any] = []
        now = "now" if snap.live else "peak"
        for kind, title in (("topic", "topics: published"), ("agent", "agents: handled")):
            widgets.append(Label(f"{title:<21} {'total':>7} {now:>7}", classes="heading"))
            widgets.extend(SeriesRow(s, snap.live) for s in ordered if s.kind == kind)
        if not snap.series:
            widgets.append(Label("no messages yet", classes="heading"))
        self.mount_all(widgets)


class MonitorApp(App[None]):
    """One session's throughput, latency, breakers, dead letters, request timelines,
    model usage, approvals and, once it has ended, its checks."""

    CSS_PATH = "monitor.tcss"
    TITLE = "pantheon monitor"
    BINDINGS: ClassVar[list[BindingType]] = [
        # One footer entry for the eight panel keys ("1-8 panels"): named one by one they
        # do not fit 80 columns beside the other keys, and each tab says its number.
        Binding("1", "panel('throughput')", "Throughput", group=PANEL_KEYS),
        Binding("2", "panel('latency')", "Latency", group=PANEL_KEYS),
        Binding("3", "panel('breakers')", "Breakers", group=PANEL_KEYS),
        Binding("4", "panel('dlq')", "DLQ", group=PANEL_KEYS),
        Binding("5", "panel('timeline')", "Timeline", group=PANEL_KEYS),
        Binding("6", "panel('usage')", "Usage", group=PANEL_KEYS),
        Binding("7", "panel('approvals')", "Approvals", group=PANEL_KEYS),
        Binding("8", "panel('checks')", "Checks", group=PANEL_KEYS),
        Binding("r", "redrive", "Redrive"),
        Binding("a", "decide(True)", "Approve"),
        Binding("x", "decide(False)", "Reject"),
        Binding("q", "quit", "Quit"),
    ]

    class SnapshotArrived(Message):
        """A new snapshot of the session."""

        def __init__(self, snapshot: Snapshot) -> None:
            super().__init__()
            self.snapshot = snapshot

    class ApprovalsArrived(Message):
        """The session's approval requests, as the store has them now."""

        def __init__(self, approvals: list[Approval]) -> None:
            super().__init__()
            self.approvals = approvals

    def __init__(self, source: Source) -> None:
        super().__init__()
        self.source = source
        self.snapshot: Snapshot | None = None
        self._approvals: dict[str, Approval] = {}
        self._dead: dict[str, DeadLetterView] = {}
        self._traces: dict[str, Trace] = {}
        self._node_cols = False

    def compose(self) -> ComposeResult:
        yield Header()
        yield Static("waiting for the first snapshot...", id="totals")
        with TabbedContent(id="panels"):
            with TabPane("1 Throughput", id="throughput"):
                yield ThroughputPanel(id="throughput-panel")
            with TabPane("2 Latency", id="latency"):
                yield DataTable(id="latency-table", cursor_type="row", zebra_stripes=True)
            with TabPane("3 Breakers", id="breakers"), Vertical():
                yield DataTable(id="breaker-table", cursor_type="row")
                yield Label("transitions", classes="heading")
                yield DataTable(id="breaker-events", cursor_type="row")
            with TabPane("4 DLQ", id="dlq"):
                yield DataTable(id="dlq-table", cursor_type="row", zebra_stripes=True)
            with TabPane("5 Timeline", id="timeline"):
                yield DataTable(id="trace-table", cursor_type="row", zebra_stripes=True)
            with TabPane("6 Usage", id="usage"), Vertical():
                yield Static("no model calls yet", id="usage-totals")
                yield Static("", id="usage-budget")
                yield DataTable(id="usage-table", cursor_type="row", zebra_stripes=True)
            with TabPane("7 Approvals", id="approvals"), Vertical():
                yield Static("no approval requests", id="approvals-line")
                yield DataTable(id="approval-table", cursor_type="row", zebra_stripes=True)
            with TabPane("8 Checks", id="checks"), Vertical():
                yield Static("the run's expectations, once it ends", id="checks-line")
                yield DataTable(id="check-table", cursor_type="row", zebra_stripes=True)
                # Why each timing check did not pass, wrapped: too long for a table cell.
                yield Static("", id="checks-why")
                # A multi-process session's processes: how each ended, where its journal ends.
                yield Static("", id="nodes-lines")
        # Every key of the monitor in 80 columns (the palette is still on ctrl+p).
        yield Footer(compact=True, show_command_palette=False)

    def on_mount(self) -> None:
        self.query_one("#latency-table", DataTable).add_columns(
            "agent / edge", "n", "wait p50", "p95", "p99", "handle p50", "p95", "p99"
        )
        self._node_columns(nodes=False)
        self.query_one("#trace-table", DataTable).add_columns(
            "request", "label", "hops", "start ms", "total ms", "outcome"
        )
        usage = self.query_one("#usage-table", DataTable)
        usage.add_column("agent", width=22)
        for title in ("calls", "tokens in", "tokens out", "cost (USD)"):
            usage.add_column(title)
        self.query_one("#approval-table", DataTable).add_columns(
            "#", "state", "agent", "note", "request"
        )
        self.query_one("#check-table", DataTable).add_columns(
            "state", "expectation", "expected", "actual"
        )
        self.sub_title = self.source.origin
        self._follow()
        self._watch_approvals()
        # What exists now (the imports, the app, its widgets: 63,000 objects) lives as long
        # as the monitor, and each full collection walked it again: 53 ms per collection
        # here, at one every 0.3 s while a flood run's record fills the tables. Frozen, the
        # collections walk what came since only: full collections 0.07-0.20 s -> 0.03-0.15 s.
        # Collected first so that no garbage of before is frozen with it.
        gc.collect()
        gc.freeze()

    def on_unmount(self) -> None:
        gc.unfreeze()  # a process that goes on past the monitor (a test run) gets it back

    def _node_columns(self, *, nodes: bool) -> None:
        """The breaker and dead letter tables' columns: with the node each breaker is in,
        each transition happened in and each entry was dead-lettered on when the session
        ran on several processes (else as a single-process one's)."""
        node = ("node",) if nodes else ()
        for table_id, columns in (
            ("#breaker-table", ("breaker", *node, "state", "trips", "next probe", "last reason")),
            ("#breaker-events", ("t (s)", "breaker", *node, "from", "to", "reason")),
            ("#dlq-table", ("entry", "subscriber", *node, "reason", "tries", "redriven", "error")),
        ):
            table = self.query_one(table_id, DataTable)
            table.clear(columns=True)
            table._signature = None  # type: ignore[attr-defined]
            table.add_columns(*columns)
        self._node_cols = nodes

    @work(exclusive=True, group="source")
    async def _follow(self) -> None:
        async for snap in self.source.snapshots():
            self.post_message(self.SnapshotArrived(snap))

    @work(exclusive=True, group="approvals")
    async def _watch_approvals(self) -> None:
        """Read the session's approvals from the store while the monitor runs (a source
        without a store has none to show)."""
        path = getattr(self.source, "store_path", None)
        if path is None:
            return
        while True:
            sid = getattr(self.source, "session_id", None)
            if sid is None and self.snapshot is not None:
                sid = self.snapshot.session_id
            if sid is not None:
                try:
                    found = await asyncio.to_thread(read_approvals, Path(path), sid)
                except SessionError as exc:
                    self.notify(f"approvals: {exc}", severity="error", timeout=8)
                    return
                self.post_message(self.ApprovalsArrived(found))
            await asyncio.sleep(APPROVALS_POLL)

    @on(ApprovalsArrived)
    def _show_approvals(self, message: ApprovalsArrived) -> None:
        panels = self._panels()
        if panels is None:
            return  # the last poll of a monitor that is closing: nothing left to draw on
        try:
            status = panels.query_one("#approvals-line", Static)
            table = panels.query_one("#approval-table", DataTable)
        except NoMatches:
            # The panels are mounting (a poll that came back before the first frame) or
            # being taken down: the next poll draws it.
            return
        selected = self.selected_approval()
        was_waiting = [key for key, a in self._approvals.items() if a.pending]
        self._approvals = {str(a.id): a for a in message.approvals}
        waiting = sum(a.pending for a in message.approvals)
        line = (
            f"{waiting} waiting for a decision: a approves, x rejects the selected one"
            if waiting
            else f"{len(message.approvals)} requests, none waiting"
        )
        status.update(line)
        # The selected request was just decided (here or by someone else) and moved down
        # among the decided ones: the cursor goes to the request that waited after it (or
        # the last one still waiting), the one a person deciding them in turn is on next.
        # Otherwise it stays on the request it was on, wherever the list put it (_fill).
        now = self._approvals.get(str(selected.id)) if selected is not None else None
        target = None
        if selected is not None and selected.pending and now is not None and not now.pending:
            still = [key for key, a in self._approvals.items() if a.pending]
            after = was_waiting[was_waiting.index(str(selected.id)) + 1 :]
            target = next((key for key in after if key in still), still[-1] if still else None)
        _fill(table, approval_rows(message.approvals), cursor=target)

    # -- drawing -------------------------------------------------------------------------------

    def _panels(self) -> Screen[Any] | None:
        """The screen the panels are on, under any dialog a person opened on top of it (a
        dead letter, a timeline): updates keep arriving meanwhile. None once the monitor
        is closing and its screens are gone."""
        if not self.screen_stack:
            return None
        screen = self.screen_stack[0]
        try:
            screen.query_one("#panels", TabbedContent)
        except NoMatches:
            return None
        return screen

    @on(SnapshotArrived)
    def _show(self, message: SnapshotArrived) -> None:
        snap = self.snapshot = message.snapshot
        panels = self._panels()
        if panels is None:
            return
        try:
            self._draw(panels, snap)
        except NoMatches:
            # The panels are mounting (a snapshot that came before the first frame) or being
            # taken down: the next snapshot draws them; this one is kept in ``snapshot``.
            return

    def _draw(self, panels: Screen[Any], snap: Snapshot) -> None:
        self.title = f"{snap.scenario or '?'} {snap.session_id}"
        self.sub_title = self.source.origin
        panels.query_one("#totals", Static).update(totals_line(snap))
        panels.query_one(ThroughputPanel).show(snap)
        _fill(
            panels.query_one("#latency-table", DataTable),
            ((f"{h.kind}:{h.name}", _latency_cells(h)) for h in snap.hops),
        )
        nodes = bool(snap.nodes) or any(d.node for d in snap.dead_letters)
        if nodes != self._node_cols:
            self._node_columns(nodes=nodes)
        _fill(
            panels.query_one("#breaker-table", DataTable),
            (
                (
                    b.name,
                    (
                        b.name,
                        *((b.node or "",) if nodes else ()),
                        Text(b.state, style=_STATE_STYLE.get(b.state, "")),
                        str(b.trips),
                        "-" if b.next_probe_s is None else f"in {b.next_probe_s:.2f}s",
                        b.reason or "",
                    ),
                )
                for b in snap.breakers
            ),
        )
        _fill(
            panels.query_one("#breaker-events", DataTable),
            (
                (
                    str(i),
                    (
                        f"{e.t_s:.3f}",
                        e.name,
                        *((e.node or "",) if nodes else ()),
                        e.old,
                        e.new,
                        e.reason or "",
                    ),
                )
                for i, e in enumerate(reversed(snap.breaker_events))
            ),
        )
        self._dead = {str(d.entry_id): d for d in snap.dead_letters}
        _fill(
            panels.query_one("#dlq-table", DataTable),
            (
                (
                    str(d.entry_id),
                    (
                        str(d.entry_id),
                        d.subscriber,
                        *((d.node or "",) if nodes else ()),
                        d.reason,
                        str(d.attempts),
                        "yes" if d.redriven else "",
                        _clip((d.error_type or "") + (f": {d.error}" if d.error else ""), 60),
                    ),
                )
                for d in reversed(snap.dead_letters)
            ),
        )
        self._traces = {str(t.correlation_id): t for t in snap.traces}
        _fill(
            panels.query_one("#trace-table", DataTable),
            (
                (
                    str(t.correlation_id),
                    (
                        _short_id(t.correlation_id),
                        t.label or t.topic,
                        str(t.hop_count),
                        ms(t.start_ms),
                        ms(t.total_ms),
                        Text(t.outcome, style=_OUTCOME_STYLE.get(t.outcome, "")),
                    ),
                )
                for t in reversed(snap.traces)
            ),
        )
        usage = snap.usage
        panels.query_one("#usage-totals", Static).update(usage_line(usage, snap.live))
        panels.query_one("#usage-budget", Static).update(budget_line(snap.budget))
        rows: list[tuple[str, Sequence[Any]]] = [
            (name, (_clip(name, 22), *_right(usage_cells(u))))
            for name, u in sorted(usage.by_agent.items())
        ]
        if usage.by_agent:
            total = (Text("total", style="bold"), *_right(usage_cells(usage.total), "bold"))
            rows.append((TOTAL_ROW, total))
        _fill(panels.query_one("#usage-table", DataTable), rows)
        states = [c.state for c in snap.checks]
        counts = ", ".join(f"{states.count(s)} {s}" for s in _CHECK_STYLE if s in states)
        if snap.unjudged is not None:
            # Stopped early: no verdict, and what was judged is of the part that ran.
            part = f"; on the part that ran: {counts}" if counts else ""
            panels.query_one("#checks-line", Static).update(
                Text(f"not judged, {snap.unjudged}{part}")
            )
        elif snap.checks:
            panels.query_one("#checks-line", Static).update(counts)
        if snap.checks:
            why = Text()
            for c in snap.checks:
                if c.why and c.state != "passed":
                    why.append(f"{c.state.upper()} ", style=_CHECK_STYLE.get(c.state, ""))
                    why.append(f"{c.name}: {c.why}\n")
            panels.query_one("#checks-why", Static).update(why)
        panels.query_one("#nodes-lines", Static).update("\n".join(snap.nodes))
        _fill(
            panels.query_one("#check-table", DataTable),
            (
                (
                    str(i),
                    (
                        Text(c.state.upper(), style=_CHECK_STYLE.get(c.state, "")),
                        c.name,
                        _clip(c.expected, 20),
                        _clip(c.actual, 20),
                    ),
                )
                for i, c in enumerate(snap.checks)
            ),
        )

    # -- actions -------------------------------------------------------------------------------

    def action_panel(self, panel: str) -> None:
        while len(self.screen_stack) > 1:
            self.pop_screen()
        self.query_one("#panels", TabbedContent).active = panel
        pane = self.query_one(f"#{panel}", TabPane)
        tables = pane.query(DataTable)
        if tables:
            tables.first().focus()

    def selected_dead_letter(self) -> DeadLetterView | None:
        table = self.query_one("#dlq-table", DataTable)
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return self._dead.get(key or "")

    def action_redrive(self) -> None:
        if self.query_one("#panels", TabbedContent).active != "dlq":
            self.notify("select a dead letter on the DLQ panel (4) to redrive it")
            return
        letter = self.selected_dead_letter()
        if letter is None:
            self.notify("no dead letter selected")
            return
        self.redrive(letter)

    @work(group="redrive")
    async def redrive(self, letter: DeadLetterView) -> None:
        """Redrive ``letter`` through the source; the outcome is a notification."""
        if letter.redriven:
            self.notify(f"entry {letter.entry_id} was already redriven", severity="warning")
            return
        self.notify(f"redriving entry {letter.entry_id}...")
        try:
            said = await self.source.redrive(letter.entry_id)
        except Exception as exc:
            self.notify(f"redrive refused: {exc}", severity="error", timeout=8)
            return
        self.notify(said, timeout=6)

    def selected_approval(self) -> Approval | None:
        panels = self._panels()
        if panels is None:
            return None
        try:
            table = panels.query_one("#approval-table", DataTable)
        except NoMatches:  # mounting, or being taken down
            return None
        if not table.row_count:
            return None
        key = table.coordinate_to_cell_key(table.cursor_coordinate).row_key.value
        return self._approvals.get(key or "")

    def action_decide(self, approved: bool) -> None:
        """Approve or reject the selected request, after asking for a note."""
        if self.query_one("#panels", TabbedContent).active != "approvals":
            self.notify("select a request on the Approvals panel (7) to decide it")
            return
        approval = self.selected_approval()
        if approval is None:
            self.notify("no approval request selected")
            return
        if not approval.pending:
            self.notify(
                f"#{approval.id} was already {approval.status} by {approval.decided_by}",
                severity="warning",
            )
            return

        def decided(answer: tuple[bool, str] | None) -> None:
            if answer is not None:
                self.decide(approval, answer[0], answer[1])

        self.push_screen(DecisionScreen(approval, approved), decided)

    @work(group="decide")
    async def decide(self, approval: Approval, approved: bool, note: str) -> None:
        """Write the decision into the store; the outcome is a notification."""
        path = getattr(self.source, "store_path", None)
        if path is None:
            self.notify("this monitor has no session store to decide in", severity="error")
            return
        try:
            done = await asyncio.to_thread(
                decide, Path(path), approval, approved=approved, note=note
            )
        except SessionError as exc:
            self.notify(str(exc), severity="error", timeout=8)
            return
        self.notify(f"#{done.id} {done.status}" + (f": {done.note}" if done.note else ""))
        self._watch_approvals()

    @on(DataTable.RowSelected, "#dlq-table")
    def _open_dead_letter(self, event: DataTable.RowSelected) -> None:
        letter = self._dead.get(event.row_key.value or "")
        if letter is not None:
            self.push_screen(DeadLetterScreen(letter))

    @on(DataTable.RowSelected, "#trace-table")
    def _open_trace(self, event: DataTable.RowSelected) -> None:
        trace = self._traces.get(event.row_key.value or "")
        if trace is not None:
            self.open_timeline(trace)

    def open_timeline(self, trace: Trace) -> None:
        self.push_screen(TimelineScreen(trace))
        self._load_waterfall(trace)

    def trace_of(self, letter: DeadLetterView) -> Trace | None:
        """The request a dead letter belongs to, as the snapshot knows it."""
        if letter.correlation_id is None:
            return None
        found = self._traces.get(str(letter.correlation_id))
        if found is not None:
            return found
        return Trace(letter.correlation_id, letter.topic, "", 0.0, 0.0, 0, "dead_letter")

    @work(group="waterfall", exclusive=True)
    async def _load_waterfall(self, trace: Trace) -> None:
        hops = await self.source.waterfall(trace)
        screen = self.screen
        if isinstance(screen, TimelineScreen) and screen.trace == trace:
            screen.show(hops)


def _clip(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _right(cells: Iterable[str], style: str = "") -> list[Text]:
    """Numbers, right-aligned so their digits line up."""
    return [Text(c, style=style, justify="right") for c in cells]


def _latency_cells(h: HopLatency) -> tuple[Any, ...]:
    name = _clip(h.name, 22)
    return (
        name if h.kind == "agent" else Text(name, style="italic"),
        count(h.count),
        ms(h.wait_p50_ms), ms(h.wait_p95_ms), ms(h.wait_p99_ms),
        ms(h.handle_p50_ms), ms(h.handle_p95_ms), ms(h.handle_p99_ms),
    )  # fmt: skip


_STATE_STYLE = {"closed": "green", "open": "bold red", "half_open": "yellow"}
#: A check the machine may have failed is neither green nor red.
_CHECK_STYLE = {"failed": "bold red", "inconclusive": "bold yellow", "passed": "green"}
_OUTCOME_STYLE = {"ok": "green", "dead_letter": "bold red", "failed": "red", "pending": "yellow"}


def _short_id(i: int) -> str:
    """Correlation ids are 64-bit; the low digits tell requests of one run apart."""
    return f"…{i % 10**8:08d}"


class DeadLetterScreen(Screen[None]):
    """One dead letter: why, its payload, its traceback, and the key to redrive it."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("r", "redrive", "Redrive"),
        Binding("t", "timeline", "Timeline"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, letter: DeadLetterView) -> None:
        super().__init__()
        self.letter = letter

    def compose(self) -> ComposeResult:
        d = self.letter
        yield Header()
        yield Static(
            f"dead letter {d.entry_id}  ({'redriven' if d.redriven else 'r to redrive'})\n"
            f"subscriber {d.subscriber}{f'  node {d.node}' if d.node else ''}  "
            f"topic {d.topic}  reason {d.reason}  "
            f"attempts {d.attempts}  at t={d.t_s:.3f}s\n"
            f"error: {d.error_type or '-'}: {d.error or ''}",
            id="dlq-summary",
        )
        with VerticalScroll(id="dlq-detail"):
            yield Label("payload", classes="heading")
            yield Static(Text(payload_text(d.payload)), id="dlq-payload")
            yield Label("traceback", classes="heading")
            yield Static(
                Text(d.traceback or "(no traceback: not a handler failure)"), id="dlq-traceback"
            )
        yield Footer()

    def action_redrive(self) -> None:
        app = self.app
        assert isinstance(app, MonitorApp)
        app.redrive(self.letter)

    def action_timeline(self) -> None:
        app = self.app
        assert isinstance(app, MonitorApp)
        trace = app.trace_of(self.letter)
        if trace is None:
            self.notify("this dead letter's request is not recorded", severity="warning")
            return
        app.open_timeline(trace)


class TimelineScreen(Screen[None]):
    """One request as a waterfall of its hops across agents."""

    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape", "app.pop_screen", "Back"),
        Binding("q", "app.quit", "Quit"),
    ]

    def __init__(self, trace: Trace) -> None:
        super().__init__()
        self.trace = trace
        self.hops: tuple[HopBar, ...] | None = None

    def compose(self) -> ComposeResult:
        t = self.trace
        yield Header()
        yield Static(
            f"request {t.correlation_id}  {t.label or t.topic}\n"
            f"outcome {t.outcome}  hops {t.hop_count}  total {ms(t.total_ms)} ms  "
            "(░ queue wait, █ handling)",
            id="trace-summary",
        )
        with VerticalScroll(id="waterfall-scroll"):
            yield Static("loading...", id="waterfall")
        yield Footer()

    def show(self, hops: tuple[HopBar, ...]) -> None:
        self.hops = hops
        self._draw()

    def on_resize(self) -> None:
        if self.hops is not None:
            self._draw()

    def _draw(self) -> None:
        width = max(40, self.size.width - 2)
        self.query_one("#waterfall", Static).update(waterfall_text(self.hops or (), width))
