"""``pantheon replay SESSION --with changes.yaml`` and the decision block of ``pantheon diff``.

Kept out of ``_cmd_sessions`` so the exact replay's command stays as it was: that module
only hands ``--with`` over to :func:`whatif_command`.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.markup import escape

from pantheon.cli._common import approvals_notice
from pantheon.cli._common import console as err_console
from pantheon.cli._summary_text import (
    cut_lines,
    dead_letter_lines,
    dead_letters_text,
    expectation_lines,
    others_line,
    verdict_line,
)
from pantheon.rerun import (
    OutcomeDiff,
    WhatIfReport,
    apply_overlay,
    counts_line,
    read_overlay,
    whatif_replay,
)
from pantheon.runner import AgentSetupError
from pantheon.scenario import MAX_SCENARIO_BYTES, Problem, ScenarioError
from pantheon.sessions import SessionInfo, SessionStore

__all__ = ["decision_lines", "verdict_lines", "whatif_command"]

#: Items named per group in the terminal (``--json`` has them all).
SHOWN_ITEMS = 40


def decision_lines(diff: OutcomeDiff) -> list[str]:
    """The decisions that changed, as markup-safe lines: the headline, one line per
    ``before→after`` group naming its items, and the accuracy before and after."""
    lines = [escape(diff.headline())]
    for before, after, items in diff.groups:
        shown = ", ".join(items[:SHOWN_ITEMS])
        more = f" and {len(items) - SHOWN_ITEMS} more" if len(items) > SHOWN_ITEMS else ""
        lines.append(f"  {escape(before)}→{escape(after)} ({len(items)}): {escape(shown)}{more}")
    lines.append(escape(diff.accuracy_line()))
    return lines


def whatif_command(
    store: SessionStore, info: SessionInfo, overlay_path: Path, *, as_json: bool
) -> WhatIfReport:
    """Validate the overlay (exit 2 naming ``file:line:column`` before anything runs), run
    the what-if replay and print what changed and how the changed team meets the
    scenario's expectations. Returns the report for the exit code."""
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    if not info.scenario_text:
        err.print(f"[red]error:[/red] session {info.id} has no scenario text to change")
        raise typer.Exit(2)
    try:
        if str(overlay_path) == "-":
            # The dashboard's form pipes its text in; at most what a file may hold.
            text = sys.stdin.read(MAX_SCENARIO_BYTES + 1)
            if len(text) > MAX_SCENARIO_BYTES:
                raise ScenarioError([Problem("<stdin>", 1, 1, "", "too large for an overlay")])
            source = "<stdin>"
        else:
            text, source = read_overlay(overlay_path), str(overlay_path)
        base = None if info.scenario_dir is None else Path(info.scenario_dir)
        overlay = apply_overlay(info.scenario_text, text, source=source, base_dir=base)
    except OSError as exc:
        why = escape(exc.strerror or str(exc))
        err.print(f"[red]error:[/red] {escape(str(overlay_path))}: {why}")
        raise typer.Exit(2) from None
    except ScenarioError as exc:
        err.print(f"[red]error:[/red] invalid overlay:\n{escape(str(exc))}")
        raise typer.Exit(2) from None
    con = Console(highlight=False, soft_wrap=True)
    # A request the changed team asks again waits for a person: said on stderr, with the
    # command that decides it, as `pantheon run` says it.
    notice = approvals_notice(Path(store.path))

    def replay() -> WhatIfReport:
        try:
            return asyncio.run(whatif_replay(store, info.id, overlay, on_waiting=notice))
        except AgentSetupError as exc:  # the overlay's team cannot be built: nothing ran
            err.print(f"[red]error:[/red] {escape(source)}: nothing ran: {escape(str(exc))}")
            raise typer.Exit(2) from None

    if as_json:
        report = replay()
        typer.echo(json.dumps(report.to_dict(), indent=2))
        return report
    # On the notice's console (stderr), so that a notice prints above the spinner rather
    # than under a line it then redraws.
    with err_console.status(f"what-if replay of {info.id} with {escape(source)} ..."):
        report = replay()
    skipped = f" ({report.inputs_skipped} skipped)" if report.inputs_skipped else ""
    con.print(
        f"what-if replay of {report.original_session_id} with {escape(source)} "
        f"recorded as {report.new_session_id}: {report.inputs_replayed} inputs{skipped}, "
        f"effects served {report.effects_served}, called live {report.effects_called}"
    )
    con.print(
        escape(
            f"  {counts_line('served', report.served_by_name)}; "
            f"{counts_line('called live', report.called_by_name)}"
        )
    )
    if report.others_replayed:
        con.print(escape(f"  {others_line(report.others_replayed)}"))
    for line in cut_lines(report.cut, report.cut_inputs):
        con.print(line)
    for line in decision_lines(report.decisions):
        con.print(line)
    for line in verdict_lines(report):
        con.print(line)
    con.print(f"pantheon diff {report.original_session_id} {report.new_session_id}")
    return report


def verdict_lines(report: WhatIfReport) -> list[str]:
    """The changed team's dead letters (by reason, and why, per subscriber) and every
    expectation judged, as ``pantheon run`` prints them, then the timing bounds left out."""
    s = report.summary
    lines = [dead_letters_text(s), *dead_letter_lines(s)]
    lines += expectation_lines(s)
    if report.not_judged:
        lines.append(
            f"not judged: {', '.join(report.not_judged)} (a what-if's timings are the "
            "replay's, not the team's)"
        )
    lines.append(verdict_line(s))
    return lines
