"""The run summary's dead-letter and expectation lines (rich markup), printed the same way by
``pantheon run``, a what-if and anything else that reports a :class:`~pantheon.RunSummary`."""

from __future__ import annotations

from collections import Counter
from typing import Any

from rich.markup import escape

__all__ = [
    "MAX_DEAD_LETTER_LINES",
    "STATE_MARKS",
    "budget_lines",
    "dead_letter_lines",
    "dead_letters_text",
    "expectation_lines",
    "verdict_line",
]

#: How a check's state reads in a report: the third one is neither green nor red.
STATE_MARKS = {
    "passed": "[green]PASS[/green]",
    "failed": "[red]FAIL[/red]",
    "inconclusive": "[yellow]INCONCLUSIVE[/yellow]",
}

#: Subscriber/reason pairs explained one per line under the dead-letter count; the rest
#: are summed on one more line.
MAX_DEAD_LETTER_LINES = 3


def dead_letters_text(s: Any) -> str:
    """Every dead letter of the run by reason (the same counts the expectations judge), how
    many of them the summary lists (the lines under it add up to that), and where the rest
    are kept."""
    total = sum(s.dlq.values())
    text = f"dead letters {total:,}"
    reasons = sorted(s.dlq.items(), key=lambda r: -r[1])
    notes = [", ".join(f"{n:,} {escape(reason)}" for reason, n in reasons)] if reasons else []
    # Shed messages come in floods and are never listed one by one.
    listed = len(s.dead_letters)
    partial = []
    if listed < total - s.dlq.get("shed", 0):
        partial.append(f"{listed:,} listed")
    if s.dlq_evicted:
        partial.append(f"the last {total - s.dlq_evicted:,} kept in memory")
    if partial:
        where = "all in the session store" if s.session_id else "the run was not recorded"
        notes.append(", ".join([*partial, where]))
    return text + (f" ({'; '.join(notes)})" if notes else "")


def dead_letter_lines(s: Any) -> list[str]:
    """Why the listed messages died: once per subscriber and reason, with one example; the
    counts add up to the number listed."""
    why = Counter((d["subscriber"], d["reason"]) for d in s.dead_letters)
    example = {(d["subscriber"], d["reason"]): d["error"] for d in s.dead_letters}
    lines = []
    for (sub, reason), n in why.most_common(MAX_DEAD_LETTER_LINES):
        e = example[sub, reason]
        lines.append(f"  {n} x {escape(sub)} ({reason})" + (f", e.g. {escape(e)}" if e else ""))
    rest = why.most_common()[MAX_DEAD_LETTER_LINES:]
    if rest:
        lines.append(
            f"  {sum(n for _, n in rest):,} more in {len(rest)} other subscriber/reason pairs"
            + (f" (pantheon dlq list {s.session_id})" if s.session_id else "")
        )
    return lines


def expectation_lines(s: Any) -> list[str]:
    """One line per expectation, ``PASS``/``FAIL``/``INCONCLUSIVE`` with the actual value, and
    under one that did not pass, why (a timing check's share of the run spent waiting)."""
    from pantheon.runner import expectation_state

    lines = []
    for e in s.expectations:
        state = expectation_state(e)
        lines.append(
            f"{STATE_MARKS[state]} {escape(str(e['name']))} (actual {escape(str(e['actual']))})"
        )
        if state != "passed" and e.get("why"):
            lines.append(f"     {escape(str(e['why']))}")
    return lines


def verdict_line(s: Any) -> str:
    """The last line: every expectation passed (saying how many timing checks could not
    judge a starved run), or not."""
    from pantheon.runner import expectation_state

    unsure = sum(expectation_state(e) == "inconclusive" for e in s.expectations)
    if not s.passed:
        return "[red]expectations failed[/red]"
    if unsure:
        # Still "all passed": an inconclusive check passes unless timing is strict.
        return (
            f"[green]all expectations passed[/green] [yellow]({unsure} timing "
            f"check{'s' if unsure != 1 else ''} inconclusive: the process waited for a "
            "CPU)[/yellow]"
        )
    return "[green]all expectations passed[/green]"


def budget_lines(budget: dict[str, dict[str, Any]]) -> list[str]:
    """One line per budget scope: what it spent of its limits, and whether it stopped calls
    (how many it refused)."""
    lines = []
    for scope, b in budget.items():
        spent = []
        if b.get("limit_tokens") is not None:
            spent.append(f"{b['tokens']:,} of {b['limit_tokens']:,} tokens")
        if b.get("limit_cost_usd") is not None:
            spent.append(f"${b['cost_usd']:.4f} of ${b['limit_cost_usd']}")
        verdict = (
            f"[red]stopped[/red] {b['refused']:,} calls" if b.get("stopped") else "within budget"
        )
        lines.append(f"budget    {escape(scope)}: {', '.join(spent)}, {verdict}")
    return lines
