"""The on-call team asking a person, and the node processes a driver leaves behind: shared
by the NATS tests that SIGKILL a driver while an approval waits (resume, stale streams).

On ``sys.path`` through pytest's ``pythonpath`` (see ``model_session.py`` beside it).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

__all__ = ["ASK_POLICY", "node_pids", "spawn_asking_run"]

#: A Guardian policy that asks a person where the desk's own would block a remediation
#: (``scenarios/oncall/policy.py`` pages instead); written beside a copied scenario.
ASK_POLICY = """from oncall.policy import OnCallPolicy


class AskPolicy(OnCallPolicy):
    def __call__(self, proposal):
        decision = super().__call__(proposal)
        if decision["verdict"] == "blocked" and proposal["steps"]:
            return dict(proposal) | {
                "verdict": "ask",
                "reasons": list(decision["reasons"]),
                "approval": {
                    "summary": f"{proposal['action']} for {proposal['alert_id']}",
                    "alert_id": proposal["alert_id"],
                },
            }
        return decision
"""


def node_pids(session: str) -> list[int]:
    """The live node processes of ``session`` (they outlive their driver briefly)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"node" in cmdline and session.encode() in cmdline:
            pids.append(int(entry.name))
    return pids


def spawn_asking_run(cwd: Path) -> subprocess.Popen[bytes]:
    """``pantheon run scenarios/asking.yaml --store s.db`` in ``cwd``, in the background, its
    temporary directory ``cwd`` (so its nodes' orphan logs land there), its output dropped:
    a driver the test will SIGKILL while it waits on a person."""
    return subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "run", "scenarios/asking.yaml", "--store", "s.db"],
        cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env=os.environ | {"TMPDIR": str(cwd)},
    )  # fmt: skip
