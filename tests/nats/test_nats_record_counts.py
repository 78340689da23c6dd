"""A NATS run's summary counts what its session recorded, a killed node's messages
included: ``pantheon run`` with a throwaway nats-server (``server: auto``) and real node
processes on loopback."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from claims_team import placed, run_killed, write_team

from pantheon.sessions import SessionStore


def test_what_a_killed_node_published_counts_in_the_summary(tmp_path: Path) -> None:
    """The bank (the payer's node) is SIGKILLed 2 s in: it paid the claims decided before,
    and shipped its journal, with those ``claim.paid``, through the team's stream as it
    went. The summary used to count only the processes that reported (``claim.paid`` 0:
    nobody else publishes it); it counts the record now, as ``export`` does."""
    path = write_team(tmp_path, transport=placed("nats", ack_wait=2), kill="bank, at: 2")
    code, summary = run_killed(tmp_path, path, "bank")

    sid = summary["session_id"]
    with SessionStore(tmp_path / "s.db") as st:
        recorded = Counter(e.topic for e in st.envelopes(sid))
        bank = st.node_journals(sid)["bank"]
    assert not bank.ended
    assert recorded["claim.paid"] > 0  # it paid some before it died
    assert summary["topics"] == dict(sorted(recorded.items()))
    assert summary["messages"] == recorded.total()
    assert code == (0 if summary["passed"] else 1)  # judged on those counts, as it says
