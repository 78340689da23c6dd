"""A ZeroMQ run's dead letters count what its session recorded, a killed node's included:
real ``pantheon run`` processes (a broker and one process per node) on loopback."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from claims_team import placed, run_killed, write_team

from pantheon.sessions import SessionStore


def test_a_killed_nodes_dead_letters_count_in_the_summary_and_its_bounds(tmp_path: Path) -> None:
    """The bank (the payer's node, its tool failing three times in ten, one attempt each) is
    SIGKILLed 2 s in, after dead-lettering some payments: it shipped those dead letters in
    its journal as it went, but its report, with its bus's counts, died with it. The
    summary used to count the survivors' dead letters only (the desk's ``node_lost`` for
    what the bank held or was sent after it died), so ``dlq: {failed: {max: 0}}`` passed on
    "0 failed" while the session held the bank's. The summary's counts are the record's
    now, with the killed node's dead letters listed too, and both bounds judge them."""
    path = write_team(tmp_path, transport=placed("zmq"), kill="bank, at: 2", max_dlq=0)
    code, summary = run_killed(tmp_path, path, "bank")
    assert list(summary["unverified"]) == ["bank"]

    sid = summary["session_id"]
    with SessionStore(tmp_path / "s.db") as st:
        recorded = st.dead_letters(sid)
        bank = st.node_journals(sid)["bank"]
    assert not bank.ended  # its journal stops where it died
    by_reason = Counter(d.reason for d in recorded)
    failed = Counter(d.node for d in recorded if d.reason == "failed")
    assert set(failed) == {"bank"} and failed["bank"] > 0  # only the payer fails
    assert summary["dlq"] == dict(by_reason)
    # Nothing was evicted from a survivor's queue: what counts as not in memory is the
    # killed node's, whose queue died with it.
    assert summary["dlq_evicted"] == sum(1 for d in recorded if d.node == "bank")
    # Fewer than MAX_LISTED_DEAD_LETTERS, none shed: every one is listed, the bank's too.
    assert sorted((d["envelope_id"], d["reason"]) for d in summary["dead_letters"]) == sorted(
        (d.envelope_id, d.reason) for d in recorded
    )
    assert all(
        d["subscriber"] == "payer" and d["error"].startswith("InjectedFault: payer: injected")
        for d in summary["dead_letters"]
        if d["reason"] == "failed"
    )

    checks = {e["name"]: e for e in summary["expectations"]}
    total = checks["dead letters other than shed <= 0"]
    assert (total["passed"], total["actual"]) == (False, by_reason.total())
    bound = checks["dead letters failed <= 0"]
    assert (bound["passed"], bound["actual"]) == (False, failed["bank"])
    assert [e["name"] for e in summary["expectations"] if not e["passed"]] == [
        "dead letters other than shed <= 0",
        "dead letters failed <= 0",
    ]
    assert code == 1
    # The session keeps the same summary.
    with SessionStore(tmp_path / "s.db") as st:
        stored = st.session(sid).summary
    assert (stored["dlq"], stored["dlq_evicted"]) == (summary["dlq"], summary["dlq_evicted"])
