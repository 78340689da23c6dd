#!/usr/bin/env python
"""How long a NATS takeover takes: the support scenario on three nodes and a standby, one
node SIGKILLed mid-run, for several ``ack_wait`` values.

::

    .venv/bin/python benchmarks/takeover_bench.py [--ack-wait 1,2,5] [--heartbeat 1]
        [--kill cognition] [--at 0.3] [--json PATH]

Each row is one ``pantheon run --json`` of ``scenarios/support_email_nats.yaml`` (591
emails at 1,000/s, ``server: auto``) with ``standby: {spare: <the killed node's agents>}``
and ``faults.kill_node`` at ``--at`` seconds; the baseline row runs it without the kill.
``takeover_s`` is the run's ``stream.quiet_at_s`` (when the driver saw nothing move and
nothing waiting in the stream for a live group) minus the node's ``killed_at_s``: an upper
bound on the time from the SIGKILL to the last email it held being decided by the standby.
Every row also checks what the takeover must keep: every email's ``action.executed``
exactly once (from the session store; ``decided_once``), ``zero lost``, and counts dead
letters: a Reasoner whose Memory lookup (``Agent.request``, 5 s timeout) went to the killed
node waits for the takeover, and fails when ``ack_wait`` is not shorter than that timeout.
``--heartbeat`` sets ``transport.heartbeat`` (the directory forgets a node after
``heartbeat * liveness``, liveness 3).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pantheon.sessions import SessionStore  # noqa: E402

PLACEMENT = {
    "perception": ["sensor", "monitor"],
    "cognition": ["reasoner", "memory", "planner"],
    "action": ["guardian", "actor"],
}
NODES = (
    "  nodes:\n    perception: [sensor, monitor]\n"
    "    cognition: [reasoner, memory, planner]\n    action: [guardian, actor]\n"
)


def run(
    workdir: Path, ack_wait: float | None, kill: str, at: float, heartbeat: float = 1.0
) -> dict[str, Any]:
    text = (ROOT / "scenarios" / "support_email_nats.yaml").read_text()
    transport = f"  heartbeat: {heartbeat}\n{NODES}"
    faults = ""
    if ack_wait is not None:
        standby = ", ".join(PLACEMENT[kill])
        transport = f"  ack_wait: {ack_wait}\n{transport}  standby:\n    spare: [{standby}]\n"
        faults = f"\nfaults:\n  kill_node: {{node: {kill}, at: {at}}}\n"
    path = workdir / "scenarios" / "bench.yaml"
    path.write_text(text.replace(NODES, transport) + faults)
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", str(path), "--json", "--store", "s.db"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=600,
    )
    summary: dict[str, Any] = json.loads(proc.stdout)
    with SessionStore(workdir / "s.db") as store:
        envelopes = store.envelopes(store.resolve(summary["session_id"]))
    inputs = Counter(e.payload["id"] for e in envelopes if e.topic == "observation.email.received")
    actions = Counter(e.payload["email_id"] for e in envelopes if e.topic == "action.executed")
    zero = [e for e in summary["expectations"] if e["name"] == "zero lost"]
    row: dict[str, Any] = {
        "ack_wait_s": ack_wait,
        "heartbeat_s": heartbeat,
        "elapsed_s": summary["elapsed_s"],
        "emails": sum(inputs.values()),
        "decided_once": actions == inputs,
        "zero_lost": bool(zero and zero[0]["passed"]),
        "dead_letters": sum(summary["dlq"].values()),
    }
    if ack_wait is not None:
        killed_at = summary["nodes"][kill]["killed_at_s"]
        row |= {
            "killed_at_s": killed_at,
            "quiet_at_s": summary["stream"]["quiet_at_s"],
            "takeover_s": round(summary["stream"]["quiet_at_s"] - killed_at, 3),
            "redelivered": summary["nodes"]["spare"]["transport"]["redelivered"],
        }
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ack-wait", default="1,2,5")
    parser.add_argument("--heartbeat", type=float, default=1.0)
    parser.add_argument("--kill", default="cognition", choices=sorted(PLACEMENT))
    parser.add_argument("--at", type=float, default=0.3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="takeover-") as tmp:
        workdir = Path(tmp)
        shutil.copytree(ROOT / "scenarios", workdir / "scenarios")
        for ack_wait in [None, *(float(a) for a in args.ack_wait.split(","))]:
            row = run(workdir, ack_wait, args.kill, args.at, args.heartbeat)
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.json:
        out = {
            "machine": platform.platform(),
            "cpus": os.cpu_count(),
            "kill": args.kill,
            "heartbeat_s": args.heartbeat,
        }
        args.json.write_text(json.dumps(out | {"rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
