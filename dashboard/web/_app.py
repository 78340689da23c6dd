"""The store, error pages and the sessions list; the routing is the app script's
(``app.py``), so the session page's modules import this one and not the reverse.

The page is chosen by the URL: ``?session=ID`` is a session's page, no parameter the list,
so a session page can be bookmarked and shared. The store is the one ``$PANTHEON_STORE``
names (``pantheon dashboard --store`` sets it), never one the URL names: a browser must
not be able to point the server at an arbitrary file. Every render opens the store and
closes it again; sessions are read only through :mod:`pantheon.readmodel` and
``SessionStore``, which see what a live run has committed.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

import pandas as pd
import streamlit as st

from agents import AgentUsage
from pantheon import readmodel
from pantheon.sessions import (
    SchemaVersionError,
    SessionError,
    SessionNotFound,
    SessionStore,
    StoreReadOnly,
)

__all__ = [
    "LIVE_REFRESH_S",
    "SESSION_PARAM",
    "USD_COLUMN",
    "cost_of",
    "open_session",
    "sessions_page",
    "store",
    "when",
]

#: How often a page showing a running session re-reads the store.
LIVE_REFRESH_S = 1.0
SESSION_PARAM = "session"


# -- the store and its errors --------------------------------------------------------------


@contextmanager
def store(path: Path) -> Iterator[SessionStore]:
    """The store, open for one render. A missing, corrupt or foreign store, or an unknown
    session, ends the render with a page that says what is wrong and where. Opened to read:
    a store that cannot be written (mounted read-only, an archive) is shown as any other,
    and what would write to it (an approval's decision) says it cannot."""
    try:
        opened = SessionStore(path, create=False, access="read")
    except SessionError as exc:
        _error_page(path, exc)
    try:
        yield opened
    except SessionError as exc:
        _error_page(path, exc)
    finally:
        opened.close()


def _error_page(path: Path, exc: SessionError) -> NoReturn:
    if isinstance(exc, SessionNotFound):
        st.title("No such session")
        st.error(str(exc))
        st.markdown(f"Store: `{path}`")
        if st.button("← All sessions", key="error_back"):
            st.query_params.clear()
            st.rerun()
    else:
        st.title("Cannot open the session store")
        st.error(str(exc))
        st.markdown(f"Store: `{path}`")
        if not path.exists():
            hint = (
                "Nothing is recorded there yet. Record a session with "
                f"`pantheon run scenarios/support_email.yaml --store {path}`, or start the "
                "dashboard with `--store` naming an existing store."
            )
        elif isinstance(exc, SchemaVersionError):
            hint = "The store was written by another version of Pantheon."
        elif isinstance(exc, StoreReadOnly):
            hint = "The store is read-only: the message says what it would need to write."
        else:
            hint = (
                "The file exists but is not a Pantheon session store, or it is damaged. "
                "Start the dashboard with `--store` naming the right file."
            )
        st.info(hint)
    st.stop()


def open_session(session_id: str) -> None:
    """Navigate to a session's page."""
    st.query_params[SESSION_PARAM] = session_id
    st.rerun(scope="app")


#: How every table writes a cost: six decimals, since one call is usually under a cent.
USD_COLUMN = st.column_config.NumberColumn(
    format="$%.6f", help="From the scenario's prices (USD per million tokens)"
)


def cost_of(usage: AgentUsage) -> float | None:
    """What to show as a cost: None (blank) when no call had a price, rather than a $0
    that looks like free."""
    if usage.calls and not usage.priced and not usage.cost_usd:
        return None
    return usage.cost_usd


def when(ts: float | None) -> str:
    if ts is None:
        return "-"
    return _dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S")


# -- the sessions list -----------------------------------------------------------------------


def _is_bad(row: readmodel.SessionRow) -> bool:
    return row.status in ("failed", "aborted") or row.passed is False


def _mark(row: readmodel.SessionRow) -> str:
    if row.status == "running":
        return "● running"
    if _is_bad(row):
        if row.status != "completed":
            return "✖ " + row.status
        # A completed redrive where entries failed again says how many, not "completed".
        return "✖ " + row.note if row.kind == "redrive" and row.note else "✖ diverged"
    if row.kind == "redrive" and row.note:
        return "✔ " + row.note
    return "✔ " + row.status


def _frame(rows: list[readmodel.SessionRow]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "": _mark(r),
                "id": r.id,
                "kind": r.kind,
                "scenario": r.scenario or "-",
                "started": when(r.started),
                "duration (s)": r.duration_s,
                "messages": r.messages,
                "dead letters": r.dead_letters,
                "tokens": r.usage.total_tokens,
                "cost (USD)": cost_of(r.usage),
                "failed expectations": ", ".join(r.failed_expectations),
                "replay of": r.replay_of or "",
                "note": r.note or "",
            }
            for r in rows
        ],
        columns=[
            "",
            "id",
            "kind",
            "scenario",
            "started",
            "duration (s)",
            "messages",
            "dead letters",
            "tokens",
            "cost (USD)",
            "failed expectations",
            "replay of",
            "note",
        ],
    )


def _highlight(row: pd.Series[Any]) -> list[str]:
    mark = str(row.iloc[0])
    colour = ""
    if mark.startswith("✖"):
        colour = "background-color: #ffcdd2; color: #7f0000"
    elif mark.startswith("●"):
        colour = "background-color: #e3f2fd"
    return [colour] * len(row)


def sessions_page(path: Path) -> None:
    with store(path) as st_:
        running = any(r.status == "running" for r in readmodel.session_rows(st_))
    if running:
        st.fragment(run_every=LIVE_REFRESH_S)(_sessions_body)(path)
    else:
        _sessions_body(path)


def _sessions_body(path: Path) -> None:
    with store(path) as st_:
        rows = readmodel.session_rows(st_)
    st.title("Pantheon sessions")
    st.caption(f"Store: {path}")
    if not rows:
        st.info(
            "No sessions in this store yet. Record one with "
            f"`pantheon run scenarios/support_email.yaml --store {path}`."
        )
        return
    bad = [r for r in rows if _is_bad(r)]
    c = st.columns(4)
    c[0].metric("sessions", len(rows))
    c[1].metric("failed", len(bad))
    c[2].metric("running", sum(r.status == "running" for r in rows))
    c[3].metric("dead letters", sum(r.dead_letters for r in rows))

    f = st.columns([2, 2, 2, 3])
    statuses = f[0].multiselect("Status", sorted({r.status for r in rows}), key="f_status")
    scenarios = f[1].multiselect(
        "Scenario", sorted({r.scenario or "-" for r in rows}), key="f_scenario"
    )
    kinds = f[2].multiselect("Kind", sorted({r.kind for r in rows}), key="f_kind")
    search = f[3].text_input("Search by id", key="f_search").strip()
    shown = [
        r
        for r in rows
        if (not statuses or r.status in statuses)
        and (not scenarios or (r.scenario or "-") in scenarios)
        and (not kinds or r.kind in kinds)
        and (not search or search in r.id)
    ]
    if bad:
        st.error(
            f"{len(bad)} session(s) failed or diverged: "
            + ", ".join(f"{r.id} ({r.scenario or r.kind})" for r in bad[:5])
            + (" …" if len(bad) > 5 else "")
        )
    st.markdown(f"**{len(shown)} of {len(rows)} sessions**")
    if not shown:
        st.info("No session matches these filters.")
        return
    event = st.dataframe(
        _frame(shown).style.apply(_highlight, axis=1),
        hide_index=True,
        on_select="rerun",
        selection_mode="single-row",
        key="sessions_table",
        column_config={
            "duration (s)": st.column_config.NumberColumn(format="%.2f"),
            "tokens": st.column_config.NumberColumn(
                format="localized", help="Model tokens, in and out"
            ),
            "cost (USD)": USD_COLUMN,
            "failed expectations": st.column_config.TextColumn(width="medium"),
        },
    )
    picked = getattr(getattr(event, "selection", None), "rows", None)
    if picked:
        open_session(shown[picked[0]].id)
    ids = [r.id for r in shown]
    by_id = {r.id: r for r in shown}
    first_bad = next((i for i, r in enumerate(shown) if _is_bad(r)), 0)
    o = st.columns([4, 1])
    choice = o[0].selectbox(
        "Open a session",
        ids,
        index=first_bad,
        format_func=lambda i: f"{i} · {_mark(by_id[i])} · {by_id[i].scenario or by_id[i].kind}",
        key="open_choice",
    )
    o[1].write("")  # aligns the button with the select box
    if o[1].button("Open session", type="primary", key="open_session"):
        open_session(choice)
