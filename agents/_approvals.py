"""Approval: an agent hands one action to a person instead of deciding it.

``await agent.approve({"summary": "refund 450.00 to ann@example.com", ...})`` asks, waits
and returns the person's :class:`Decision`. The asking goes through the agent's ``desk``
(an :class:`ApprovalDesk` the runtime supplies: ``pantheon`` keeps requests in the session
store, where a person answers from the terminal monitor, the web dashboard or
``pantheon approve``), and the whole exchange is one effect, ``human.approval``: the
recording keeps the decision, so a replay serves it and asks nobody.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from agents._errors import AgentError

__all__ = [
    "APPROVAL_EFFECT",
    "ApprovalDesk",
    "ApprovalUnavailable",
    "Decision",
    "check_approval_request",
]

#: The effect name an approval is recorded under.
APPROVAL_EFFECT = "human.approval"
#: Characters at most in a request's ``summary``: one line on an 80-column screen, with room.
MAX_SUMMARY = 500


class ApprovalUnavailable(AgentError, RuntimeError):
    """An agent asked for approval where nobody can be asked (no desk: a bare agent outside
    ``pantheon run``), or asked with a request that cannot be shown to a person."""


@dataclass(frozen=True, slots=True)
class Decision:
    """What a person (or the timeout) decided about one request.

    ``id`` is the request's number in its session (what ``pantheon approve SESSION ID``
    takes); ``by`` says who: a person's name, ``auto`` (a scenario's scripted human) or
    ``timeout`` (nobody answered in time and the scenario's default applied)."""

    id: int
    approved: bool
    note: str
    by: str
    decided_at: float

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "approved": self.approved,
            "note": self.note,
            "by": self.by,
            "decided_at": self.decided_at,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Decision:
        return cls(
            id=int(data["id"]),
            approved=bool(data["approved"]),
            note=str(data.get("note") or ""),
            by=str(data.get("by") or ""),
            decided_at=float(data.get("decided_at") or 0.0),
        )

    @property
    def verdict(self) -> str:
        """``approved`` or ``rejected``."""
        return "approved" if self.approved else "rejected"

    def reason(self) -> str:
        """One line for a decision's reasons: ``approved by ann: refund checked``."""
        text = f"{self.verdict} by {self.by}"
        return f"{text}: {self.note}" if self.note else text


@runtime_checkable
class ApprovalDesk(Protocol):
    """Where an agent's approval requests go and their decisions come from.

    ``ask`` returns the decision as plain data (:meth:`Decision.to_dict`), since that is
    what the effect records. It must be idempotent per request: asked again for the same
    request (a resumed run re-asking what a crashed one asked), it answers with the same
    pending request, not a second one."""

    async def ask(self, agent: str, request: Mapping[str, Any]) -> Mapping[str, Any]: ...


def check_approval_request(agent: str, request: Any) -> dict[str, Any]:
    """The request as a plain dict, or :class:`ApprovalUnavailable` saying what is wrong:
    a mapping with a one-line ``summary`` a person reads (other keys are details)."""
    if not isinstance(request, Mapping):
        raise ApprovalUnavailable(
            f"agent {agent!r}: an approval request is a mapping, not {type(request).__name__}"
        )
    summary = request.get("summary")
    if not isinstance(summary, str) or not summary.strip():
        raise ApprovalUnavailable(
            f"agent {agent!r}: an approval request needs a 'summary' (a non-empty string)"
        )
    if len(summary) > MAX_SUMMARY or "\n" in summary:
        raise ApprovalUnavailable(
            f"agent {agent!r}: an approval request's summary is one line of at most "
            f"{MAX_SUMMARY} characters"
        )
    return dict(request)
