"""What a re-run counts as its inputs: the original's Observer's, never the other outside
messages it feeds again (a Monitor's sampled alert). Real ``pantheon`` commands on the
expense-claims team, in one process, and a real SQLite store."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

from claims_team import CLAIMS, write_team
from cli_run import pantheon
from interrupting import run_and_interrupt

from pantheon.sessions import SessionStore

ALERT = "monitor.alert.dead_letters"


def run_json(tmp_path: Path, path: Path) -> dict[str, Any]:
    proc = pantheon("run", str(path), "--json", "--store", "s.db", cwd=tmp_path)
    assert proc.stdout.strip(), proc.stderr
    summary: dict[str, Any] = json.loads(proc.stdout)
    assert proc.returncode == (0 if summary["passed"] else 1), proc.stderr
    return summary


def roots(tmp_path: Path, session: str) -> Counter[str]:
    """The session's outside messages (no cause, no emitting agent), by topic."""
    with SessionStore(tmp_path / "s.db") as st:
        envelopes = st.envelopes(session)
    return Counter(e.topic for e in envelopes if e.causation_id is None and e.source is None)


def test_an_overlay_that_changes_nothing_passes_what_the_run_passed(tmp_path: Path) -> None:
    """The payer's failures are dead letters, which the Monitor's samples alert on: each
    alert is an outside message (no handling caused it), recorded, and fed again by a
    re-run so the team reacts to it as it did. The re-runs used to count it as an input:
    the what-if's summary said 41 inputs for the run's 40, its custom check failed
    ("actual 40 decided of 41") on an overlay that changes nothing, and the replay's
    header said 43 inputs for the run's 42."""
    path = write_team(tmp_path, concurrency=8)
    summary = run_json(tmp_path, path)
    assert summary["passed"] is True
    assert (summary["inputs"], summary["malformed"]) == (CLAIMS, 2)
    sid = summary["session_id"]
    fed = roots(tmp_path, sid)
    alerts = fed[ALERT]
    assert alerts == summary["alerts"] >= 1  # the Monitor saw the payer's dead letters
    (tmp_path / "noop.yaml").write_text("{}\n")

    proc = pantheon("replay", sid, "--with", "noop.yaml", "--store", "s.db", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    whatif = json.loads(proc.stdout)
    assert whatif["passed"] is True
    custom = {e["name"]: e for e in whatif["expectations"]}["custom: claims_agents:all_decided"]
    assert (custom["passed"], custom["actual"]) == (True, "passed")
    assert (whatif["inputs_replayed"], whatif["others_replayed"]) == (CLAIMS + 2, {ALERT: alerts})
    with SessionStore(tmp_path / "s.db") as st:
        stored = st.session(whatif["new_session_id"]).summary
    assert (stored["inputs"], stored["malformed"]) == (CLAIMS, 2)
    # Its Monitor samples nothing: the original's alerts were fed again, and only they.
    assert roots(tmp_path, whatif["new_session_id"])[ALERT] == alerts

    text = pantheon("replay", sid, "--with", "noop.yaml", "--store", "s.db", cwd=tmp_path)
    assert text.returncode == 0, text.stdout + text.stderr
    assert f": {CLAIMS + 2} inputs, effects served" in text.stdout
    assert f"fed again beside the inputs {alerts}: {ALERT} {alerts}" in text.stdout

    replay = pantheon("replay", sid, "--store", "s.db", "--json", cwd=tmp_path)
    assert replay.returncode == 0, replay.stdout + replay.stderr
    exact = json.loads(replay.stdout)
    assert exact["matched"] is True
    assert (exact["inputs_replayed"], exact["others_replayed"]) == (CLAIMS + 2, {ALERT: alerts})
    text = pantheon("replay", sid, "--store", "s.db", cwd=tmp_path)
    assert f"hops compared, {CLAIMS + 2} inputs (0 skipped)" in text.stdout


def test_resume_skips_only_the_inputs_the_run_had_published(tmp_path: Path) -> None:
    """Ctrl-C once the Monitor alerted: the session is ``aborted`` with that alert among
    its outside messages, and ``pantheon resume`` skips as many records of the source as
    the run had published. It used to count the alert too (its id carries no input
    number, so the count fell back to every outside message), skipped one claim more per
    alert, and those claims were never decided."""
    path = write_team(tmp_path, concurrency=8, rate=8)
    proc = run_and_interrupt(tmp_path, path, lambda: _alerted(tmp_path), "an alert")
    assert proc.returncode == 130, proc.stderr
    stopped = json.loads(proc.stdout)
    assert stopped["interrupted"] == "SIGINT"
    sid = stopped["session_id"]
    assert roots(tmp_path, sid)[ALERT] >= 1
    assert stopped["inputs"] + stopped["malformed"] < CLAIMS + 2  # stopped mid-way

    resumed = pantheon("resume", sid, "--store", "s.db", "--json", cwd=tmp_path, timeout=300)
    assert resumed.stdout.strip(), resumed.stderr
    whole = json.loads(resumed.stdout)
    assert (whole["inputs"], whole["malformed"]) == (CLAIMS, 2)
    recorded = whole["resume"]["inputs_replayed"]
    assert recorded == stopped["inputs"] + stopped["malformed"]
    with SessionStore(tmp_path / "s.db") as st:
        decided = {
            e.payload["id"] for e in st.envelopes(whole["session_id"]) if e.topic == "claim.decided"
        }
    assert decided == {f"C-{i:02d}" for i in range(CLAIMS)}
    assert whole["passed"] is True, whole["expectations"]


def _alerted(tmp_path: Path) -> bool:
    """Whether the running session recorded a Monitor's alert yet (its journal included)."""
    if not (tmp_path / "s.db").exists():
        return False
    try:
        with SessionStore(tmp_path / "s.db", access="read") as st:
            sessions = st.sessions()
            return bool(sessions) and any(e.topic == ALERT for e in st.envelopes(sessions[0].id))
    except Exception:  # the run is still creating the store: look again
        return False
