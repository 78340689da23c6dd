"""Processes of a multi-process run dying when the scenario did not ask for it."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvloop

from pantheon.runner._multiprocess import _Child
from pantheon.sessions import SessionStore

ROOT = Path(__file__).resolve().parents[2]

# Slow enough (300 emails at 200/s) that there is a run in progress to interrupt.
SLOW = "  count: 300\n  rate: 200 "


def children(pid: int) -> dict[int, str]:
    """The live child processes of ``pid`` and their command lines, from /proc."""
    out = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmd = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        state, ppid = stat.rsplit(")", 1)[1].split()[:2]
        if int(ppid) == pid and state != "Z":
            out[int(entry.name)] = cmd.replace(b"\0", b" ").decode()
    return out


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie nobody reaped has exited all the same


def wait_for(what: str, check, deadline: float):  # type: ignore[no-untyped-def]
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)  # polling a condition with a deadline, not timing anything
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture
def slow_run(tmp_path: Path) -> Path:
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    path = tmp_path / "scenarios" / "support_email_3node.yaml"
    text = path.read_text()
    assert "  rate: 1000 " in text
    path.write_text(text.replace("  rate: 1000 ", SLOW))
    return tmp_path


def start(workdir: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "run", "scenarios/support_email_3node.yaml",
         "--json", "--store", "s.db"],
        cwd=workdir,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=os.environ | {"COLUMNS": "250"},
    )  # fmt: skip


def started(run: subprocess.Popen[str], deadline: float) -> dict[int, str]:
    """The run's broker and three nodes once each runs its own command (a child is listed
    between its fork and its exec with the parent's command line), every one of them
    started with a control pipe."""

    def up() -> dict[int, str]:
        kids = children(run.pid)
        ready = len(kids) == 4 and all("--control" in cmd for cmd in kids.values())
        return kids if ready else {}

    return wait_for("a broker and three nodes, each with --control", up, deadline)


@pytest.fixture
def runs() -> Iterator[list[subprocess.Popen[str]]]:
    """The runs a test starts, killed with their children if the test fails midway (a
    Popen collected while its process runs is a ResourceWarning in the next test)."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for run in started:
        if run.poll() is None:
            kids = children(run.pid)
            run.kill()
            for pid in kids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            run.communicate(timeout=30)
        for pipe in (run.stdout, run.stderr):
            if pipe is not None:
                pipe.close()


def inputs_flowing(workdir: Path) -> bool:
    """True once the driver has recorded some of its inputs (the nodes are all up then)."""
    if not (workdir / "s.db").exists():
        return False
    with SessionStore(workdir / "s.db") as store:
        sessions = store.sessions(limit=1)
        return bool(sessions) and store.counts(sessions[0].id).get("envelopes", 0) > 20


def test_killing_the_driver_leaves_no_process_behind(
    slow_run: Path, runs: list[subprocess.Popen[str]]
) -> None:
    run = start(slow_run)
    runs.append(run)
    deadline = time.monotonic() + 60
    kids = started(run, deadline)
    wait_for("inputs to flow", lambda: inputs_flowing(slow_run), deadline)
    run.kill()
    run.communicate(timeout=30)
    # The broker and the nodes see their stdin close and leave on their own.
    wait_for("every child to exit", lambda: not any(alive(p) for p in kids), deadline + 30)


def test_a_node_dying_unasked_fails_the_run_and_says_which(
    slow_run: Path, runs: list[subprocess.Popen[str]]
) -> None:
    run = start(slow_run)
    runs.append(run)
    deadline = time.monotonic() + 60
    kids = started(run, deadline)
    wait_for("inputs to flow", lambda: inputs_flowing(slow_run), deadline)
    [victim] = [p for p, cmd in kids.items() if "--node cognition" in cmd]
    os.kill(victim, signal.SIGKILL)
    out, err = run.communicate(timeout=120)
    assert run.returncode == 1, err
    summary = json.loads(out)
    assert summary["nodes"]["cognition"]["status"] == "died"
    assert summary["nodes"]["cognition"]["exit_code"] == -signal.SIGKILL
    [nodes_check] = [e for e in summary["expectations"] if e["name"].startswith("every node")]
    assert nodes_check["passed"] is False and nodes_check["actual"] == ["cognition"]
    # What the dead node held came back to its publishers as node_lost dead letters.
    assert summary["dlq"].get("node_lost", 0) == summary["nodes"]["driver"]["links"]["node_lost"]
    assert summary["nodes"]["driver"]["broker"]["nodes_lost"] == 1


def test_a_node_whose_pipe_closed_before_its_output_ended_counts_as_gone() -> None:
    # A SIGKILLed node's stdin pipe and stdout both close; when the loop notices the pipe
    # first, the driver still thinks the node alive and its next status poll writes to a
    # closed pipe. uvloop (what ``pantheon run`` uses) raises RuntimeError there, which
    # crashed the run with a traceback instead of reporting the node as died. Closing our
    # end of the pipe makes that state without waiting on the scheduler.
    async def main() -> None:
        command = [sys.executable, "-c", "import time; time.sleep(60)"]
        child = await _Child.spawn("cognition", (), command, "node 'cognition'")
        try:
            assert child.proc.stdin is not None
            child.proc.stdin.close()
            await child.proc.stdin.wait_closed()
            assert child.alive  # its stdout is still open
            assert await child.call("status", "status", 30.0) is None
            assert not child.alive
        finally:
            await child.close()

    uvloop.run(main())


def test_a_broker_that_cannot_bind_fails_the_run_clearly(slow_run: Path) -> None:
    path = slow_run / "scenarios" / "support_email_3node.yaml"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        address = f"tcp://127.0.0.1:{taken.getsockname()[1]}"
        path.write_text(path.read_text().replace("tcp://127.0.0.1:0", address))
        proc = subprocess.run(
            [sys.executable, "-m", "pantheon.cli", "run", str(path), "--no-record"],
            cwd=slow_run,
            capture_output=True,
            text=True,
            timeout=120,
            env=os.environ | {"COLUMNS": "250"},
        )
    assert proc.returncode == 2
    assert f"the broker ({address}) failed to start" in proc.stderr
    assert "bind" in proc.stderr
    assert "Traceback" not in proc.stderr
