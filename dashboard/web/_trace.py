"""The session page's Trace tab: pick an item, read what the team did with it.

The same story ``pantheon trace SESSION ITEM`` prints, from the same functions
(:func:`pantheon.itemtrace.item_list`, :func:`~pantheon.itemtrace.item_trace`): each message
of the item's tree in a box (topic, who published it, who handled it, when), each handling's
effect calls below it as the CLI writes them (a model's text and the tool calls it asked
for, each tool's answer, an approval's decider), and the item's outcome. A finished
session's story is cached (its record no longer changes); a running one's is read anew.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import streamlit as st

from dashboard.web._app import store
from pantheon.itemtrace import ItemList, ItemRow, ItemTrace, compact, item_list, item_trace
from pantheon.sessions import SessionInfo

__all__ = ["trace_panel"]

#: Characters of a payload or an answer a line shows (the CLI's ``--full`` shows all).
LIMIT = 400


@st.cache_data(max_entries=64, show_spinner=False)
def _cached(fn: str, path: str, sid: str, key: tuple[Any, ...], *args: str) -> Any:
    with store(Path(path)) as s:
        return (item_list if fn == "list" else item_trace)(s, sid, *args)


def _read(path: Path, info: SessionInfo, fn: str, *args: str) -> Any:
    if info.status == "running":
        with store(path) as s:
            return (item_list if fn == "list" else item_trace)(s, info.id, *args)
    return _cached(fn, str(path), info.id, (info.status, info.ended), *args)


def _n(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _label(row: ItemRow) -> str:
    """``T-3 · none (expected refund) · 3 effect calls · 1 error``."""
    parts = [row.item, row.outcome or "no outcome"]
    if row.right is False:
        parts[-1] += f" (expected {row.expected})"
    parts.append(_n(row.effects, "effect call"))
    if row.errors:
        parts.append(_n(row.errors, "error"))
    if row.dead_letters:
        parts.append(_n(row.dead_letters, "dead letter"))
    return " · ".join(parts)


def trace_panel(path: Path, info: SessionInfo) -> None:
    """The item picker and the picked item's story."""
    items: ItemList = _read(path, info, "list")
    if not items.items:
        st.info(f"No {items.noun}s recorded yet (an item is named by its {items.key!r}).")
        return
    rows = {r.item: r for r in items.items}
    keys = list(rows)
    # The first item that went wrong, if any: what a user opens this tab to see.
    troubled = next(
        (i for i, r in enumerate(items.items) if r.errors or r.dead_letters or r.right is False),
        0,
    )
    picked = st.selectbox(
        f"{items.noun.capitalize()} ({len(keys)}, by {items.key})",
        keys,
        index=troubled,
        format_func=lambda k: _label(rows[k]),
        key=f"trace_pick_{info.id}",
    )
    story: ItemTrace = _read(path, info, "trace", picked)
    st.markdown(f"**{_md(story.head)}**")
    verdict = story.verdict
    if verdict is not None:
        show = st.success if story.right else st.error if story.right is False else st.info
        show(verdict)
    for m in story.messages:
        # Depth as an arrow per hop: boxes cannot be indented.
        with st.container(border=True):
            st.markdown(f"{'↳ ' * m.depth}+{m.t_ms:.1f} ms · **{_md(m.topic)}** · {_md(m.route)}")
            st.caption(_md(_cut(compact(m.payload))))
            for h in m.handlings:
                st.code("\n".join(h.lines(LIMIT)), language=None, wrap_lines=True)
    st.caption(f"In a terminal: `pantheon trace {story.session} {story.item or ''}`")


def _cut(text: str) -> str:
    return text if len(text) <= LIMIT else text[: LIMIT - 1] + "…"


def _md(text: str) -> str:
    """Plain text safe in Streamlit markdown (no emphasis, links or HTML from a payload)."""
    out = text
    for ch in "\\`*_{}[]<>#|~$":
        out = out.replace(ch, "\\" + ch)
    return out
