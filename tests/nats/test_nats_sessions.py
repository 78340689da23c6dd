"""A NATS server outlives runs: a run never handles what an earlier, aborted run of its team
left in the stream.

The on-call desk with a Guardian that asks a person (so the run waits), its driver SIGKILLed
while the request is pending: the orphaned nodes leave, and the scorer's consumer group keeps
the ``action.executed`` messages the ``act`` node published after the driver died. Then
the same team runs again on the same server. Before, its consumers were the team's, reused:
the new run's scorer got the dead run's 65 messages as its own (decision accuracy 90.5%
instead of 94.0%, 6 pages instead of 4) and ``pantheon replay`` still matched. Now each
session has its own consumer groups: the new run's record holds none of the dead session's
envelopes, its outcomes are a clean run's, its summary lists what it left alone, and what
the dead run left stays in the stream until ``pantheon resume`` finishes it (then its groups
go)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from approval_run import resume_approving
from oncall_asking import ASK_POLICY, node_pids, spawn_asking_run
from untimed import copy_untimed

from bus import Bus
from bus.backends.nats import NatsServer, NatsTransport
from pantheon.sessions import ApprovalBook, SessionStore

_WAIT = 120.0


def _scenarios(tmp_path: Path, url: str) -> None:
    """``asking.yaml`` (the Guardian asks about every disk clean-up, a storm of alerts),
    ``plain.yaml`` (the desk as shipped) and ``clean.yaml`` (the same under another team:
    its own stream), each on ``url`` with two nodes."""
    folder = copy_untimed(tmp_path)
    (folder / "ask_policy.py").write_text(ASK_POLICY)
    text = (folder / "oncall.yaml").read_text()
    transport = (
        f"\ntransport:\n  kind: nats\n  url: {url}\n"
        "  nodes:\n    triage: [dedup, correlator]\n    act: [decider, guardian, actor]\n"
    )
    plain = re.sub(r"\n  rate: .*\n", "\n  rate: 50\n  count: 200\n", text) + transport
    (folder / "plain.yaml").write_text(plain)
    (folder / "clean.yaml").write_text(
        plain.replace("  kind: nats\n", "  kind: nats\n  team: clean\n")
    )
    asking = plain.replace("  rate: 50\n", "  rate: 5000\n")
    asking = asking.replace(
        'policy: "oncall.policy:OnCallPolicy"', 'policy: "ask_policy:AskPolicy"'
    )
    asking = asking.replace(
        "          - {action: failover_db, role: primary}\n",
        "          - {action: failover_db, role: primary}\n          - {action: clear_disk}\n",
    )
    asking += "approvals:\n  timeout: 300\n  default: reject\n  poll: 0.2\n"
    (folder / "asking.yaml").write_text(asking)


def _pantheon(tmp_path: Path, *args: str) -> dict[str, Any]:
    """``pantheon ARGS --store s.db --json``: its summary (its exit code is its verdict)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", *args, "--store", "s.db", "--json"],
        cwd=tmp_path, capture_output=True, text=True, timeout=300,
        env=os.environ | {"COLUMNS": "200"},
    )  # fmt: skip
    summary: dict[str, Any] = json.loads(proc.stdout)
    assert proc.returncode == (0 if summary["passed"] else 1), proc.stderr
    return summary


def _until(what: str, check: Any) -> Any:
    deadline = time.monotonic() + _WAIT
    while not (found := check()):
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
    return found


def _pending_approval(tmp_path: Path) -> str | None:
    """The session of the first pending approval in the store, once there is one."""
    if not (tmp_path / "s.db").exists():
        return None
    with SessionStore(tmp_path / "s.db", create=False) as store:
        book = ApprovalBook(store)
        for info in store.sessions():
            if book.entries(book.origin(info.id), status="pending"):
                return info.id
    return None


async def _stream(url: str, session: str) -> tuple[dict[str, int], set[int]]:
    """What the ``oncall`` stream says, to a process of no session: the sessions that left
    unacknowledged messages, and the ids of every message ``session``'s processes published."""
    transport = NatsTransport(url, team="oncall", node="looker")
    async with Bus(transport=transport):
        left = await transport.leftovers()
        ids = {
            env.id
            for node in ("driver", "triage", "act")
            for env in await transport.published(node, session)
        }
    return left, ids


def test_a_run_leaves_alone_what_an_aborted_run_of_its_team_left_in_the_stream(
    tmp_path: Path,
) -> None:
    server = NatsServer().start()
    try:
        _scenarios(tmp_path, server.url)
        clean = _pantheon(tmp_path, "run", "scenarios/clean.yaml")

        # The first run waits on a person; its driver dies then, its nodes leave.
        driver = spawn_asking_run(tmp_path)
        aborted = _until("a pending approval", lambda: _pending_approval(tmp_path))
        time.sleep(1.0)  # the act node goes on publishing what the driver's scorer takes
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        _until("the orphaned nodes to leave", lambda: not node_pids(aborted))
        left, published = asyncio.run(_stream(server.url, aborted))
        assert set(left) == {aborted} and left[aborted] > 0, left

        again = _pantheon(tmp_path, "run", "scenarios/plain.yaml")
        # It said what it found and left alone, and the dead run's messages are still there.
        assert again["leftovers"] == left
        after, _ = asyncio.run(_stream(server.url, aborted))
        assert after == left  # its own groups went with it: nothing of it is listed

        # Its record holds none of the dead session's envelopes, and its outcomes are those
        # of the same team on a stream nobody used before.
        with SessionStore(tmp_path / "s.db") as store:
            seen = {e.id for e in store.envelopes(again["session_id"])}
            seen |= {d.envelope_id for d in store.deliveries(again["session_id"])}
        assert seen and not seen & published
        for key in ("inputs", "accuracy", "decisions", "outbox", "topics"):
            assert again[key] == clean[key], key
        assert clean["leftovers"] == {}

        # Resuming the dead run finishes it from the stream; its groups go then. A person
        # approves its requests as they come (the dead node's are asked again).
        resumed, _ = resume_approving(tmp_path, aborted)
        assert resumed["resume"]["original_session_id"] == aborted
        assert resumed["resume"]["effects_served"] > 0
        finished, _ = asyncio.run(_stream(server.url, aborted))
        assert finished == {}
    finally:
        server.stop()
