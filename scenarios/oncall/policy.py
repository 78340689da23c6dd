"""The on-call desk's standing rules: the runbook the Decider follows, and the policy the
built-in Guardian applies before anything automatic touches production.

The runbook says what an incident calls for from its root alert alone. The policy is where
judgement overrides it: some actions are never automatic (failing over the primary
database), and nothing is automatic during a change freeze. Both are data a scenario can
override (the Decider's ``runbook`` setting; the Guardian's ``policy_options``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, model_validator

from oncall.estate import epoch

__all__ = [
    "ACTIONS",
    "RUNBOOK",
    "Action",
    "FreezeWindow",
    "HumanOnly",
    "OnCallPolicy",
    "Rule",
]

#: A runbook action: the Actor has a tool of that name (``oncall.tools``).
Action = Literal["restart_service", "clear_disk", "failover_db", "renew_cert", "scale_out"]
ACTIONS: tuple[str, ...] = get_args(Action)


class _Closed(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Rule(_Closed):
    """One line of the runbook: what an alert matching every given field calls for. Empty
    fields match anything; the first matching rule wins."""

    kind: tuple[str, ...] = ()
    severity: tuple[Literal["info", "warning", "critical"], ...] = ()
    service: tuple[str, ...] = ()
    role: str | None = None
    decision: Literal["page", "remediate", "ignore"]
    action: Action | None = None
    """The runbook action, for ``remediate`` only."""

    @model_validator(mode="after")
    def _action_iff_remediate(self) -> Rule:
        if (self.decision == "remediate") != (self.action is not None):
            raise ValueError("a remediate rule names its action, and only a remediate rule")
        return self

    def matches(self, alert: Mapping[str, Any]) -> bool:
        labels = alert.get("labels") or {}
        return (
            (not self.kind or alert.get("kind") in self.kind)
            and (not self.severity or alert.get("severity") in self.severity)
            and (not self.service or alert.get("service") in self.service)
            and (self.role is None or labels.get("role") == self.role)
        )


def _rule(decision: str, action: str | None = None, **match: Any) -> Rule:
    return Rule(decision=decision, action=action, **match)  # type: ignore[arg-type]


#: The default runbook, most specific first. Warnings that no rule names are noise.
RUNBOOK: tuple[Rule, ...] = (
    _rule("ignore", severity=("info",)),
    _rule("remediate", "failover_db", kind=("service_down",), role="primary"),
    _rule("remediate", "restart_service", kind=("service_down", "oom_kill")),
    _rule("remediate", "restart_service", kind=("health_check",), severity=("critical",)),
    _rule("remediate", "clear_disk", kind=("disk_full",)),
    _rule("remediate", "renew_cert", kind=("cert_expiry",)),
    _rule("page", kind=("cpu_high",), severity=("critical",), service=("db",)),
    _rule("remediate", "scale_out", kind=("cpu_high",), severity=("critical",)),
    _rule("page", kind=("replica_lag", "error_rate_5xx", "latency_p99"), severity=("critical",)),
    _rule("ignore"),
)


class FreezeWindow(_Closed):
    """A change freeze: from ``start`` to ``end`` (ISO-8601), nothing automatic."""

    start: str
    end: str
    reason: str = "change freeze"

    @model_validator(mode="after")
    def _ordered(self) -> FreezeWindow:
        try:
            start, end = epoch(self.start), epoch(self.end)
        except ValueError as exc:
            raise ValueError(f"freeze times must be ISO-8601: {exc}") from None
        if end <= start:
            raise ValueError(f"freeze ends ({self.end}) before it starts ({self.start})")
        return self


class HumanOnly(_Closed):
    """An action a human must take: on any target, or only on targets with ``role``."""

    action: Action
    role: str | None = None


class OnCallPolicy:
    """The Guardian's policy for the on-call team (``policy: "oncall.policy:OnCallPolicy"``).

    Pages and ignores pass (``approved``). A remediation is ``blocked`` and paged instead,
    with the reason, when its action is ``human_only`` for its target, or when it was decided
    during one of the ``freezes``. Pure: the same proposal always gets the same decision,
    which is what lets a replay run it again.
    """

    __slots__ = ("_freezes", "_human_only")

    class Options(_Closed):
        freezes: tuple[FreezeWindow, ...] = ()
        human_only: tuple[HumanOnly, ...] = Field(
            default=(HumanOnly(action="failover_db", role="primary"),)
        )

    def __init__(self, **options: Any) -> None:
        # pydantic's ValidationError is a ValueError: the Guardian reports it at load.
        opts = self.Options.model_validate(options)
        self._freezes = tuple((epoch(f.start), epoch(f.end), f.reason) for f in opts.freezes)
        self._human_only = tuple((h.action, h.role) for h in opts.human_only)

    def __call__(self, proposal: Mapping[str, Any]) -> dict[str, Any]:
        decision = dict(proposal)
        if proposal["decision"] != "remediate":
            what = "paging a human" if proposal["decision"] == "page" else "nothing to do"
            return decision | {"verdict": "approved", "reasons": [what]}
        blocked = self.why_blocked(proposal)
        if blocked is None:
            return decision | {"verdict": "approved", "reasons": ["within policy"]}
        steps = proposal["steps"]
        if steps:  # an action this alert was to start: a page starts instead
            target = proposal["target"]
            steps = [
                {
                    "tool": "page",
                    "incident": proposal["incident"],
                    "service": target["service"],
                    "host": target["host"],
                    "summary": proposal.get("summary", ""),
                    "why": blocked,
                }
            ]
        return decision | {
            "verdict": "blocked",
            "decision": "page",
            "action": "page",
            "proposed": proposal["action"],
            "steps": steps,
            "reasons": [blocked],
        }

    def why_blocked(self, proposal: Mapping[str, Any]) -> str | None:
        """Why the remediation ``proposal`` may not run unattended, or ``None``."""
        action, target = proposal["action"], proposal["target"]
        for act, role in self._human_only:
            if act == action and role in (None, target.get("role")):
                who = f"{role} {target['host']}" if role else target["host"]
                return f"{action} of {who} needs a human"
        at = epoch(proposal["decided_at"])
        for start, end, reason in self._freezes:
            if start <= at < end:
                return f"{reason}: no automatic {action} on {target['host']}; paging instead"
        return None
