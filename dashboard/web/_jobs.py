"""Replays and redrives the dashboard starts, run through the ``pantheon`` CLI.

A replay takes seconds and must not block the page, so it runs as a background process
(``pantheon replay SESSION --store PATH --json``) that the page polls; the process writes
its replay into the same store, which is how the page shows progress (the replay's
message count against the original's). Going through the CLI rather than calling
``replay_session`` in the Streamlit server keeps a replay's event loop, its team and any
crash out of the server process, and runs exactly what a user would run by hand.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

__all__ = ["MAX_JOBS", "JobRegistry", "RedriveResult", "ReplayJob", "cli_command", "redrive"]

#: Finished jobs kept for the page to show; past this the oldest finished one is forgotten
#: (its replay stays in the store and can still be picked there). Running jobs are never
#: dropped.
MAX_JOBS = 32
#: How long a redrive may take before the page gives up on it (the process is killed).
REDRIVE_TIMEOUT = 300.0

JobState = Literal["running", "matched", "diverged", "error"]


def cli_command(*args: str) -> list[str]:
    """``pantheon ARGS`` with this interpreter, so it works without the script on PATH."""
    return [sys.executable, "-m", "pantheon.cli", *args]


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


@dataclass
class ReplayJob:
    """One ``pantheon replay`` process and where its output goes."""

    session_id: str
    store: Path
    live_effects: bool
    started: float
    process: subprocess.Popen[bytes]
    out_path: Path
    err_path: Path
    report: dict[str, Any] | None = None
    error: str | None = None
    returncode: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @classmethod
    def start(cls, store: Path, session_id: str, *, live_effects: bool = False) -> ReplayJob:
        args = ["replay", session_id, "--store", str(store), "--json"]
        if live_effects:
            args.append("--live-effects")
        fd_out, out = tempfile.mkstemp(prefix="pantheon-replay-", suffix=".json")
        fd_err, err = tempfile.mkstemp(prefix="pantheon-replay-", suffix=".err")
        with os.fdopen(fd_out, "wb") as stdout, os.fdopen(fd_err, "wb") as stderr:
            process = subprocess.Popen(
                cli_command(*args), stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL
            )
        return cls(session_id, store, live_effects, time.time(), process, Path(out), Path(err))

    @property
    def state(self) -> JobState:
        """Polls the process; once it has exited, reads its report (once)."""
        with self._lock:
            if self.returncode is None:
                code = self.process.poll()
                if code is None:
                    return "running"
                self._collect(code)
            if self.report is None:
                return "error"
            return "matched" if self.report.get("matched") else "diverged"

    def _collect(self, code: int) -> None:
        self.returncode = code
        try:
            out = self.out_path.read_text(encoding="utf-8", errors="replace")
            err = self.err_path.read_text(encoding="utf-8", errors="replace")
        finally:
            self.out_path.unlink(missing_ok=True)
            self.err_path.unlink(missing_ok=True)
        # Exit 0 is a match and 1 a divergence, both with the JSON report; 2 is a usage or
        # store error with a message on stderr.
        if code in (0, 1):
            try:
                self.report = json.loads(out)
                return
            except json.JSONDecodeError:
                pass
        self.error = _tail(err or out) or f"pantheon replay exited with code {code}"

    @property
    def new_session_id(self) -> str | None:
        return None if self.report is None else self.report.get("new_session_id")

    def cancel(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()


class JobRegistry:
    """The replay jobs of one dashboard server, shared by every browser tab."""

    def __init__(self, max_jobs: int = MAX_JOBS) -> None:
        self._jobs: list[ReplayJob] = []
        self._lock = threading.Lock()
        self.max_jobs = max_jobs

    def start(self, store: Path, session_id: str, *, live_effects: bool = False) -> ReplayJob:
        """Start a replay unless one of this session is already running (then return it)."""
        with self._lock:
            running = self._latest(store, session_id)
            if running is not None and running.process.poll() is None:
                return running
            job = ReplayJob.start(store, session_id, live_effects=live_effects)
            self._jobs.append(job)
            finished = [j for j in self._jobs if j.process.poll() is not None]
            while len(self._jobs) > self.max_jobs and finished:
                self._jobs.remove(finished.pop(0))
            return job

    def latest(self, store: Path, session_id: str) -> ReplayJob | None:
        with self._lock:
            return self._latest(store, session_id)

    def _latest(self, store: Path, session_id: str) -> ReplayJob | None:
        for job in reversed(self._jobs):
            if job.store == store and job.session_id == session_id:
                return job
        return None

    def close(self) -> None:
        """Kill what still runs (the server is going away)."""
        with self._lock:
            for job in self._jobs:
                job.cancel()


@dataclass(frozen=True, slots=True)
class RedriveResult:
    """``report`` is ``pantheon dlq redrive --json``'s output; ``error`` why there is none."""

    report: dict[str, Any] | None
    error: str | None


def redrive(store: Path, session_id: str, entry: int | None = None) -> RedriveResult:
    """Run ``pantheon dlq redrive`` to completion (seconds: only the dead letters run)."""
    args = ["dlq", "redrive", session_id, "--store", str(store), "--json"]
    if entry is not None:
        args.append(str(entry))
    try:
        done = subprocess.run(
            cli_command(*args),
            capture_output=True,
            text=True,
            timeout=REDRIVE_TIMEOUT,
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return RedriveResult(None, f"pantheon dlq redrive took over {REDRIVE_TIMEOUT:.0f} s")
    # Exit 1 is a redrive that ran but where entries failed again: its report says which.
    if done.returncode in (0, 1):
        try:
            return RedriveResult(json.loads(done.stdout), None)
        except json.JSONDecodeError:
            pass
    return RedriveResult(None, _tail(done.stderr or done.stdout) or f"exit {done.returncode}")
