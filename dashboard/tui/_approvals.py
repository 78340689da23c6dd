"""The monitor's approvals: the session's requests, and a key to approve or reject one.

The requests are read from the session store (where the run keeps them and polls for
decisions), every :data:`APPROVALS_POLL` seconds while the monitor runs; a decision is
written there too, so the run goes on within its own poll interval whether it is in this
process or another (see :mod:`pantheon.sessions._approvals`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label, Static

from pantheon.approvals import Approval, ApprovalBook, who
from pantheon.sessions import SessionStore

__all__ = ["APPROVALS_POLL", "DecisionScreen", "decide", "read_approvals"]

#: Seconds between reads of the session's approvals.
APPROVALS_POLL = 0.5


def read_approvals(store: Path, session_id: str) -> list[Approval]:
    """The approvals of ``session_id`` (shared with the run it resumed, if any)."""
    with SessionStore(store, create=False, access="read") as st:
        book = ApprovalBook(st)
        return book.entries(book.origin(session_id))


def decide(store: Path, approval: Approval, *, approved: bool, note: str) -> Approval:
    """Decide ``approval`` as the person at this terminal; raises
    :class:`pantheon.sessions.AlreadyDecided` if someone was first."""
    with SessionStore(store, create=False) as st:
        return ApprovalBook(st).decide(
            approval.origin, approval.id, approved=approved, note=note, by=who()
        )


def approval_cells(a: Approval) -> tuple[str, ...]:
    if a.corrupt is not None:
        state = f"corrupt: {a.corrupt}"
    elif a.pending:
        left = max(0.0, a.deadline - time.time())
        state = f"pending ({left:.0f}s, then {a.default})"
    else:
        state = f"{a.status} by {a.decided_by}"
    return (str(a.id), state, a.asker, a.note, a.summary)


class DecisionScreen(ModalScreen[tuple[bool, str] | None]):
    """Asks for the note of one decision; ``enter`` decides, ``escape`` cancels."""

    BINDINGS: ClassVar[list[BindingType]] = [Binding("escape", "cancel", "Cancel")]

    def __init__(self, approval: Approval, approved: bool) -> None:
        super().__init__()
        self.approval = approval
        self.approved = approved

    def compose(self) -> ComposeResult:
        verb = "Approve" if self.approved else "Reject"
        with Vertical(id="decision"):
            yield Label(f"{verb} #{self.approval.id} ({self.approval.asker})", classes="heading")
            yield Static(self.approval.summary, id="decision-summary")
            yield Input(placeholder="note (enter to confirm, escape to cancel)", id="note")

    @on(Input.Submitted, "#note")
    def _submit(self, event: Input.Submitted) -> None:
        self.dismiss((self.approved, event.value))

    def action_cancel(self) -> None:
        self.dismiss(None)


def rows(approvals: list[Approval]) -> list[tuple[str, tuple[Any, ...]]]:
    """Table rows, pending first (oldest first), then the decided ones, newest first."""
    waiting = [a for a in approvals if a.pending]
    done = sorted((a for a in approvals if not a.pending), key=lambda a: -(a.decided or 0))
    return [(str(a.id), approval_cells(a)) for a in (*waiting, *done)]
