"""A ``pantheon run`` waiting for a person: the approval tests of the CLI, the monitor and
the web dashboard start one and decide its requests their own way.

On ``sys.path`` through pytest's ``pythonpath`` (see ``model_session.py`` beside it).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pantheon.sessions import Approval, ApprovalBook, SessionStore

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "tests" / "pantheon" / "approvals"
#: Seconds a test waits for another process to get somewhere before it fails.
WAIT = 60.0
#: The two refunds over the limit in emails.jsonl: what the Guardian asks about.
REFUNDS = {"e0046", "e0081"}


def scenario(tmp_path: Path, approvals: str) -> Path:
    """The approvals scenario in tmp_path with its ``approvals:`` block replaced."""
    text = (HERE / "approvals.yaml").read_text(encoding="utf-8")
    text = re.sub(r"approvals:\n(  .*\n)+", approvals.strip() + "\n", text)
    # The copy is elsewhere: the support team's folder, by its absolute path.
    text = text.replace("path: [../../../scenarios]", f"path: [{ROOT / 'scenarios'}]")
    (tmp_path / "emails.jsonl").write_text(
        (HERE / "emails.jsonl").read_text(encoding="utf-8"), encoding="utf-8"
    )
    path = tmp_path / "approvals.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def spawn(*args: str, store: Path, cwd: Path) -> subprocess.Popen[str]:
    """``pantheon ARGS --store STORE --json`` in the background."""
    return subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", *args, "--store", str(store), "--json"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=cwd,
    )


def stop(proc: subprocess.Popen[str]) -> None:
    """Kill (if still running) and reap, closing its pipes."""
    proc.kill()
    proc.communicate()


def wait_for(what: str, check: Callable[[], Any], proc: subprocess.Popen[str] | None = None) -> Any:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        if proc is not None and proc.poll() is not None:
            _, err = proc.communicate()
            raise AssertionError(f"process ended ({proc.returncode}) before {what}: {err}")
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def pending(store: Path, kind: str = "run") -> tuple[str, list[Approval]] | None:
    """The newest session of ``kind`` and its pending approvals, once it has two."""
    if not store.exists():
        return None
    with SessionStore(store, create=False) as st:
        sessions = [s for s in st.sessions() if s.kind == kind]
        if not sessions:
            return None
        book = ApprovalBook(st)
        rows = book.entries(book.origin(sessions[0].id), status="pending")
        return (sessions[0].id, rows) if len(rows) == 2 else None


def waiting_run(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, str, list[Approval]]:
    """A ``pantheon run`` of the approvals scenario, once both its requests are pending
    (two minutes before the timeout would reject them)."""
    store = tmp_path / "s.db"
    path = scenario(tmp_path, "approvals:\n  timeout: 120\n  poll: 0.05\n")
    run = spawn("run", str(path), store=store, cwd=tmp_path)
    try:
        sid, rows = wait_for("two pending approvals", lambda: pending(store), run)
    except BaseException:
        stop(run)
        raise
    return run, store, sid, rows


def resume_approving(
    cwd: Path, session: str, store: str = "s.db"
) -> tuple[dict[str, Any], list[int]]:
    """``pantheon resume SESSION --json`` while a person approves each of the session's
    requests as it comes: (its summary, the request numbers approved). Its exit code must
    be its verdict."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", "resume", session, "--store", store, "--json"],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    approved: list[int] = []
    try:
        deadline = time.monotonic() + 2 * WAIT
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the resume did not finish"
            with SessionStore(cwd / store, create=False) as st:
                book = ApprovalBook(st)
                pending = [a.id for a in book.entries(book.origin(session), status="pending")]
            for rid in pending:
                ok = subprocess.run(
                    [sys.executable, "-m", "pantheon.cli", "approve", session, str(rid),
                     "--by", "ann", "--store", store],
                    cwd=cwd, capture_output=True, text=True, timeout=WAIT,
                )  # fmt: skip
                assert ok.returncode == 0, ok.stdout + ok.stderr
                approved.append(rid)
            time.sleep(0.1)
        out, err = proc.communicate(timeout=WAIT)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    summary: dict[str, Any] = json.loads(out)
    assert proc.returncode == (0 if summary["passed"] else 1), err
    return summary, approved
