"""Claims runs that stopped before the end of their input, as a user's do: one stopped by
Ctrl-C (recorded ``aborted``, ``interrupted`` in its summary, what was in flight finished
and judged) and one whose driver was SIGKILLed (``aborted`` once a store finds its process
gone, with no summary of its own). For the tests of what a stopped session's pages say.

On ``sys.path`` through pytest's ``pythonpath`` (see ``model_session.py`` beside it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from claims_team import write_team
from interrupting import run_and_interrupt
from oncall_asking import node_pids
from store_poll import query, until

from pantheon.sessions import SessionStore

__all__ = ["crashed_run", "decided", "interrupted_run"]

#: Claims a second: the input (42 lines) takes five seconds, so a run is stopped mid-way.
RATE = 8


def decided(store: Path) -> int:
    """Claims the run has decided, as far as its store shows yet."""
    rows = query(store, "SELECT count(*) FROM envelopes WHERE topic = 'claim.decided'")
    n = rows[0][0] if rows else 0
    return n if isinstance(n, int) else 0


def interrupted_run(folder: Path) -> tuple[Path, str, dict[str, Any]]:
    """``pantheon run`` of the claims team in ``folder``, one Ctrl-C once three claims are
    decided: (the store, the session, the run's ``--json`` summary)."""
    path = write_team(folder, rate=RATE)
    store = folder / "s.db"
    done = run_and_interrupt(folder, path, lambda: decided(store) >= 3, "three claims decided")
    assert done.returncode == 130, done.stderr
    summary: dict[str, Any] = json.loads(done.stdout)
    assert summary["interrupted"] == "SIGINT", summary
    return store, summary["session_id"], summary


def crashed_run(folder: Path, transport: str = "") -> tuple[Path, str]:
    """``pantheon run`` of the claims team in ``folder`` (``transport``: a
    :func:`claims_team.placed` section), its driver SIGKILLed once three claims are decided:
    (the store, the session, now ``aborted``)."""
    path = write_team(folder, rate=RATE, transport=transport)
    store = folder / "s.db"
    run = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "run", str(path), "--store", "s.db", "--json"],
        cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=os.environ | {"TMPDIR": str(folder)},  # a node's orphan log lands here
    )  # fmt: skip
    try:
        until("three claims decided", lambda: decided(store) >= 3 or run.poll() is not None)
        assert run.poll() is None, "the run ended before it could be killed"
        os.kill(run.pid, signal.SIGKILL)
        run.wait(timeout=60)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    with SessionStore(store) as st:  # opening it finds the driver gone
        (info,) = st.sessions()
    assert info.status == "aborted", info
    # A node outlives its driver for a moment: gone before the test looks at the session.
    until(f"the nodes of {info.id} to stop", lambda: node_pids(info.id) == [], 60)
    return store, info.id
