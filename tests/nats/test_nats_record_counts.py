"""A NATS run's summary counts what its session recorded, a killed node's messages
included: ``pantheon run`` with a throwaway nats-server (``server: auto``) and real node
processes on loopback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

from claims_team import placed, write_team

from pantheon.sessions import SessionStore


def test_what_a_killed_node_published_counts_in_the_summary(tmp_path: Path) -> None:
    """The bank (the payer's node) is SIGKILLed 2 s in: it paid the claims decided before,
    and shipped its journal, with those ``claim.paid``, through the team's stream as it
    went. The summary used to count only the processes that reported (``claim.paid`` 0:
    nobody else publishes it); it counts the record now, as ``export`` does."""
    path = write_team(tmp_path, transport=placed("nats", ack_wait=2), kill="bank, at: 2")
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", str(path), "--json", "--store", "s.db"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=180,
        env=os.environ | {"COLUMNS": "250", "TMPDIR": str(tmp_path)},
    )
    assert proc.stdout.strip(), proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["nodes"]["bank"]["status"] == "killed"

    sid = summary["session_id"]
    with SessionStore(tmp_path / "s.db") as st:
        recorded = Counter(e.topic for e in st.envelopes(sid))
        bank = st.node_journals(sid)["bank"]
    assert not bank.ended
    assert recorded["claim.paid"] > 0  # it paid some before it died
    assert summary["topics"] == dict(sorted(recorded.items()))
    assert summary["messages"] == recorded.total()
