"""The session page's approvals: every request of the run, and buttons to decide the
pending ones.

Read from and written to the session store, like everything the web app shows: a decision
made here reaches the run (in whatever process it is) within its poll interval, and a run
that crashed finds it when ``pantheon resume`` picks it up.
"""

from __future__ import annotations

import time
from pathlib import Path

import pandas as pd
import streamlit as st

from dashboard.web._app import store, when
from pantheon.approvals import Approval, ApprovalBook, ApprovalError, who
from pantheon.sessions import SessionInfo, StoreReadOnly

__all__ = ["approvals_panel"]

#: Session state key of the last decision made on the page: (origin, ok, what happened).
_SAID = "approvals_said"


def approvals_panel(path: Path, info: SessionInfo) -> None:
    """Nothing for a session that never asked; otherwise its requests, pending first."""
    with store(path) as s:
        book = ApprovalBook(s)
        origin = book.origin(info.id)
        rows = book.entries(origin)
    if not rows:
        return
    # A corrupt row (edited by hand, damaged) is said once and offered no buttons; the
    # others are shown and decided as ever.
    corrupt = [a for a in rows if a.corrupt is not None]
    rows = [a for a in rows if a.corrupt is None]
    waiting = [a for a in rows if a.pending]
    st.subheader(f"Approvals ({len(waiting)} waiting)" if waiting else "Approvals")
    # The last decision made on this page stays said: a running session's page redraws
    # every second, which would otherwise wipe it before anyone read it.
    said = st.session_state.get(_SAID)
    if said is not None and said[0] == origin:
        (st.success if said[1] else st.warning)(said[2])
    for a in corrupt:
        st.error(a.corrupt_message())
    for a in waiting:
        _pending(path, a)
    done = [a for a in rows if not a.pending]
    if done:
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        "#": a.id,
                        "decision": a.status,
                        "by": a.decided_by,
                        "note": a.note,
                        "agent": a.asker,
                        "request": a.summary,
                        "decided": when(a.decided),
                    }
                    for a in done
                ]
            ),
            hide_index=True,
            key="approvals_table",
        )


def _pending(path: Path, a: Approval) -> None:
    left = max(0.0, a.deadline - time.time())
    with st.container(border=True):
        st.markdown(f"**#{a.id}** · {a.asker} · {a.summary}")
        st.caption(f"asked {when(a.asked)}; {a.default}s by itself in {left:.0f} s")
        note = st.text_input("Note", key=f"approval_note_{a.origin}_{a.id}")
        approve, reject = st.columns(2)
        if approve.button("Approve", key=f"approve_{a.origin}_{a.id}", type="primary"):
            _decide(path, a, approved=True, note=note)
        if reject.button("Reject", key=f"reject_{a.origin}_{a.id}"):
            _decide(path, a, approved=False, note=note)


def _decide(path: Path, a: Approval, *, approved: bool, note: str) -> None:
    with store(path) as s:
        try:
            done = ApprovalBook(s).decide(a.origin, a.id, approved=approved, note=note, by=who())
        # Decided first, gone, corrupt, or a store that cannot be written: said, not raised.
        except (ApprovalError, StoreReadOnly) as exc:
            st.session_state[_SAID] = (a.origin, False, str(exc))
        else:
            text = f"#{done.id} {done.status}" + (f": {done.note}" if done.note else "")
            st.session_state[_SAID] = (a.origin, True, text)
    st.rerun()
