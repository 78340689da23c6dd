"""The Actor's tools for the on-call team: paging and the runbook actions.

Offline stand-ins for the automation a real desk calls (a pager service, the orchestrator,
the database operator, the certificate manager): each takes one step of a decision and
answers what that system would, as plain data. The built-in Actor calls them by import path
(its ``tools`` setting), each call an effect, so a replay serves the recorded answer and
never pages anyone twice; its outbox (``.pantheon/outbox/<session>.jsonl``) keeps one line
per step with the answer.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["clear_disk", "failover_db", "page", "renew_cert", "restart_service", "scale_out"]


def page(step: Mapping[str, Any]) -> dict[str, Any]:
    """Page the service's on-call human about the incident."""
    return {
        "paged": f"oncall-{step['service']}",
        "incident": step["incident"],
        "message": f"[{step['incident']}] {step.get('summary', '')}".strip(),
        "why": step.get("why", ""),
    }


def restart_service(step: Mapping[str, Any]) -> dict[str, Any]:
    """Restart the service on the host (a rolling restart of one instance)."""
    return {"restarted": step["service"], "host": step["host"]}


def clear_disk(step: Mapping[str, Any]) -> dict[str, Any]:
    """Rotate logs and drop caches and old artifacts on the host."""
    return {"cleaned": step["host"], "paths": ["/var/log", "/var/cache", "/var/tmp"]}


def failover_db(step: Mapping[str, Any]) -> dict[str, Any]:
    """Promote a replica in place of the failed database host."""
    return {"failed_over": step["host"], "service": step["service"]}


def renew_cert(step: Mapping[str, Any]) -> dict[str, Any]:
    """Issue and deploy a fresh TLS certificate for the service."""
    return {"renewed": f"{step['service']}.example.com", "host": step["host"]}


def scale_out(step: Mapping[str, Any]) -> dict[str, Any]:
    """Add one instance to the service."""
    return {"scaled": step["service"], "by": 1}
