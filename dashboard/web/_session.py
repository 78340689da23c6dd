"""One session's page: header, replay, and tabs for throughput, latency, breakers, dead
letters, outcomes, requests, model usage and an item's trace."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st

from dashboard.web import _charts
from dashboard.web._app import LIVE_REFRESH_S, USD_COLUMN, cost_of, open_session, store, when
from dashboard.web._approvals import approvals_panel
from dashboard.web._jobs import JobRegistry, RedriveJob, ReplayJob, redrive_bound
from dashboard.web._trace import trace_panel
from dashboard.web._whatif import whatif_panel
from pantheon import readmodel
from pantheon.approvals import ApprovalBook, redrive_desk
from pantheon.rerun import incomplete_reason, left_out_inputs
from pantheon.rerun.resume import resume_refusal
from pantheon.runner import expectation_state
from pantheon.sessions import SessionDiff, SessionInfo, StoredEnvelope, diff_sessions

__all__ = ["session_page"]

#: How often the replay progress re-reads the store while a replay runs, and the redrive
#: status while a redrive runs.
REPLAY_POLL_S = 0.5
#: Requests listed at most (the picker and the table); the read model has them all.
MAX_REQUESTS = 5000
#: Hops shown on each side of the first divergence in the side-by-side view.
DIVERGENCE_WINDOW = 8
#: Model calls per page of the calls table, and how many of the slowest are listed apart.
CALLS_PAGE = 100
SLOWEST_CALLS = 10


@st.cache_resource
def _registry() -> JobRegistry:
    """One job registry per server: a replay or redrive started in one tab shows in every
    tab."""
    return JobRegistry()


def _cache_key(info: SessionInfo) -> tuple[str, float | None]:
    # A finished session's record no longer changes (dead letters' "redriven" flag aside,
    # which is never cached); a running one is never cached.
    return (info.status, info.ended)


@st.cache_data(max_entries=64, show_spinner=False)
def _cached(name: str, path: str, sid: str, key: tuple[Any, ...], **kw: Any) -> Any:
    with store(Path(path)) as s:
        return getattr(readmodel, name)(s, sid, **kw)


def _model(path: Path, info: SessionInfo, name: str, **kw: Any) -> Any:
    if info.status == "running":
        with store(path) as s:
            return getattr(readmodel, name)(s, info.id, **kw)
    return _cached(name, str(path), info.id, _cache_key(info), **kw)


def session_page(path: Path, ref: str) -> None:
    with store(path) as s:
        info = s.session(ref)
    if st.button("← All sessions", key="back"):
        st.query_params.clear()
        st.rerun()
    if info.status == "running":
        st.fragment(run_every=LIVE_REFRESH_S)(_session_body)(path, info.id, live=True)
    else:
        _session_body(path, info.id, live=False)


def _session_body(path: Path, sid: str, *, live: bool) -> None:
    with store(path) as s:
        info = s.session(sid)
        row = readmodel.session_row(s, sid)
    if live and info.status != "running":
        st.rerun(scope="app")  # it just ended: render it once more as a finished session
    _header(path, info, row)
    _nodes(path, info)
    approvals_panel(path, info)
    if info.kind != "replay" and info.status != "running":
        _replay_panel(path, info, row)
        whatif_panel(path, info)
    tabs = st.tabs(
        [
            "Throughput",
            "Latency",
            "Breakers",
            f"Dead letters ({row.dead_letters})",
            "Outcomes",
            "Requests",
            f"Model usage ({row.usage.calls})",
            "Trace",
        ]
    )
    with tabs[0]:
        _throughput(path, info, row)
    with tabs[1]:
        _latency(path, info)
    with tabs[2]:
        _breakers(path, info, row)
    with tabs[3]:
        _dead_letters(path, info)
    with tabs[4]:
        _outcomes(path, info)
    with tabs[5]:
        _requests(path, info)
    with tabs[6]:
        _usage(path, info)
    with tabs[7]:
        trace_panel(path, info)


# -- header -----------------------------------------------------------------------------------

_STATUS_COLOUR = {"completed": "green", "failed": "red", "aborted": "orange", "running": "blue"}


def _header(path: Path, info: SessionInfo, row: readmodel.SessionRow) -> None:
    colour = _STATUS_COLOUR.get(info.status, "gray")
    status = info.status
    if info.kind == "redrive" and info.status == "completed" and row.note:
        # "completed" would hide entries that failed again: say how the redrive went.
        status = row.note
        colour = "green" if row.passed else "red"
    st.title(f"Session {info.id}")
    st.markdown(
        f":{colour}-badge[{status}] &nbsp; {info.kind} of scenario "
        f"**{info.scenario or '-'}**, seed {info.seed}, started {when(info.started)}"
    )
    interrupted = info.summary.get("interrupted")
    resumed: SessionInfo | None = None
    if info.status == "aborted" and interrupted:
        # Not a crash: a Ctrl-C stopped the input and the run finished what was in flight.
        resumed = _resumed_by(path, info)
        st.caption(
            f"Interrupted ({interrupted}): its input was stopped and what was in flight "
            f"finished; the record is whole. {_resume_hint(path, info, resumed, 'the input')}"
        )
    elif info.status == "aborted":
        # Its process died (or a second Ctrl-C stopped it at once): the record stops where
        # it did, and what finishes the run, if anything, is what `pantheon resume` says.
        resumed = _resumed_by(path, info)
        cause = (incomplete_reason(info) or "aborted").removeprefix("aborted: ")
        st.caption(
            f"Aborted: {cause}; the record stops there. "
            f"{_resume_hint(path, info, resumed, 'the run')}"
        )
    c = st.columns(5)
    c[0].metric("status", status)
    c[1].metric("duration (s)", "running" if row.duration_s is None else f"{row.duration_s:.2f}")
    c[2].metric("messages", row.messages)
    c[3].metric("dead letters", row.dead_letters)
    verdict = {True: "passed", False: "failed", None: "-"}[row.passed]
    listed = info.summary.get("expectations")
    states = [expectation_state(e) for e in listed or () if isinstance(e, dict)]
    unjudged = None if info.kind == "replay" else readmodel.unjudged(info)
    why = None
    if unjudged is not None:
        # A run stopped early has no verdict: what its summary holds is of the part that
        # ran, which "passed" would pass off as the run's.
        verdict = "not judged"
        why = f"Not judged: {unjudged}, and expectations judge a whole run."
        if states:
            why += (
                f" On the part that ran: {states.count('passed')} passed, "
                f"{states.count('failed')} failed."
            )
    elif "inconclusive" in states and info.kind != "replay":
        verdict += f", {states.count('inconclusive')} inconclusive"
    c[4].metric("matched" if info.kind == "replay" else "expectations", verdict, help=why)
    u = row.usage
    if u.calls:
        m = st.columns(5)
        m[0].metric("model calls", f"{u.calls:,}")
        m[1].metric("tokens in", f"{u.input_tokens:,}")
        m[2].metric("tokens out", f"{u.output_tokens:,}")
        cost = cost_of(u)
        m[3].metric(
            "model cost",
            "-" if cost is None else readmodel.usd(cost) + ("" if u.priced else "*"),
            help=(
                "From the scenario's prices (USD per million tokens)."
                if u.priced
                else "* A model the calls used has no price: its tokens are not in the cost."
            ),
        )
    if row.failed_expectations:
        failed = "; ".join(f"`{e}`" for e in row.failed_expectations)
        if unjudged is None:
            st.error(f"Failed expectations: {failed}")
        else:
            st.warning(f"Failed on the part that ran ({unjudged}): {failed}")
    if row.note:
        st.warning(row.note)
    if info.replay_of and st.button(
        f"Open the original session {info.replay_of}", key="open_original"
    ):
        open_session(info.replay_of)
    if resumed is not None and st.button(
        f"Open the resuming session {resumed.id}", key="open_resumed"
    ):
        open_session(resumed.id)


def _resumed_by(path: Path, info: SessionInfo) -> SessionInfo | None:
    """The session that resumed ``info`` (``pantheon resume`` records it as a ``resume``
    whose ``replay_of`` is ``info``): the one that ran to its end or runs now, else the
    newest of those that stopped too (a later ``pantheon resume`` of ``info`` is refused
    only while one has not stopped). A resume that stopped and was resumed in turn is
    followed to the end of that chain: the last one says how the story ended."""
    with store(path) as s:
        sessions = s.sessions()
    found: SessionInfo | None = None
    seen = {info.id}
    while True:
        resumes = [r for r in sessions if r.kind == "resume" and r.replay_of == info.id]
        last = next((r for r in resumes if r.status != "aborted"), resumes[0] if resumes else None)
        if last is None or last.id in seen:
            return found
        found, info = last, last
        seen.add(last.id)
        if last.status != "aborted":
            return found


def _resume_hint(path: Path, info: SessionInfo, resumed: SessionInfo | None, what: str) -> str:
    """What finishes an aborted session's ``what`` (its input, or the run a crash cut
    short): ``pantheon resume``, or the session that did (or does) it, so nobody resumes a
    finished story a second time; or why ``pantheon resume`` refuses it (a ZeroMQ run whose
    driver died, a replay), as the command would say, rather than a command that fails."""
    if resumed is None or resumed.status == "aborted":
        last = info if resumed is None else resumed
        with store(path) as s:
            refused = resume_refusal(s, last)
        then = "" if resumed is None else f"It was resumed as {resumed.id}, which stopped too"
        if refused is not None:
            return (f"{then}; " if then else "") + f"`pantheon resume` refuses it: {refused}."
        command = f"`pantheon resume {last.id}` finishes {what}."
        return f"{then}: {command}" if then else command
    if resumed.status == "running":
        return f"It is being resumed as {resumed.id}, which finishes {what}."
    return f"It was resumed as {resumed.id} ({resumed.status}), which finished {what}."


def _nodes(path: Path, info: SessionInfo) -> None:
    """A multi-process session's processes, one line each: its agents, how it ended and
    where its journal ends (the lines ``pantheon sessions show`` prints); nothing for a
    single-process session."""
    nodes: tuple[readmodel.NodeView, ...] = _model(path, info, "nodes")
    if not nodes:
        return
    cut = [n.name for n in nodes if n.ended is False]
    title = f"**{len(nodes)} processes**" + (
        f": the journal of {', '.join(f'`{n}`' for n in cut)} stops early" if cut else ""
    )
    st.markdown(title)
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "node": n.name,
                    "agents": ", ".join(n.agents),
                    "ended": n.how,
                    "journal": n.journal,
                }
                for n in nodes
            ]
        ),
        hide_index=True,
        key="node_table",
    )


def _without_empty_node(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without its ``node`` column when no row has one (a single-process session
    looks as it always did)."""
    if "node" in frame.columns and frame["node"].isna().all():
        return frame.drop(columns=["node"])
    return frame


# -- replay -------------------------------------------------------------------------------


def _replay_panel(path: Path, info: SessionInfo, row: readmodel.SessionRow) -> None:
    registry = _registry()
    job = registry.latest(path, info.id)
    failed = row.passed is False or info.status in ("failed", "aborted")
    with st.container(border=True):
        st.subheader("Replay")
        st.caption(
            "Re-runs the session's inputs through the same team with every recorded effect "
            "served from the record, and compares it with the original hop by hop."
        )
        c = st.columns([2, 2, 5])
        live_effects = c[1].checkbox(
            "live effects",
            key="replay_live",
            help="Call effects for real instead of serving them from the record.",
        )
        busy = job is not None and job.state == "running"
        if c[0].button(
            "Replay this session",
            type="primary" if failed else "secondary",
            disabled=busy,
            key="replay_start",
        ):
            job = registry.start(path, info.id, live_effects=live_effects)
        if job is not None and job.state == "running":
            _replay_progress(path, info, row.messages, job)
            return
        if job is not None and job.state == "error":
            st.error(f"The replay failed to run: {job.error}")
        _pick_replay(path, info, job)


def _replay_progress(path: Path, info: SessionInfo, original: int, job: ReplayJob) -> None:
    @st.fragment(run_every=REPLAY_POLL_S)
    def progress() -> None:
        if job.state != "running":
            st.rerun(scope="app")
        with store(path) as s:
            mine = [
                r
                for r in s.sessions()
                if r.replay_of == info.id and r.kind == "replay" and r.started >= job.started - 1
            ]
            done = s.envelope_counts().get(mine[0].id, 0) if mine else 0
        st.progress(
            min(1.0, done / original) if original else 0.0,
            text=f"Replaying {info.id}: {done} of {original} messages",
        )

    progress()


def _pick_replay(path: Path, info: SessionInfo, job: ReplayJob | None) -> None:
    with store(path) as s:
        replays = [
            r
            for r in s.sessions()
            if r.replay_of == info.id and r.kind == "replay" and r.status != "running"
        ]
    if not replays:
        st.info("This session has not been replayed yet.")
        return
    ids = [r.id for r in replays]
    latest = job.new_session_id if job is not None else None
    chosen = st.selectbox(
        "Compare with replay",
        ids,
        index=ids.index(latest) if latest in ids else 0,
        key=f"replay_pick_{latest}",
    )
    _comparison(path, info.id, chosen)


def _hop_rows(envs: list[StoredEnvelope], lo: int, hi: int, mark: int | None) -> pd.DataFrame:
    rows = []
    for e in envs[lo:hi]:
        payload = json.dumps(e.payload, default=repr, sort_keys=True)
        rows.append(
            {
                "": "◀ first divergence" if e.id == mark else "",
                "seq": e.seq,
                "topic": e.topic,
                "from": e.source or readmodel.OUTSIDE,
                "payload": payload if len(payload) <= 120 else payload[:119] + "…",
            }
        )
    return pd.DataFrame(rows, columns=["", "seq", "topic", "from", "payload"])


def _divergent_style(row: pd.Series[Any]) -> list[str]:
    hit = bool(row.iloc[0])
    return ["background-color: #ffcdd2; font-weight: bold" if hit else ""] * len(row)


@dataclass(frozen=True, slots=True)
class _Comparison:
    """What the side-by-side view needs, computed once per (original, replay) pair: both
    are finished sessions, so it never changes (diffing costs a full read of both, and
    another of the original when a dead node's unfinished inputs are left out)."""

    diff: SessionDiff
    summary: dict[str, Any]
    messages_a: int
    messages_b: int
    window_a: pd.DataFrame
    window_b: pd.DataFrame


@st.cache_data(max_entries=16, show_spinner="Comparing the replay with the original …")
def _compare(path: str, original: str, replay: str) -> _Comparison:
    with store(Path(path)) as s:
        diff = diff_sessions(s, original, replay, left_out=left_out_inputs(s, original, replay))
        env_a, env_b = s.envelopes(original), s.envelopes(replay)
        summary = s.session(replay).summary.get("replay") or {}
    div = diff.divergence
    index_a = {e.id: i for i, e in enumerate(env_a)}
    index_b = {e.id: i for i, e in enumerate(env_b)}
    ia = index_a.get(div.original_id) if div is not None and div.original_id else None
    ib = index_b.get(div.replay_id) if div is not None and div.replay_id else None
    # Centre both windows on the divergence (on whichever side has it, if only one does).
    centre_a = ia if ia is not None else (ib or 0)
    centre_b = ib if ib is not None else centre_a
    span = 2 * DIVERGENCE_WINDOW + 1
    lo_a = max(0, centre_a - DIVERGENCE_WINDOW)
    lo_b = max(0, centre_b - DIVERGENCE_WINDOW)
    return _Comparison(
        diff,
        summary,
        len(env_a),
        len(env_b),
        _hop_rows(env_a, lo_a, lo_a + span, None if div is None else div.original_id),
        _hop_rows(env_b, lo_b, lo_b + span, None if div is None else div.replay_id),
    )


def _comparison(path: Path, original: str, replay: str) -> None:
    c = _compare(str(path), original, replay)
    diff, summary, div = c.diff, c.summary, c.diff.divergence
    left_out = (
        f" {diff.left_out} inputs a dead node left unfinished were not re-run, nor compared."
        if diff.left_out
        else ""
    )
    if div is None:
        st.success(
            f"Replay {replay} matched the original hop by hop: {diff.hops_compared} hops "
            f"compared ({diff.counts()}).{left_out}"
        )
    else:
        st.error(
            f"Replay {replay} diverged from the original after {diff.hops_compared} matching "
            f"hops.{left_out}"
        )
        st.markdown(
            f"**First divergence**: agent `{div.agent}`, topic `{div.topic}`, field "
            f"`{div.field}` ({div.where()}); highlighted in both columns below."
            + (f"\n\n{div.hint}" if div.hint else "")
        )
        if div.diff:
            st.code(div.diff, language="diff")
        with st.expander("The whole divergence"):
            st.code(str(div), language="text")
    failures = summary.get("failures") or []
    if failures:
        st.markdown(
            f"**{len(failures)} recorded failure(s) reproduced at the same hop** "
            f"(effects served {summary.get('effects_served', 0)}, called "
            f"{summary.get('effects_called', 0)})."
        )
    left, right = st.columns(2)
    for col, side, title, total, frame in (
        (left, "original", f"Original {original}", c.messages_a, c.window_a),
        (right, "replay", f"Replay {replay}", c.messages_b, c.window_b),
    ):
        with col:
            st.markdown(f"**{title}** ({total} recorded messages)")
            st.dataframe(
                frame.style.apply(_divergent_style, axis=1), hide_index=True, key=f"side_{side}"
            )
    if diff.latency:
        st.altair_chart(
            _charts.latency_delta_chart(diff.latency, original, replay), width="stretch"
        )


# -- tabs ---------------------------------------------------------------------------------------


def _bucket_for(duration_s: float | None) -> float:
    """About 100 buckets over the run, at least 10 ms."""
    if not duration_s:
        return 0.1
    for b in (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 30.0, 60.0):
        if duration_s / b <= 150:
            return b
    return 60.0


def _throughput(path: Path, info: SessionInfo, row: readmodel.SessionRow) -> None:
    bucket = _bucket_for(row.duration_s)
    points = _model(path, info, "throughput", bucket_s=bucket)
    if not points:
        st.info("No messages recorded yet.")
        return
    st.caption(f"Messages per second in {bucket * 1000:.0f} ms buckets.")
    left, right = st.columns(2)
    left.altair_chart(_charts.throughput_chart(points, "topic"), width="stretch")
    right.altair_chart(_charts.throughput_chart(points, "agent"), width="stretch")


def _latency(path: Path, info: SessionInfo) -> None:
    hops: list[readmodel.HopLatency] = _model(path, info, "hop_latency")
    if not hops:
        st.info("No deliveries recorded yet.")
        return
    q = st.radio("Quantile", ["p50", "p95", "p99"], index=2, horizontal=True, key="lat_q")
    left, right = st.columns(2)
    left.altair_chart(_charts.latency_chart(hops, "agent", q), width="stretch")
    right.altair_chart(_charts.latency_chart(hops, "edge", q), width="stretch")
    ms = st.column_config.NumberColumn(format="%.3f")
    st.dataframe(
        pd.DataFrame([asdict(h) for h in hops]),
        hide_index=True,
        key="latency_table",
        column_config={
            k: ms
            for k in (
                "wait_p50_ms",
                "wait_p95_ms",
                "wait_p99_ms",
                "handle_p50_ms",
                "handle_p95_ms",
                "handle_p99_ms",
            )
        },
    )


def _breakers(path: Path, info: SessionInfo, row: readmodel.SessionRow) -> None:
    events: list[readmodel.BreakerEvent] = _model(path, info, "breaker_timeline")
    if not events:
        st.success("No circuit breaker changed state in this session: every one stayed closed.")
        return
    end = max([e.t_s for e in events] + [row.duration_s or 0.0])
    st.markdown(f"**{len(events)} breaker transition(s)**")
    st.altair_chart(_charts.breaker_chart(events, end), width="stretch")
    st.dataframe(
        _without_empty_node(
            pd.DataFrame(
                [
                    {
                        "t_s": e.t_s,
                        "name": e.name,
                        "old": e.old,
                        "new": e.new,
                        "reason": e.reason,
                        "node": e.node,
                    }
                    for e in events
                ]
            )
        ),
        hide_index=True,
        key="breaker_table",
    )


def _dead_letters(path: Path, info: SessionInfo) -> None:
    with store(path) as s:
        letters = readmodel.dead_letters(s, info.id)
    job = _registry().latest_redrive(path, info.id)
    redriving = job is not None and job.state == "running"
    if job is not None:
        _redrive_status(path, info, job)
    if not letters:
        st.success("No dead letters in this session.")
        return
    pending = [d for d in letters if not d.redriven]
    st.markdown(f"**{len(letters)} dead letter(s)**, {len(pending)} not redriven")
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "entry": d.entry_id,
                    "subscriber": d.subscriber,
                    "node": d.node,
                    "topic": d.topic,
                    "reason": d.reason,
                    "error": f"{d.error_type}: {d.error}" if d.error_type else (d.error or ""),
                    "attempts": d.attempts,
                    "t (s)": d.t_s,
                    "redriven": d.redriven_by or ("yes" if d.redriven else ""),
                }
                for d in letters
            ]
        ).pipe(_without_empty_node),
        hide_index=True,
        key="dlq_table",
        column_config={"t (s)": st.column_config.NumberColumn(format="%.3f")},
    )
    by_entry = {d.entry_id: d for d in letters}
    entry = st.selectbox(
        "Dead letter",
        list(by_entry),
        format_func=lambda i: (
            f"#{i} {by_entry[i].subscriber} on {by_entry[i].topic}: "
            f"{by_entry[i].error_type or by_entry[i].reason}"
        ),
        key="dlq_pick",
    )
    d = by_entry[entry]
    running = info.status == "running"
    c = st.columns([2, 3, 5])
    if c[0].button(
        f"Redrive entry {d.entry_id}",
        key="redrive_one",
        disabled=running or redriving or d.redriven,
    ):
        _redrive(path, info, d.entry_id, 1)
    if c[1].button(
        f"Redrive all {len(pending)} not redriven",
        key="redrive_all",
        disabled=running or redriving or not pending,
    ):
        _redrive(path, info, None, len(pending))
    if running:
        st.caption("A running session's dead letters are redriven by the process running it.")
    elif redriving:
        st.caption("One redrive of a session at a time: this one's is still running.")
    st.markdown(f"**Error:** `{d.error_type or d.reason}: {d.error or ''}`")
    left, right = st.columns(2)
    with left:
        st.markdown("**Payload**")
        if d.payload is None:
            st.caption("The failing envelope is not in the store.")
        else:
            st.json(d.payload, expanded=True)
    with right:
        st.markdown("**Traceback**")
        st.code(d.traceback or "(no traceback: the message never reached the handler)", "text")
    if d.correlation_id is not None and st.button(
        "Show this request's waterfall", key="dlq_waterfall"
    ):
        st.session_state["req_pick_value"] = d.correlation_id


def _redrive(path: Path, info: SessionInfo, entry: int | None, entries: int) -> None:
    """Start ``pantheon dlq redrive`` in the background and show it: the page must stay
    usable while it runs, since its team may wait for a person deciding on this page."""
    _, approval_wait = redrive_desk(info, path)
    bound = redrive_bound(entries, approval_wait)
    _registry().start_redrive(path, info.id, entry, bound=bound)
    st.rerun(scope="app")


def _redrive_session(path: Path, info: SessionInfo, job: RedriveJob) -> SessionInfo | None:
    """The session the running redrive records into, once it has begun one: the redrive of
    ``info`` its process records (another redrive may have started in the same second)."""
    pid = job.process.pid
    with store(path) as s:
        return next(
            (
                r
                for r in s.sessions()
                if r.kind == "redrive" and r.replay_of == info.id and r.pid == pid
            ),
            None,
        )


def _redrive_status(path: Path, info: SessionInfo, job: RedriveJob) -> None:
    """A running redrive, polled until it ends (with the approval requests it waits on,
    decidable here), or how the last one ended."""
    if job.state == "running":
        _redrive_progress(path, info, job)
        return
    if job.report is None:
        st.error(f"Redrive failed: {job.error}")
        return
    report = job.report
    outcomes = report.get("outcomes", {})
    recorded = (
        f"Redrive recorded as {report.get('new_session_id')}: {readmodel.redrive_outcome(report)}"
    )
    if job.state == "redriven":
        st.success(recorded)
        return
    st.error(recorded)
    st.dataframe(
        pd.DataFrame([{"entry": int(k), "redrive outcome": v} for k, v in outcomes.items()]),
        hide_index=True,
        key="redrive_outcomes",
    )


def _redrive_progress(path: Path, info: SessionInfo, job: RedriveJob) -> None:
    @st.fragment(run_every=REPLAY_POLL_S)
    def progress() -> None:
        if job.state != "running":
            # The redrive marked entries redriven in this session's record: read it afresh.
            st.cache_data.clear()
            st.rerun(scope="app")
        what = "every dead letter not redriven" if job.entry is None else f"entry {job.entry}"
        text = f"Redriving {what} through `pantheon dlq redrive`"
        new = _redrive_session(path, info, job)
        if new is None:
            st.info(f"{text}: starting …")
            return
        with store(path) as s:
            waiting = ApprovalBook(s).entries(new.id, status="pending")
        text += f", recorded as {new.id}, running for {time.time() - job.started:.0f} s"
        if not waiting:
            st.info(f"{text}.")
            return
        st.warning(
            f"{text}: it waits for a person, {len(waiting)} approval request(s) pending. "
            "Decide them here or on the redrive's page; each is decided by itself "
            "(its default) at its deadline."
        )
        if st.button(f"Open the redrive session {new.id}", key="redrive_open"):
            open_session(new.id)
        approvals_panel(path, new)

    progress()


#: A check's state as a mark and a row colour: inconclusive (a timing bound a busy machine
#: may have broken) is neither the pass nor the fail colour.
_STATE_MARK = {"passed": "✔", "failed": "✖", "inconclusive": "?"}
_STATE_BACKGROUND = {
    "failed": "background-color: #ffcdd2",
    "inconclusive": "background-color: #fff9c4",
}


def _outcomes(path: Path, info: SessionInfo) -> None:
    out: readmodel.Outcomes = _model(path, info, "outcomes")
    acc = out.accuracy
    c = st.columns(4)
    # The team's own decision fields first (the summary's order), then what its Learner
    # adds: two of them fit beside the counts.
    rates = [(k.removesuffix("_accuracy"), v) for k, v in acc.items() if k.endswith("_accuracy")]
    shown = (rates or [("all fields", acc.get("accuracy"))])[:2]
    for col, (name, value) in zip(c[:2], shown, strict=False):
        col.metric(f"{name} accuracy", "-" if value is None else f"{value:.1%}")
    c[2].metric("labelled outcomes", acc.get("scored", "-"))
    c[3].metric("guardian decisions", len(out.guardian))
    if out.expectations:
        st.markdown("**Expectations**")
        states = [expectation_state(e) for e in out.expectations]
        exp = pd.DataFrame(
            [
                {
                    "": _STATE_MARK[state],
                    "state": state,
                    "expectation": e.get("name"),
                    "expected": str(e.get("expected")),
                    "actual": str(e.get("actual")),
                    "why": str(e.get("why") or ""),
                }
                for e, state in zip(out.expectations, states, strict=True)
            ]
        )
        st.dataframe(
            exp.style.apply(
                lambda r: [_STATE_BACKGROUND.get(r.iloc[1], "")] * len(r),
                axis=1,
            ),
            hide_index=True,
            key="expectations_table",
        )
        for e, state in zip(out.expectations, states, strict=True):
            if state == "failed":
                st.error(f"✖ `{e.get('name')}`: actual `{e.get('actual')}`")
            elif state == "inconclusive":
                st.warning(
                    f"? `{e.get('name')}`: actual `{e.get('actual')}`, inconclusive: {e.get('why')}"
                )
    if not out.guardian:
        st.info("No Guardian decisions in this session.")
        return
    left, right = st.columns([1, 2])
    left.altair_chart(_charts.verdicts_chart(out.decisions), width="stretch")
    with right:
        verdicts = st.multiselect(
            "Verdicts", sorted(out.decisions), default=sorted(out.decisions), key="g_verdicts"
        )
        st.dataframe(
            pd.DataFrame(
                [
                    {
                        out.noun: g.item,
                        "verdict": g.verdict,
                        "action": g.action,
                        "intent": g.intent,
                        "confidence": g.confidence,
                        "reasons": "; ".join(g.reasons),
                    }
                    for g in out.guardian
                    if g.verdict in verdicts
                ]
            ),
            hide_index=True,
            key="guardian_table",
        )


def _requests(path: Path, info: SessionInfo) -> None:
    rows: list[readmodel.RequestRow] = _model(path, info, "requests", limit=MAX_REQUESTS)
    if not rows:
        st.info("No requests recorded yet.")
        return
    counts = pd.Series([r.outcome for r in rows]).value_counts().to_dict()
    st.markdown(
        f"**{len(rows)} request(s)**: "
        + ", ".join(f"{n} {outcome}" for outcome, n in sorted(counts.items()))
    )
    by_id = {r.correlation_id: r for r in rows}
    ids = list(by_id)
    wanted = st.session_state.get("req_pick_value")
    default = (
        ids.index(wanted)
        if wanted in by_id
        else next((i for i, r in enumerate(rows) if r.outcome != "ok"), 0)
    )
    cid = st.selectbox(
        "Request",
        ids,
        index=default,
        format_func=lambda c: (
            f"{by_id[c].label or by_id[c].topic} · {by_id[c].outcome} · "
            f"{by_id[c].hops} hops · {by_id[c].total_ms:.1f} ms"
        ),
        key=f"req_pick_{wanted}",
    )
    req = by_id[cid]
    bars: list[readmodel.HopBar] = _model(path, info, "waterfall", correlation_id=cid)
    st.markdown(
        f"**{req.label or req.topic}**: {req.outcome}, {req.hops} hops, "
        f"{req.total_ms:.2f} ms from the first publish to the last handling"
    )
    if bars:
        st.altair_chart(_charts.waterfall_chart(bars, req.start_ms), width="stretch")
        st.dataframe(
            pd.DataFrame([asdict(b) for b in bars])
            .drop(columns=["envelope_id", "causation_id"])
            .pipe(_without_empty_node),
            hide_index=True,
            key="waterfall_table",
        )
    else:
        st.info("No handling of this request is recorded yet.")
    with st.expander("All requests"):
        st.dataframe(
            pd.DataFrame([asdict(r) for r in rows]).astype({"correlation_id": str}),
            hide_index=True,
            key="requests_table",
        )


#: How the usage tables write counts (thousands separated) and the columns of a call.
_COUNT = st.column_config.NumberColumn(format="localized")
_CALL_COLUMNS: dict[str, Any] = {
    "column_config": {
        "tokens in": _COUNT,
        "tokens out": _COUNT,
        "cost (USD)": USD_COLUMN,
        "latency (ms)": st.column_config.NumberColumn(format="%.1f"),
        "start (s)": st.column_config.NumberColumn(format="%.3f"),
    }
}


def _budget(path: Path, info: SessionInfo) -> None:
    """One line per budget scope: spent of its limits, and whether it stopped calls."""
    for b in _model(path, info, "budget"):
        spent = []
        if b.limit_tokens is not None:
            spent.append(f"{b.tokens:,} of {b.limit_tokens:,} tokens")
        if b.limit_cost_usd is not None:
            spent.append(f"{readmodel.usd(b.cost_usd)} of {readmodel.usd(b.limit_cost_usd)}")
        verdict = (
            f":red-badge[stopped] {b.refused:,} call(s) refused"
            if b.stopped
            else ":green-badge[within budget]"
        )
        st.markdown(f"**Budget {b.scope}**: {', '.join(spent)} {verdict}")


def _usage(path: Path, info: SessionInfo) -> None:
    usage: readmodel.SessionUsage = _model(path, info, "usage")
    _budget(path, info)
    if not usage.total.calls:
        st.info("No model calls recorded in this session.")
        return
    t = usage.total
    if t.priced:
        cost = readmodel.usd(t.cost_usd)
    elif t.cost_usd:
        cost = f"{readmodel.usd(t.cost_usd)} for the priced ones (a model they used has no price)"
    else:  # "$0 for the priced ones" read as free, when nothing had a price
        cost = "no cost known: the scenario's prices name none of its models"
    st.markdown(
        f"**{t.calls:,} model call(s)**: {t.input_tokens:,} tokens in, {t.output_tokens:,} "
        f"out, {cost}"
    )
    st.dataframe(
        pd.DataFrame(
            [
                {
                    "agent": name,
                    "calls": u.calls,
                    "tokens in": u.input_tokens,
                    "tokens out": u.output_tokens,
                    "cost (USD)": cost_of(u),
                    "priced": u.priced,
                }
                for name, u in usage.by_agent.items()
            ]
        ),
        hide_index=True,
        key="usage_agents",
        column_config={
            "calls": _COUNT,
            "tokens in": _COUNT,
            "tokens out": _COUNT,
            "cost (USD)": USD_COLUMN,
        },
    )
    slowest = sorted(usage.calls, key=lambda c: (-c.latency_ms, c.seq))[:SLOWEST_CALLS]
    st.markdown(f"**The {len(slowest)} slowest call(s)**")
    st.dataframe(_calls_frame(slowest), hide_index=True, key="usage_slowest", **_CALL_COLUMNS)
    pages = max(1, -(-len(usage.calls) // CALLS_PAGE))
    st.markdown(f"**Every call**, in the order recorded ({CALLS_PAGE} a page)")
    page = int(
        st.number_input("Page", min_value=1, max_value=pages, value=1, step=1, key="usage_page")
    )
    start = (page - 1) * CALLS_PAGE
    shown = usage.calls[start : start + CALLS_PAGE]
    st.caption(f"Calls {start + 1}-{start + len(shown)} of {len(usage.calls)}")
    st.dataframe(_calls_frame(shown), hide_index=True, key="usage_calls", **_CALL_COLUMNS)


def _calls_frame(calls: Iterable[readmodel.ModelCall]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "agent": c.agent,
                "model": c.model,
                "tokens in": c.input_tokens,
                "tokens out": c.output_tokens,
                "cost (USD)": c.cost_usd,
                "latency (ms)": c.latency_ms,
                "start (s)": c.start_ms / 1000,
                "message": str(c.envelope_id),
            }
            for c in calls
        ],
        columns=[
            "agent",
            "model",
            "tokens in",
            "tokens out",
            "cost (USD)",
            "latency (ms)",
            "start (s)",
            "message",
        ],
    )
