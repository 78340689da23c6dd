"""A NATS run's dead letters count what its session recorded, a killed node's included:
``pantheon run`` with a throwaway nats-server (``server: auto``) and real node processes on
loopback."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from claims_team import placed, run_killed, write_team

from pantheon.sessions import SessionStore


def test_a_killed_nodes_dead_letters_count_in_the_summary_and_its_bounds(tmp_path: Path) -> None:
    """The bank (the payer's node, its tool failing three times in ten) is SIGKILLed 2 s in,
    after dead-lettering some payments, which its journal shipped through the team's stream
    as it went. What the payer had not settled waits in the stream (no live member), so no
    survivor dead-letters anything: the summary used to say ``dead letters 0`` and pass
    ``max_dlq: 0`` while the session held the bank's. It counts the record's now."""
    path = write_team(tmp_path, transport=placed("nats", ack_wait=2), kill="bank, at: 2", max_dlq=0)
    code, summary = run_killed(tmp_path, path, "bank")

    sid = summary["session_id"]
    with SessionStore(tmp_path / "s.db") as st:
        recorded = st.dead_letters(sid)
        bank = st.node_journals(sid)["bank"]
    assert not bank.ended
    assert {d.node for d in recorded} == {"bank"}  # no survivor dead-lettered anything
    by_reason = Counter(d.reason for d in recorded)
    assert set(by_reason) == {"failed"} and by_reason["failed"] > 0
    assert summary["dlq"] == dict(by_reason)
    assert summary["dlq_evicted"] == by_reason.total()  # none is in a live bus's memory
    assert sorted(d["envelope_id"] for d in summary["dead_letters"]) == sorted(
        d.envelope_id for d in recorded
    )

    checks = {e["name"]: e for e in summary["expectations"]}
    total = checks["dead letters other than shed <= 0"]
    assert (total["passed"], total["actual"]) == (False, by_reason["failed"])
    assert [e["name"] for e in summary["expectations"] if not e["passed"]] == [
        "dead letters other than shed <= 0",
        "dead letters failed <= 0",
    ]
    assert code == 1
