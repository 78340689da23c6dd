"""A ZeroMQ run's summary counts what its session recorded, a killed node's messages
included: real ``pantheon run`` processes (a broker and one process per node) on loopback."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from claims_team import CLAIMS, placed, run_killed, write_team
from cli_run import pantheon

from pantheon.sessions import SessionStore


def test_what_a_killed_node_published_counts_in_the_summary(tmp_path: Path) -> None:
    """The desk (the Approver's node) is SIGKILLed 2 s in, while its scripted person still
    has claims to approve one by one (a fifth of a second each at least, 20 of them). What
    it decided before is in the session: it shipped its journal as it went. The summary's
    per-topic counts and message total used to be the surviving processes' own counters,
    which died with the node: ``claim.decided`` 0, so the team's custom check said "0
    decided of 40" and ``topics: {claim.decided: {min: 1}}`` failed, while ``sessions
    show`` and ``export`` had them. Both are judged on the record's counts now."""
    path = write_team(tmp_path, transport=placed("zmq"), kill="desk, at: 2")
    code, summary = run_killed(tmp_path, path, "desk")
    assert list(summary["unverified"]) == ["desk"]

    sid = summary["session_id"]
    with SessionStore(tmp_path / "s.db") as st:
        recorded = Counter(e.topic for e in st.envelopes(sid))
        stored = st.session(sid).summary
        journals = st.node_journals(sid)
    assert not journals["desk"].ended  # its journal stops where it died
    decided = recorded["claim.decided"]
    assert 0 < decided < CLAIMS  # it died mid-way, after deciding some
    assert summary["topics"] == dict(sorted(recorded.items()))
    assert summary["messages"] == recorded.total()
    # The session keeps the same summary.
    assert (stored["topics"], stored["messages"]) == (summary["topics"], summary["messages"])

    checks = {e["name"]: e for e in summary["expectations"]}
    bound = checks["messages on claim.decided >= 1"]
    assert (bound["passed"], bound["actual"]) == (True, decided)
    custom = checks["custom: claims_agents:all_decided"]
    assert (custom["passed"], custom["actual"]) == (False, f"actual {decided} decided of {CLAIMS}")
    assert code == 1  # the custom check fails: not every claim was decided

    # The terminal summary prints the same total.
    text = pantheon("sessions", "show", sid, "--store", "s.db", cwd=tmp_path)
    assert f"recorded  {recorded.total()} envelopes" in text.stdout
