"""``pantheon trace SESSION [ITEM]``: what the team did with one item, call by call.

The story is :func:`pantheon.itemtrace.item_trace`'s (the web dashboard's Trace tab draws
the same); this module only prints it. Exit codes: 0 shown, 2 no such session or item (one
line naming what was not found, and where to look).
"""

from __future__ import annotations

import json
from typing import Annotated, Any

import typer

from pantheon.cli._cmd_sessions import _open
from pantheon.cli._common import JsonOpt, SessionArg, StoreOpt, fail, store_option
from pantheon.cli._console import report_console
from pantheon.itemtrace import EXCERPT, ItemList, ItemNotFound, item_list, item_trace, trace_lines
from pantheon.sessions import SessionNotFound, resolve_store_path

__all__ = ["item_table", "register"]


def trace(
    session: SessionArg,
    item: Annotated[
        str | None,
        typer.Argument(
            help="The item's key as the team's outcome names it (A-1, INV-03), or the id "
            "of any message of its tree; without it, the session's items are listed.",
            show_default=False,
        ),
    ] = None,
    store: StoreOpt = None,
    as_json: JsonOpt = False,
    full: Annotated[
        bool,
        typer.Option(
            "--full", help=f"Print payloads, answers and texts whole (else cut at {EXCERPT})."
        ),
    ] = False,
) -> None:
    """What the team did with one item: every message of its tree (topic, who published
    it, who handled it, on which node, when from the input, how long each handling took),
    under each handling its effect calls in order (a model's text and the tool calls it
    asked for with their arguments, each tool's result, an approval's decision and who
    made it, errors), dead letters, and the item's outcome.

    Without ITEM: the session's items, each with its outcome, hops, effect calls, errors
    and dead letters, to pick one from."""
    path = resolve_store_path(store)
    with _open(store) as st:
        try:
            if item is None:
                items = item_list(st, session)
                if as_json:
                    _dump(items.to_dict())
                    return
                lines = item_table(items, store_option(path))
            else:
                story = item_trace(st, session, item)
                if as_json:
                    _dump(story.to_dict())
                    return
                lines = trace_lines(story, limit=None if full else EXCERPT)
        except SessionNotFound as exc:
            raise fail(f"{exc}; pantheon sessions list{store_option(path)} shows them") from None
        except ItemNotFound as exc:
            raise fail(
                f"{exc}; pantheon trace {exc.session}{store_option(path)} lists its {exc.noun}s"
            ) from None
    con = report_console(highlight=False)
    for line in lines:
        con.print(line, markup=False, emoji=False)


def item_table(items: ItemList, store: str = "") -> list[str]:
    """The items as ``pantheon trace SESSION`` lists them: a head, aligned columns (the
    label column only when the session's input has labels) and how to see one."""
    labelled = any(r.expected is not None for r in items.items)
    head = ["item", "outcome", *(("expected",) if labelled else ()), "messages", "hops"]
    head += ["effects", "errors", "dead letters"]
    rows = []
    for r in items.items:
        expected: tuple[str, ...] = ()
        if labelled:
            mark = "" if r.right is None else (" (right)" if r.right else " (wrong)")
            expected = ((r.expected or "-") + mark,)
        counts = (r.messages, r.hops, r.effects, r.errors, r.dead_letters)
        rows.append([r.item, r.outcome or "-", *expected, *map(str, counts)])
    n = len(items.items)
    noun = items.noun + ("" if n == 1 else "s")
    by = f"by {items.key}"
    if items.numbered:
        by += f" (#N: the Nth input, which has no {items.key})"
    lines = [
        f"{n} {noun} in session {items.session} ({items.kind} of {items.scenario or '?'}), {by}:"
    ]
    if not rows:
        return lines
    widths = [max(len(x) for x in col) for col in zip(head, *rows, strict=True)]
    numeric = len(head) - 5
    for row in [head, *rows]:
        cells = [
            cell.rjust(w) if i >= numeric else cell.ljust(w)
            for i, (cell, w) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    lines.append(f"pantheon trace {items.session} {items.items[0].item}{store} shows one")
    return lines


def _dump(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=repr, ensure_ascii=False))


def register(app: typer.Typer) -> None:
    """Add ``trace`` to ``app``."""
    app.command("trace")(trace)
