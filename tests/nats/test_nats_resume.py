"""A NATS run whose driver is SIGKILLed mid-run, resumed: every input decided exactly once.

The nodes ship their records to the team's stream, so what they did survives the driver;
``pantheon resume`` takes in what the dead driver had not stored (the nodes' shipments and
its own published inputs, read back from the stream) and finishes the run in one process,
serving everything that was done and doing only the rest."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from approval_run import resume_approving
from oncall_asking import ASK_POLICY, node_pids, spawn_asking_run
from store_poll import query, until
from untimed import copy_untimed

from bus.backends.nats import NatsServer
from pantheon.sessions import ApprovalBook, SessionStore


def _resume_or_show_where_it_hangs(
    workdir: Path, session: str, timeout: float = 300.0
) -> subprocess.CompletedProcess[str]:
    """``pantheon resume SESSION --json``. Twice under heavy load (two suites side by side) a
    resume here printed nothing for 300 s; past ``timeout`` it gets SIGABRT, which with
    ``PYTHONFAULTHANDLER`` makes it print every thread's stack, and the test fails with
    that stack instead of a bare timeout."""
    args = [sys.executable, "-m", "pantheon.cli", "resume", session, "--store", "s.db", "--json"]
    proc = subprocess.Popen(
        args, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"COLUMNS": "200", "PYTHONFAULTHANDLER": "1"},
    )  # fmt: skip
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)
        out, err = proc.communicate(timeout=30)
        raise AssertionError(
            f"resume hung for {timeout:.0f} s; its stacks:\n{err[-8000:]}"
        ) from None
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def test_a_nats_run_whose_driver_was_sigkilled_resumes_deciding_every_input_once(
    tmp_path: Path,
) -> None:
    copy_untimed(tmp_path)
    server = NatsServer().start()
    try:
        text = (tmp_path / "scenarios" / "support_email_nats.yaml").read_text()
        auto = "  server: auto"
        assert auto in text
        lines = [ln for ln in text.splitlines() if not ln.startswith(auto)]
        text = "\n".join(lines).replace("  kind: nats\n", f"  kind: nats\n  url: {server.url}\n")
        # 300 emails over 3 s, so the kill lands while the driver still publishes them and the
        # resume has inputs of its own to decide, however late a loaded machine makes the
        # action node's first shipment (at 1,000/s all were out by then once, and the
        # orphaned nodes had finished them all).
        text = text.replace("  rate: 1000 ", "  count: 300\n  rate: 100 ")
        text += "\nfaults:\n  agents:\n    reasoner: {latency_ms: 4}\n"
        (tmp_path / "scenarios" / "resumable.yaml").write_text(text)
        # The same team and input in one process, never killed: what must be done.
        alone = (tmp_path / "scenarios" / "support_email.yaml").read_text()
        alone = alone.replace("  rate: 1000 ", "  count: 300\n  rate: 1000 ")
        (tmp_path / "scenarios" / "alone.yaml").write_text(alone)
        reference = subprocess.run(
            [sys.executable, "-m", "pantheon.cli", "run", "scenarios/alone.yaml", "--store",
             "ref.db", "--json"],
            cwd=tmp_path, capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        expected_summary = json.loads(reference.stdout)

        db = tmp_path / "s.db"
        driver = subprocess.Popen(
            [sys.executable, "-m", "pantheon.cli", "run", "scenarios/resumable.yaml",
             "--store", "s.db"],
            cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            env=os.environ | {"COLUMNS": "200", "TMPDIR": str(tmp_path)},
        )  # fmt: skip
        # Kill it once the Actor's node has shipped records (decisions are being made) and
        # before the run ends.
        until(
            "the action node's first shipment",
            lambda: query(db, "SELECT records FROM session_nodes WHERE node = 'action'"),
        )
        driver.send_signal(signal.SIGKILL)
        driver.wait(timeout=30)
        (session,) = query(db, "SELECT id FROM sessions WHERE kind = 'run'")[0]
        assert isinstance(session, str)
        # Its nodes notice the closed control link, ship their last records, and leave.
        until("the orphaned nodes to leave", lambda: not node_pids(session))

        resumed = _resume_or_show_where_it_hangs(tmp_path, session)
    finally:
        server.stop()
    summary = json.loads(resumed.stdout)
    assert resumed.returncode == (0 if summary["passed"] else 1), resumed.stderr

    # The whole story has every input, as the run that never died.
    assert (summary["inputs"], summary["malformed"]) == (
        expected_summary["inputs"], expected_summary["malformed"],
    )  # fmt: skip
    assert summary["accounting_ok"] is True
    # Each orphaned node said in its own log (its stderr was the dead driver's pipe) that it
    # left and shipped its journal's end; the resume read every end mark from the stream.
    logs = {
        node: (tmp_path / "pantheon-orphans" / f"{session}.{node}.log").read_text()
        for node in ("action", "cognition", "perception")
    }
    for node, text in logs.items():
        events = [json.loads(line)["event"] for line in text.splitlines()]
        assert events[0] == "driver gone: leaving", (node, text)
        assert events[-1] == "journal finished: last records and end mark shipped", (node, text)
    journals = query(db, f"SELECT node, ended FROM session_nodes WHERE session = '{session}'")
    assert sorted(journals) == [("action", 1), ("cognition", 1), ("perception", 1)], logs

    # Every tool call of every email, across the dead run's nodes and the resume, made
    # exactly once, and every email the team acts on was acted on.
    calls: collections.Counter[tuple[str, int, str]] = collections.Counter()
    mine: collections.Counter[str] = collections.Counter()
    reference_calls = set()
    for path in (tmp_path / "outbox").glob("*.jsonl"):
        for line in path.read_text().splitlines():
            call = json.loads(line)
            what = (call["email_id"], call["step"], call["tool"])
            if path.stem == expected_summary["session_id"]:
                reference_calls.add(what)
                continue
            calls[what] += 1
            if path.stem == summary["session_id"]:
                mine[call["tool"]] += 1
    assert [k for k, n in calls.items() if n > 1] == []
    # The same calls as the run that never died.
    assert set(calls) == reference_calls and len(reference_calls) > 100
    # The resume made only the calls the dead run had not: what its nodes did was served.
    assert 0 < sum(mine.values()) < len(calls)
    # Its summary counts the whole story's calls, served or made, as the run that never died.
    assert summary["outbox"] == expected_summary["outbox"]
    assert sum(summary["outbox"].values()) == len(calls)
    assert summary["resume"]["effects_served"] > 0


def _pending(db: Path, session: str) -> list[int]:
    with SessionStore(db, create=False) as st:
        book = ApprovalBook(st)
        return [a.id for a in book.entries(book.origin(session), status="pending")]


def test_a_resumed_nats_run_waits_on_the_approvals_its_remote_node_could_not_get(
    tmp_path: Path,
) -> None:
    """The on-call Guardian on node ``act`` waits for a person; the driver is SIGKILLed. The
    node's waiting request then fails (nobody can decide it any more) and that failure is in
    its shipped record. The resume asks again instead of serving it: it waits on the request,
    still pending in the store, until ``pantheon approve`` decides it, and dead-letters
    nothing. (It used to finish at once, three requests dead-lettered, #1 pending forever.)"""
    scenarios = copy_untimed(tmp_path)
    (scenarios / "oncall" / "askpolicy.py").write_text(ASK_POLICY)
    server = NatsServer().start()
    db = tmp_path / "s.db"
    try:
        text = (scenarios / "oncall.yaml").read_text()
        for old, new in (
            ('policy: "oncall.policy:OnCallPolicy"', 'policy: "oncall.askpolicy:AskPolicy"'),
            ("          - {action: failover_db, role: primary}\n",
             "          - {action: failover_db, role: primary}\n"
             "          - {action: clear_disk}\n"),
            ("\nexpect:\n", f"\ntransport:\n  kind: nats\n  url: {server.url}\n  nodes:\n"
             "    triage: [dedup, correlator]\n    act: [decider, guardian, actor]\n"
             "approvals: {timeout: 300, default: reject, poll: 0.1}\n\nexpect:\n"),
        ):  # fmt: skip
            assert old in text, old
            text = text.replace(old, new)
        (scenarios / "asking.yaml").write_text(text)
        driver = spawn_asking_run(tmp_path)
        try:
            until("a request pending", lambda: query(db, "SELECT id FROM approvals"))
            (session,) = query(db, "SELECT id FROM sessions WHERE kind = 'run'")[0]
            assert isinstance(session, str)
            asked = _pending(db, session)
            assert asked, "the run asked nothing"
        finally:
            driver.send_signal(signal.SIGKILL)
            driver.wait(timeout=30)
        until("the orphaned nodes to leave", lambda: not node_pids(session))
        # The node's own log says its waiting request failed when the driver went.
        said = (tmp_path / "pantheon-orphans" / f"{session}.act.log").read_text()
        assert " dropped: " in said and "approval request" in said, said

        # A person approves every request as it comes, the dead run's first.
        summary, decided = resume_approving(tmp_path, session)
    finally:
        server.stop()
    # The dead run's requests were decided by the person, in the resume: none dead-lettered.
    assert summary["dlq"] == {}, summary["dead_letters"]
    assert set(asked) <= set(decided), (asked, decided)
    assert summary["resume"]["asked_again"] >= 1
    with SessionStore(db, create=False) as st:
        book = ApprovalBook(st)
        rows = book.entries(book.origin(session))
    assert {(a.status, a.decided_by) for a in rows} == {("approved", "ann")}
