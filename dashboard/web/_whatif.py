"""The session page's "Try a change" form: a what-if replay of the session through its
team changed by an overlay, and the decisions that moved.

The overlay is validated here first (milliseconds), so a mistake is shown at its line and
column before anything runs; the replay itself runs as ``pantheon replay SESSION --with -
--json`` in a subprocess, like the page's exact replays, which keeps its event loop and
team out of the Streamlit server. A what-if session's own page shows what it changed
against the session it was forked from.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pandas as pd
import streamlit as st
import yaml

from dashboard.web._app import open_session, store
from dashboard.web._jobs import cli_command
from pantheon.rerun import apply_overlay, diff_outcomes
from pantheon.scenario import ScenarioError
from pantheon.sessions import SessionInfo

__all__ = ["WHATIF_TIMEOUT", "default_overlay", "whatif_panel"]

#: How long a what-if replay may take before the page gives up on it (the process is
#: killed): the support team's 600 emails take about two seconds.
WHATIF_TIMEOUT = 300.0

_HINT = (
    "# Changes merged over the recorded scenario (docs/what-if.md): mappings merge key by\n"
    "# key, lists replace; agents: by name (enabled: false removes one), add_agents: new.\n"
)


def default_overlay(info: SessionInfo) -> str:
    """The form's starting text: the recorded ``policy`` section, ready to edit (replayed
    as it is, it changes nothing), or ``{}`` when the scenario has none."""
    try:
        recorded = yaml.safe_load(info.scenario_text or "")
    except yaml.YAMLError:
        recorded = None
    policy = recorded.get("policy") if isinstance(recorded, dict) else None
    if isinstance(policy, dict) and policy:
        return _HINT + yaml.safe_dump({"policy": policy}, sort_keys=False)
    return _HINT + "{}\n"


def _result_key(info: SessionInfo) -> str:
    return f"whatif_result_{info.id}"


def whatif_panel(path: Path, info: SessionInfo) -> None:
    """What a what-if session changed (on its own page), and the form to try a change."""
    if info.forked_from:
        _forked(path, info)
    if not info.scenario_text:
        return
    with st.container(border=True):
        st.subheader("Try a change")
        st.caption(
            "Replays this session's recorded inputs through its team changed by an overlay "
            "(agent settings, rules, provider, policy, an agent added or removed). Effects "
            "are served from the record wherever the call is unchanged; the rest run live. "
            "The what-if is recorded as a new session."
        )
        # Keyed by session: the text typed on one session's page is not another's overlay.
        text = st.text_area(
            "Overlay (YAML)",
            value=default_overlay(info),
            height=180,
            key=f"whatif_overlay_{info.id}",
        )
        if st.button("Run what-if", type="primary", key="whatif_run"):
            st.session_state[_result_key(info)] = _run(path, info, text)
        result = st.session_state.get(_result_key(info))
        if result is not None:
            _show(result)


def _run(path: Path, info: SessionInfo, text: str) -> dict[str, Any]:
    """Validate, then run the CLI; ``{"error": ...}`` or ``{"report": ...}``."""
    assert info.scenario_text is not None
    base = None if info.scenario_dir is None else Path(info.scenario_dir)
    try:
        apply_overlay(info.scenario_text, text, source="overlay", base_dir=base)
    except ScenarioError as exc:
        return {"error": str(exc), "invalid": True}
    args = ["replay", info.id, "--with", "-", "--store", str(path), "--json"]
    try:
        with st.spinner(f"Replaying {info.id} through the changed team ..."):
            done = subprocess.run(
                cli_command(*args),
                input=text,
                capture_output=True,
                text=True,
                timeout=WHATIF_TIMEOUT,
                check=False,
            )
    except subprocess.TimeoutExpired:
        return {"error": f"the what-if replay took over {WHATIF_TIMEOUT:.0f} s"}
    # 0: the changed team meets its expectations, 1: it does not; both print the report.
    if done.returncode in (0, 1):
        try:
            return {"report": json.loads(done.stdout)}
        except json.JSONDecodeError:
            pass
    tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-20:])
    return {"error": tail or f"pantheon replay --with exited with code {done.returncode}"}


def _show(result: dict[str, Any]) -> None:
    if "error" in result:
        title = "The overlay is not valid" if result.get("invalid") else "The what-if failed"
        st.error(f"{title}:\n\n```\n{result['error']}\n```")
        return
    report = result["report"]
    new = report["new_session_id"]
    decisions = report["decisions"]
    accurate = report.get("accuracy_passed")
    verdict = "" if accurate is None else (" · meets" if accurate else " · misses")
    if accurate is not None:
        verdict += " " + ", ".join(report["min_accuracy"]).replace(">=", "≥")
    failed = [e["name"] for e in report.get("expectations", ()) if not e["passed"]]
    if failed:
        verdict += f" · expectations failed: {', '.join(failed)}"
    message = f"What-if recorded as {new}: {decisions['headline']}{verdict}"
    (st.success if report.get("passed") else st.warning)(message)
    c = st.columns(4)
    c[0].metric("changed", decisions["changed"])
    _accuracy(c[1], c[2], decisions)
    c[3].metric("effects live / served", f"{report['effects_called']} / {report['effects_served']}")
    _groups(decisions)
    if st.button(f"Open the what-if session {new}", key="whatif_open"):
        open_session(new)


def _accuracy(before: Any, after: Any, decisions: dict[str, Any]) -> None:
    a, b = decisions.get("accuracy_a"), decisions.get("accuracy_b")
    before.metric("accuracy before", "-" if a is None else f"{a:.3f}")
    delta = None if a is None or b is None else f"{b - a:+.3f}"
    after.metric("accuracy after", "-" if b is None else f"{b:.3f}", delta=delta)


def _groups(decisions: dict[str, Any]) -> None:
    if not decisions["groups"]:
        return
    rows = [
        {
            "before": g["before"],
            "after": g["after"],
            "count": len(g["items"]),
            "items": ", ".join(g["items"]),
        }
        for g in decisions["groups"]
    ]
    st.dataframe(
        pd.DataFrame(rows, columns=["before", "after", "count", "items"]),
        hide_index=True,
        width="stretch",
    )


def _forked(path: Path, info: SessionInfo) -> None:
    assert info.forked_from is not None
    with store(path) as s:
        decisions = diff_outcomes(s, info.forked_from, info.id).to_dict()
    overlay = (info.summary.get("whatif") or {}).get("overlay")
    with st.container(border=True):
        st.subheader(f"What-if of {info.forked_from}")
        st.markdown(decisions["headline"])
        c = st.columns(3)
        c[0].metric("changed", decisions["changed"])
        _accuracy(c[1], c[2], decisions)
        _groups(decisions)
        if isinstance(overlay, str):
            st.code(overlay, language="yaml")
        if st.button(f"Open the original session {info.forked_from}", key="open_forked_from"):
            open_session(info.forked_from)
