"""What a support-desk session decided, per email, read from its store."""

from __future__ import annotations

from pathlib import Path

from pantheon.sessions import SessionStore

__all__ = ["outcomes"]


def outcomes(store: Path, session: str) -> dict[str, tuple[str, str]]:
    """(Guardian verdict, action taken) per email id, from the session's action.executed."""
    with SessionStore(store) as s:
        envelopes = s.envelopes(s.resolve(session))
    return {
        e.payload["email_id"]: (e.payload["verdict"], e.payload["action"])
        for e in envelopes
        if e.topic == "action.executed"
    }
