"""What the desk's two model agents answer: checked against these before anything is
published, so a malformed answer goes back to the model instead of down the line."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict

__all__ = ["Decision", "Screening"]


class Screening(BaseModel):
    """The intake agent's report: what the directory says of the requester."""

    model_config = ConfigDict(extra="forbid")

    found: bool
    name: str | None = None
    status: Literal["active", "on_leave", "terminated"] | None = None
    department: str | None = None
    contractor: bool = False
    manager: str | None = None


class Decision(BaseModel):
    """The reviewer's decision on one request, and the policy rule it went by."""

    model_config = ConfigDict(extra="forbid")

    decision: Literal["grant", "deny", "escalate"]
    reason: str
