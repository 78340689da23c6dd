"""``pantheon approve | approvals | resume``: a person in the loop, from any terminal.

Exit codes. ``approve``: 0 decided, 1 someone (or the timeout) decided it first (who and
when are printed), 2 no such session or approval, or a store error. ``approvals``: 0, or 2
as above. ``resume``: 0 the resumed run passed its expectations, 1 it failed them, 2 the
session cannot be resumed (and why).
"""

from __future__ import annotations

import json
import time
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from bus import Bus
from pantheon.approvals import AlreadyDecided, Approval, ApprovalBook, who
from pantheon.cli._common import (
    JsonOpt,
    SessionArg,
    StoreOpt,
    approvals_notice,
    fail,
    run_async,
)
from pantheon.cli._common import console as err_console
from pantheon.cli._console import report_console
from pantheon.cli._summary_text import print_summary
from pantheon.sessions import SessionError, SessionStore, resolve_store_path

__all__ = ["register"]


def _clock(ts: float | None) -> str:
    return "-" if ts is None else time.strftime("%H:%M:%S", time.localtime(ts))


def _line(a: Approval) -> str:
    state = a.status if a.pending else f"{a.status} by {a.decided_by}"
    note = f" ({a.note})" if a.note else ""
    return f"#{a.id} [{state}] {a.asker}: {a.summary}{note}"


def _print_rows(rows: list[Approval], origin: str, pending: bool, as_json: bool) -> None:
    if as_json:
        typer.echo(json.dumps([a.to_dict() for a in rows], indent=2))
        return
    con = report_console(highlight=False)
    if not rows:
        con.print(f"session {origin}: no {'pending ' if pending else ''}approvals")
        return
    table = Table(title=f"approvals of session {origin}")
    for col in ("#", "state", "agent", "summary", "asked", "deadline", "by", "note"):
        table.add_column(col, overflow="fold")
    for a in rows:
        table.add_row(
            str(a.id),
            a.status,
            a.asker,
            escape(a.summary),
            _clock(a.asked),
            f"{_clock(a.deadline)} then {a.default}" if a.pending else "-",
            escape(a.decided_by or ""),
            escape(a.note),
        )
    con.print(table)


def approve(
    session: SessionArg,
    approval: Annotated[int, typer.Argument(help="The approval's number (see approvals).")],
    reject: Annotated[bool, typer.Option("--reject", help="Reject instead of approve.")] = False,
    note: Annotated[str, typer.Option("--note", help="Why, for the record.")] = "",
    by: Annotated[str | None, typer.Option("--by", help="Who decides (default user@host).")] = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Approve (or --reject) a pending approval of a running or aborted session; the
    run waiting for it goes on within a poll interval. Exits 1 if it was already
    decided."""
    try:
        with SessionStore(resolve_store_path(store), create=False) as st:
            book = ApprovalBook(st)
            origin = book.origin(session)
            decided = book.decide(origin, approval, approved=not reject, note=note, by=by or who())
    except AlreadyDecided as exc:
        if as_json:
            typer.echo(json.dumps(exc.approval.to_dict() | {"decided_now": False}, indent=2))
        raise fail(str(exc), 1) from None
    except SessionError as exc:
        raise fail(str(exc)) from None
    if as_json:
        typer.echo(json.dumps(decided.to_dict() | {"decided_now": True}, indent=2))
    else:
        report_console(highlight=False).print(escape(_line(decided)))


def approvals(
    session: SessionArg,
    pending: Annotated[bool, typer.Option("--pending", help="Only those waiting.")] = False,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """List a session's approval requests: number, state, agent, summary, who decided.
    A corrupt row in the store is one line on stderr, left out of the list; the command
    then exits 1."""
    try:
        with SessionStore(resolve_store_path(store), create=False, access="read") as st:
            book = ApprovalBook(st)
            origin = book.origin(session)
            rows = book.entries(origin, status="pending" if pending else None)
    except SessionError as exc:
        raise fail(str(exc)) from None
    corrupt = [a for a in rows if a.corrupt is not None]
    rows = [a for a in rows if a.corrupt is None]
    _print_rows(rows, origin, pending, as_json)
    if corrupt:
        err = Console(stderr=True, highlight=False, soft_wrap=True)
        for a in corrupt:
            err.print(f"[red]error:[/red] {escape(a.corrupt_message())}; left out")
        raise typer.Exit(1)


def resume(
    session: SessionArg,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Finish a run whose process died: re-run its recorded inputs serving the recorded
    effects, wait on its still-pending approvals, then go on live (docs/scenarios.md,
    "Resuming a run"). The new session is named on stderr as it starts, and a request
    left waiting for a person with the ``pantheon approve`` command that decides it.
    Exits 1 if the resumed run fails its expectations."""
    from pantheon.rerun.resume import resume as resume_run
    from pantheon.runner import RunStuck

    path = resolve_store_path(store)
    try:
        with SessionStore(path, create=False, access="read") as st:
            original = st.resolve(session)
    except SessionError as exc:
        raise fail(str(exc)) from None

    def started(bus: Bus) -> None:
        # On stderr (stdout is the report): the session whose approvals a person decides,
        # before the resumed run waits on one.
        err_console.print(
            f"resuming {original} as session {bus.session_id}",
            markup=False,
            highlight=False,
            soft_wrap=True,  # whole, for a person to copy the session from
        )

    notice = approvals_notice(path)
    try:
        result = run_async(resume_run(session, store=path, on_bus=started, on_waiting=notice))
    except SessionError as exc:
        raise fail(str(exc)) from None
    except RunStuck as exc:
        raise fail(f"the resumed run did not finish: {exc}") from None
    except FileNotFoundError as exc:  # the scenario's input file went away
        raise fail(f"cannot resume {session}: {exc}") from None
    summary = result.summary
    if as_json:
        from dataclasses import asdict

        out = asdict(summary) | {"passed": summary.passed, "resume": result.to_dict()}
        typer.echo(json.dumps(out, indent=2, default=repr))
    else:
        report_console(highlight=False).print(
            f"resumed {result.original_session_id} as {summary.session_id}: "
            f"{result.inputs_replayed} recorded inputs re-run, effects served "
            f"{result.effects_served}, called {result.effects_called}"
            + (f", {result.mismatched} did not match" if result.mismatched else "")
            + (
                f", {result.asked_again} asked again (their node's driver had died)"
                if result.asked_again
                else ""
            )
        )
        print_summary(summary)
    if not summary.passed:
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    """Add ``approve``, ``approvals`` and ``resume`` to ``app``."""
    app.command()(approve)
    app.command()(approvals)
    app.command()(resume)
