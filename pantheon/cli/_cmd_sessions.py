"""``pantheon sessions | dlq | export | diff | replay``: the session store from the shell.

Exit codes: 0 success (for ``replay`` and ``diff``: the runs match), 1 the runs diverge,
2 a usage or store error (no such session, ambiguous prefix, unknown schema version...).
Session arguments accept an id, any unique prefix of one, or ``latest`` (also ``-1``; ``-2``
is the session before it: SessionStore.resolve). ``--store`` (or ``$PANTHEON_STORE``)
names the store file; the default is ``.pantheon/sessions.db`` under the current directory.
"""

from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import json
import math
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from pantheon import readmodel
from pantheon.cli._common import (
    JsonOpt,
    SessionArg,
    SetupOpt,
    StoreOpt,
    approvals_notice,
    fail,
    load_setup,
)
from pantheon.cli._common import console as err_console
from pantheon.cli._console import report_console
from pantheon.cli._summary_text import STATE_MARKS, cut_lines, others_line, usage_lines
from pantheon.rerun import counts_line, replay_session, unrecorded_nodes
from pantheon.runner import AgentSetupError, expectation_state
from pantheon.sessions import (
    DEFAULT_REPLAY_TIMEOUT,
    RedriveReport,
    SessionError,
    SessionInfo,
    SessionStore,
    diff_sessions,
    export_jsonl,
    redrive,
    resolve_store_path,
)

__all__ = ["register", "summary_lines"]


def _console() -> Console:
    return report_console(highlight=False)


def _telemetry() -> Any:
    """Logging, and the OTel exporters the ``OTEL_*`` variables ask for (none by default)."""
    from pantheon.telemetry import Telemetry, configure_logging

    try:
        configure_logging()
        return Telemetry.from_env()
    except (ValueError, ImportError) as exc:
        raise fail(f"observability: {exc}") from None


@contextmanager
def _open(path: Path | None, *, write: bool = False) -> Iterator[SessionStore]:
    """The store, opened to read (read-only when it cannot be written: an archived or
    mounted store lists, shows, exports and diffs as any other) or, with ``write``, for a
    command that records in it (a store that cannot be written is refused, saying so)."""
    resolved = resolve_store_path(path)
    try:
        store = SessionStore(resolved, create=False, access="write" if write else "read")
    except SessionError as exc:
        raise fail(str(exc)) from None
    try:
        yield store
    except SessionError as exc:
        raise fail(str(exc)) from None
    finally:
        store.close()


def _when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


# A frame line of a Python traceback.
_FRAME = re.compile(r'\s*File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<function>.+)')


def _raised_at(traceback: str) -> str:
    """The traceback's innermost frame, ``file.py:line in function``: what the error line
    beside it does not say (the traceback's last line is that error again)."""
    frames = [m for m in map(_FRAME.match, traceback.splitlines()) if m is not None]
    if not frames:
        return traceback.strip().splitlines()[-1] if traceback.strip() else "(no frame)"
    last = frames[-1]
    return f"{Path(last['file']).name}:{last['line']} in {last['function']}"


def _excerpt(payload: Any, width: int) -> str:
    """The payload as one line of JSON (a string's newlines escaped), cut to ``width``."""
    text = json.dumps(payload, default=repr, ensure_ascii=False)
    return text if len(text) <= width else text[: width - 1] + "…"


def _dump(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=repr, sort_keys=False))


def summary_lines(summary: dict[str, Any], *, unjudged: str | None = None) -> list[str]:
    """The recorded run summary for ``sessions show``, whole and as markup-safe lines:
    the failed expectations first, then the inconclusive ones, one each with what was
    expected, what was measured and why,
    then every other field on its own line (a table such as ``hops``, one row per line).
    ``unjudged`` (:func:`pantheon.readmodel.unjudged`): the run stopped early, so its
    expectations are not judged, and the checks its summary holds are said to be of the
    part that ran."""
    expectations = [e for e in summary.get("expectations") or () if isinstance(e, dict)]
    states = [expectation_state(e) for e in expectations]
    failed = states.count("failed")
    unsure = states.count("inconclusive")
    counts = f"{states.count('passed')} passed, {failed} failed" + (
        f", {unsure} inconclusive" if unsure else ""
    )
    if unjudged is None:
        lines = [f"summary   expectations: {counts}"]
    else:
        part = f"; on the part that ran: {counts}" if expectations else ""
        lines = [f"summary   expectations: not judged, {escape(unjudged)}{part}"]
    for state in ("failed", "inconclusive"):
        for e, its in zip(expectations, states, strict=True):
            if its != state:
                continue
            lines.append(
                f"  {STATE_MARKS[state]} {escape(str(e.get('name')))}: expected "
                f"{escape(_value(e.get('expected')))}, actual {escape(_value(e.get('actual')))}"
            )
            if e.get("why"):
                lines.append(f"    {escape(str(e['why']))}")
    for key, value in summary.items():
        if key == "expectations":
            continue
        if isinstance(value, dict) and value and all(isinstance(v, dict) for v in value.values()):
            lines.append(f"  {escape(key)}:")
            lines.extend(f"    {escape(str(k))}: {escape(_value(v))}" for k, v in value.items())
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            lines.append(f"  {escape(key)}: {len(value)}")
            lines.extend(f"    {escape(_value(v))}" for v in value)
        else:
            lines.append(f"  {escape(key)}: {escape(_value(value))}")
    return lines


def _value(value: Any) -> str:
    """A summary value as text: strings as they are, the rest as compact JSON."""
    return value if isinstance(value, str) else json.dumps(value, default=repr)


def sessions_list(store: StoreOpt = None, as_json: JsonOpt = False) -> None:
    """Every session, newest first."""
    with _open(store) as st:
        rows = st.sessions()
        counts = st.envelope_counts()
        if as_json:
            _dump([{**s.to_dict(), "messages": counts.get(s.id, 0)} for s in rows])
            return
        table = Table(title=f"sessions in {st.path}")
        for col in ("id", "kind", "scenario", "status", "started", "duration", "messages"):
            table.add_column(
                col,
                justify="right" if col == "messages" else "left",
                no_wrap=col in ("id", "status"),
            )
        table.add_column("replay of")
        for s in rows:
            table.add_row(
                s.id,
                s.kind,
                s.scenario or "-",
                _listed_status(s, brief=True)
                + ("" if s.corrupt is None else " [red](corrupt)[/red]"),
                _when(s.started),
                "-" if s.duration is None else f"{s.duration:.2f}s",
                str(counts.get(s.id, 0)),
                s.replay_of or (f"{s.forked_from} (what-if)" if s.forked_from else ""),
            )
        _console().print(table)


def sessions_show(
    session: SessionArg,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """One session: its status, counts, summary and dead letters."""
    with _open(store) as st:
        info = st.session(session)
        counts = st.counts(info.id)
        letters = st.dead_letters(info.id)
        usage = readmodel.usage(st, info.id, calls=as_json)
        nodes = readmodel.nodes(st, info.id)
        if as_json:
            node = st.node_names(info.id)
            _dump(
                {
                    **info.to_dict(),
                    "scenario_text": info.scenario_text,
                    "counts": counts,
                    "dead_letters": [d.to_dict() | {"node": node(d.node)} for d in letters],
                    "usage": usage.as_dict(),
                    "model_calls": [dataclasses.asdict(c) for c in usage.calls],
                    # A multi-process session's processes (the key only when it has
                    # them, so a single-process session's document is as it was).
                    **({"nodes": [_node_dict(n) for n in nodes]} if nodes else {}),
                }
            )
            return
        con = _console()
        con.print(f"[bold]{info.id}[/bold]  {info.kind}  {_listed_status(info)}")
        con.print(f"scenario  {info.scenario or '-'}   seed {info.seed}")
        con.print(f"started   {_when(info.started)}   ended {_when(info.ended)}")
        if info.replay_of:
            con.print(f"replay of {info.replay_of}")
        if info.forked_from:
            con.print(
                f"what-if of {info.forked_from}  (pantheon diff {info.forked_from} {info.id})"
            )
        con.print(
            "recorded  "
            + ", ".join(
                f"{v} {k.replace('_', ' ')}" for k, v in counts.items() if k != "journal_chunks"
            )
        )
        for n in nodes:
            colour = {"ok": "green", "killed": "yellow", None: "cyan"}.get(n.status, "red")
            complete = n.ended is not False
            con.print(
                f"node {escape(n.name)}: {escape(', '.join(n.agents) or '(no agents)')}; "
                f"[{colour}]{escape(n.how)}[/{colour}]; "
                + (escape(n.journal) if complete else f"[yellow]{escape(n.journal)}[/yellow]")
            )
        for line in usage_lines(usage):
            con.print(line)
        if info.summary:
            for line in summary_lines(info.summary, unjudged=readmodel.unjudged(info)):
                con.print(line)
        if letters:
            con.print(f"dead letters: {len(letters)} (pantheon dlq list {info.id})")


def dlq_list(
    session: SessionArg,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """The session's dead letters, each with its error, where it was raised, an excerpt of
    its payload and, in a multi-process session, its node; --json has every field, the
    whole payload and traceback."""
    with _open(store) as st:
        sid = st.resolve(session)
        letters = st.dead_letters(sid)
        envs = {e.id: e for e in st.envelopes(sid)}
        # A multi-process session's entries say whose queue dead-lettered them (``driver``
        # for the recording process): its nodes shipped journals (read without the
        # summary, which may be damaged). A single-process session's name none.
        node = st.node_names(sid)
        if as_json:
            out = []
            for d in letters:
                env = envs.get(d.envelope_id)
                payload = None if env is None else env.payload
                out.append({**d.to_dict(), "node": node(d.node), "payload": payload})
            _dump(out)
            return
        con = _console()
        con.print(f"dead letters of {sid}: {len(letters)}", markup=False)
        # A block per entry: at 80 columns a table of seven columns left no room for the
        # payload, which is what a reader needs to see. Only the excerpt is cut, to the
        # width (120 at most: an excerpt, not the payload; --json has it all).
        room = max(40, min(con.width, 120)) - len("    payload ")
        for d in letters:
            env = envs.get(d.envelope_id)
            redriven = f", redriven by {d.redriven_by}" if d.redriven_by else ""
            redriven = redriven or (", redriven" if d.redriven else "")
            where = f" (node {node(d.node)})" if node(d.node) else ""
            lines = [
                f"#{d.entry_id} {d.subscriber}{where} on {d.topic}: {d.reason} after "
                f"{d.attempts} attempt{'s' if d.attempts != 1 else ''}{redriven}",
                f"    {d.error_type}: {d.error}" if d.error_type else "",
                f"    raised at {_raised_at(d.traceback)}" if d.traceback else "",
                "    payload " + ("(not recorded)" if env is None else _excerpt(env.payload, room)),
            ]
            for line in filter(None, lines):
                con.print(line, markup=False, emoji=False)


def dlq_redrive(
    session: SessionArg,
    entry: Annotated[
        int | None, typer.Argument(help="Entry id (default: all not yet redriven).")
    ] = None,
    store: StoreOpt = None,
    setup: SetupOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Re-deliver a finished session's dead letters to the team as it is now, in a new
    session; entries delivered this time are marked redriven. The team asks for approval
    as under ``pantheon run``: on the new session (``pantheon approve NEW ID``), decided as
    the scenario's ``approvals`` says. Exits 0 when every entry was delivered and nothing
    it caused was dead-lettered (or there was none), 1 when any failed again, itself or
    downstream, or was skipped."""
    with _open(store, write=True) as st:
        info = st.session(session)
        team = load_setup(setup, info.scenario_text, info.scenario_dir, session=_named(info, st))
        from pantheon.approvals import redrive_desk

        store_path = Path(st.path)
        desk, waits = redrive_desk(info, store_path, on_waiting=approvals_notice(store_path))

        def started(sid: str, entries: int) -> None:
            # On stderr (stdout is the report): the session whose approvals a person
            # decides, before the redrive waits on one.
            letters = f"{entries} dead letter{'s' if entries != 1 else ''}"
            err_console.print(
                f"redriving {letters} of {info.id} as session {sid}",
                markup=False,
                highlight=False,
                soft_wrap=True,  # whole, for a person to copy the session from
            )

        report = asyncio.run(
            redrive(
                st,
                info.id,
                team,
                None if entry is None else [entry],
                timeout=DEFAULT_REPLAY_TIMEOUT + waits,
                desk=desk,
                on_start=started,
            )
        )
        letters = len(st.dead_letters(info.id)) if report.new_session_id is None else 0
    if as_json:
        _dump(report.to_dict())
    elif report.new_session_id is None:  # nothing ran, nothing was recorded
        _console().print(_nothing_to_redrive(info.id, letters))
    else:
        con = _console()
        con.print(f"redrive of {info.id} recorded as {report.new_session_id}")
        for entry_id, outcome in report.outcomes.items():
            colour = "green" if outcome == "delivered" else "red"
            con.print(f"  entry {entry_id}: [{colour}]{escape(outcome)}[/{colour}]")
        colour = "green" if report.ok else "red"
        con.print(f"[{colour}]{report.outcome}[/{colour}]")
        for line in _new_dead_letters(report):
            con.print(line, markup=False, emoji=False)
    if not report.ok:
        raise typer.Exit(1)


def _nothing_to_redrive(sid: str, letters: int) -> str:
    """Why a redrive ran nothing (and recorded no session): ``sid`` has ``letters`` dead
    letters, every one redriven already, or none."""
    if not letters:
        return f"nothing to redrive: {sid} has no dead letters"
    if letters == 1:
        return f"nothing to redrive: the dead letter of {sid} is redriven already"
    return f"nothing to redrive: all {letters} dead letters of {sid} are redriven already"


def _new_dead_letters(report: RedriveReport) -> list[str]:
    """The dead letters the redrive left in its own session, by number there."""
    letters = report.new_dead_letters
    if not letters:
        return []
    sid = report.new_session_id
    n = len(letters)
    numbers = ", ".join(f"#{d.entry_id}" for d in letters)
    lines = [f"{n} new dead letter{'s' if n != 1 else ''} in {sid}: {numbers}"]
    loose = sum(d.caused_by is None for d in letters)
    if loose:
        lines.append(f"  {loose} of them caused by no redriven entry")
    lines.append(f"  see pantheon dlq list {sid}")
    return lines


def export(
    session: SessionArg,
    fmt: Annotated[str, typer.Option("--format", help="Only jsonl.")] = "jsonl",
    output: Annotated[
        Path | None, typer.Option("-o", "--output", help="File (default: stdout).")
    ] = None,
    store: StoreOpt = None,
) -> None:
    """Export a session's envelopes, one JSON object per line."""
    if fmt != "jsonl":
        raise fail(f"unknown format {fmt!r} (supported: jsonl)")
    with _open(store) as st:
        if output is None:
            export_jsonl(st, session, sys.stdout)
            return
        with output.open("w", encoding="utf-8") as f:
            n = export_jsonl(st, session, f)
        Console(stderr=True).print(f"{n} envelopes written to {output}")


def diff(
    a: Annotated[
        str, typer.Argument(help="First session (the reference): id, prefix, latest or -N.")
    ],
    b: Annotated[str, typer.Argument(help="Second session: id, prefix, latest or -N.")],
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Align B onto A hop by hop: the first difference, the items whose decision changed
    (grouped before→after, with accuracy before and after) and per-hop latency deltas
    (ms). Exits 1 when the runs diverge; 0 when they match, or differ only where effects
    answered the same request differently (timing: what other messages had got there
    first). A session and its replay or what-if, or two teams configured otherwise, that
    differ have diverged."""
    from pantheon.cli._cmd_whatif import decision_lines
    from pantheon.rerun import changed_agents, diff_outcomes, left_out_both

    with _open(store) as st:
        cut_a, cut_b = left_out_both(st, a, b)
        decisions = diff_outcomes(st, a, b)
        result = diff_sessions(
            st, a, b, left_out=cut_a, left_out_b=cut_b, changed=changed_agents(st, a, b),
            input_key=decisions.a.spec.input_key,
        )  # fmt: skip
    if as_json:
        _dump(result.to_dict() | {"decisions": decisions.to_dict()})
    else:
        con = _console()
        con.print(
            f"{result.a} -> {result.b}: {result.hops_compared} hops compared ({result.counts()})"
        )
        for count, (cut, rerun) in ((result.left_out, "AB"), (result.left_out_b, "BA")):
            if count:
                con.print(
                    f"[yellow]{count} inputs not compared:[/yellow] a node of {cut} died in "
                    f"the middle of them, and {rerun} (its re-run) left them out"
                )
        if result.divergence is None:
            con.print("[green]no difference[/green]")
        elif result.timing_only:
            effects = ", ".join(result.timing_effects)
            con.print(
                f"[yellow]timing-dependent:[/yellow] the runs differ in "
                f"{result.differences} place(s), each where an effect ({effects}) answered "
                "differently (what other messages had got there first), not a divergence "
                "of the team's logic"
            )
            con.print(f"first difference: {escape(result.describe('A', 'B'))}")
        else:
            con.print(f"[red]runs diverged:[/red] {escape(result.describe('A', 'B'))}")
        for line in decision_lines(decisions):
            con.print(line)
        # Milliseconds, as `pantheon run` prints them; --json keeps the exact µs.
        table = Table(title="per-hop latency (ms): p50 / p99")
        for col in (
            "scope",
            "hop",
            "metric",
            "A p50",
            "A p99",
            "B p50",
            "B p99",
            "Δp50",
            "Δp99",
        ):
            table.add_column(col, justify="right" if col[0] in "ABΔ" else "left")
        for d in result.latency:
            table.add_row(
                d.scope,
                d.name,
                d.metric,
                f"{d.a.p50_us / 1000:.3f}",
                f"{d.a.p99_us / 1000:.3f}",
                f"{d.b.p50_us / 1000:.3f}",
                f"{d.b.p99_us / 1000:.3f}",
                f"{d.delta_p50_us / 1000:+.3f}",
                f"{d.delta_p99_us / 1000:+.3f}",
            )
        con.print(table)
    if result.divergence is not None and not result.timing_only:
        raise typer.Exit(1)


def replay(
    session: SessionArg,
    live_effects: Annotated[
        bool, typer.Option("--live-effects", help="Call effects for real, not from the record.")
    ] = False,
    from_ts: Annotated[
        float | None,
        typer.Option("--from", help="Start at the first input this many seconds in."),
    ] = None,
    store: StoreOpt = None,
    setup: SetupOpt = None,
    as_json: JsonOpt = False,
    changes: Annotated[
        Path | None,
        typer.Option(
            "--with",
            help="What-if: replay the recorded inputs through the team changed by this "
            "overlay YAML ('-': read it from stdin), effects served where a call is "
            "unchanged (docs/what-if.md).",
            show_default=False,
        ),
    ] = None,
) -> None:
    """Re-run a session with recorded effects and check every hop matches.
    Exits 0 on a match, 1 on a divergence (printed). With --with: a what-if replay,
    exiting 0 when the changed team meets every expectation of the scenario (timing
    bounds aside; dead letters fail it unless the scenario allows them), 1 when one
    fails, 2 for an invalid overlay (nothing runs)."""
    if from_ts is not None and not (math.isfinite(from_ts) and from_ts >= 0):
        raise fail(f"--from {from_ts}: give the seconds into the run to start at, 0 or more")
    with _open(store, write=True) as st:
        info = st.session(session)
        if changes is not None:
            from pantheon.cli._cmd_whatif import whatif_command

            if live_effects or from_ts is not None or setup is not None:
                raise fail("--with cannot be combined with --live-effects, --from or --setup")
            if not whatif_command(st, info, changes, as_json=as_json).passed:
                raise typer.Exit(1)
            return
        con = _console()
        quiet = None if as_json else con
        report = _replayed(st, info, setup, live_effects=live_effects, from_ts=from_ts, con=quiet)
    if as_json:
        _dump(report.to_dict())
    else:
        _print_replay(con, report)
    if report.divergence is not None:
        raise typer.Exit(1)


def _replayed(
    st: SessionStore,
    info: SessionInfo,
    setup: str | None,
    *,
    live_effects: bool,
    from_ts: float | None,
    con: Console | None,
) -> Any:
    """Replay ``info`` exactly with its team rebuilt (or ``setup``'s), traced as the
    ``OTEL_*`` variables ask, a spinner on ``con`` meanwhile (None: quiet, for --json);
    exits 2 when the session cannot be replayed or its team built."""
    remote = unrecorded_nodes(st, info)
    if remote:
        # Recorded before nodes shipped their journals: only what the driver's bus
        # saw is there, so a replay would diverge at the first hop on another node.
        raise fail(
            f"session {info.id} ran on several processes (nodes: {', '.join(remote)}) "
            "and was recorded before every node recorded its part: only the driver's "
            "messages are there, so it cannot be replayed exactly."
        )
    telemetry = _telemetry()
    team = telemetry.wrap_setup(
        load_setup(setup, info.scenario_text, info.scenario_dir, session=_named(info, st))
    )

    async def run() -> Any:
        return await replay_session(st, info.id, team, live_effects=live_effects, from_ts=from_ts)

    try:
        if con is None:
            report = asyncio.run(run())
        else:
            with con.status(f"replaying {info.id} ..."):
                report = asyncio.run(run())
    except AgentSetupError as exc:
        # The recorded team cannot be built today (its code changed since): a
        # located line, as for a run, not a traceback.
        raise fail(f"session {info.id}: nothing ran: {exc}") from None
    finally:
        telemetry.shutdown()
    return report


def _print_replay(con: Console, report: Any) -> None:
    """A replay's report: what was compared and served, the failures it reproduced, what
    an incomplete recording or a cut node journal left out, and the verdict."""
    con.print(
        f"replay of {report.original_session_id} recorded as {report.new_session_id}: "
        f"{report.hops_compared} hops compared, {report.inputs_replayed} inputs "
        f"({report.inputs_skipped} skipped), effects served {report.effects_served}, "
        f"called {report.effects_called}"
    )
    con.print(
        escape(
            f"  {counts_line('served', report.served_by_name)}; "
            f"{counts_line('called', report.called_by_name)}"
        )
    )
    if report.others_replayed:
        con.print(escape(f"  {others_line(report.others_replayed)}"))
    if report.requests_changed:
        line = counts_line("asked other than recorded", report.requests_changed)
        con.print(escape(f"  {line} (a request read something outside an effect)"))
    for f in report.failures:
        con.print(
            f"  reproduced failure: {f.subscriber} on {f.topic} "
            f"({f.outcome}: {f.error_type}: {f.error})"
        )
    if report.incomplete is not None:
        con.print(
            f"[yellow]recording of {report.original_session_id} is incomplete "
            f"({escape(report.incomplete)}); replayed up to its last committed message: "
            f"{report.reproduced_messages} of {report.recorded_messages} recorded "
            "messages reproduced[/yellow]"
        )
    for line in cut_lines(report.cut, report.cut_inputs):
        con.print(line)
    if report.divergence is None:
        con.print("[green]matched[/green]")
    else:
        con.print(f"[red]diverged:[/red] {report.divergence}")


def register(app: typer.Typer) -> None:
    """Add ``sessions``, ``dlq``, ``export``, ``diff`` and ``replay`` to ``app``."""
    sessions = typer.Typer(help="List and inspect recorded sessions.", no_args_is_help=True)
    dlq = typer.Typer(help="Dead letters of a recorded session.", no_args_is_help=True)
    app.add_typer(sessions, name="sessions")
    app.add_typer(dlq, name="dlq")
    sessions.command("list")(sessions_list)
    sessions.command("show")(sessions_show)
    dlq.command("list")(dlq_list)
    dlq.command("redrive")(dlq_redrive)
    app.command("export")(export)
    app.command("diff")(diff)
    app.command("replay")(replay)


def _node_dict(n: readmodel.NodeView) -> dict[str, Any]:
    """A process of ``sessions show --json``: its fields, how it ended and where its
    journal ends in words (``how``, ``journal``), and the line the text output prints."""
    return dataclasses.asdict(n) | {"how": n.how, "journal": n.journal, "text": n.text}


def _named(info: Any, store: SessionStore) -> str:
    return f"session {info.id} in {store.path}"


def _listed_status(info: SessionInfo, *, brief: bool = False) -> str:
    """A session's status as ``sessions show`` (and, ``brief``, ``sessions list``) prints
    it: the recorded one, except where ``completed`` would hide that the command exited 1.
    A redrive records ``completed`` once it has run, whatever its entries did: one where
    any did not go through shows that in red ("13 of 14 redriven, 1 failed again", as
    ``dlq redrive`` said it and the web dashboard lists it; "1 failed again" in the list,
    whose columns share the terminal's width); an exact replay that diverged says
    "diverged"."""
    summary = info.summary
    if info.status == "completed":
        redriven = summary.get("redrive")
        if info.kind == "redrive" and isinstance(redriven, dict):
            outcomes = [str(v) for v in (redriven.get("outcomes") or {}).values()]
            missed = sum(v != "delivered" for v in outcomes)
            if missed:
                skipped = sum(v.startswith("skipped:") for v in outcomes)
                text = readmodel.redrive_outcome(redriven)
                if brief:
                    text = f"{missed} " + ("skipped" if skipped == missed else "failed again")
                return f"[red]{escape(text)}[/red]"
        replay = summary.get("replay")
        if isinstance(replay, dict) and replay.get("matched") is False:
            return "[red]diverged[/red]"
    return _status(info.status)


def _status(status: str) -> str:
    colour = {"completed": "green", "running": "cyan", "failed": "red", "aborted": "yellow"}
    c = colour.get(status, "white")
    return f"[{c}]{status}[/{c}]"
