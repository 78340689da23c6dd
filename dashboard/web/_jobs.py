"""Replays and redrives the dashboard starts, run through the ``pantheon`` CLI.

Neither may block the page, so each runs as a background process (``pantheon replay SESSION
--store PATH --json``, ``pantheon dlq redrive SESSION [ENTRY] --store PATH --json``) that
the page polls. Each writes its session into the same store, which is how the page shows
progress: a replay's message count against the original's, a redrive's pending approval
requests. A redrive must not block above all: its team asks the scenario's approval desk,
and the person who decides may be the one looking at this page. Going through the CLI
rather than calling ``replay_session`` or ``redrive`` in the Streamlit server keeps a
rerun's event loop, its team and any crash out of the server process, and runs exactly
what a user would run by hand.
"""

from __future__ import annotations

import atexit
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, TypeVar

from pantheon.sessions import DEFAULT_REPLAY_TIMEOUT

__all__ = [
    "MAX_JOBS",
    "JobRegistry",
    "RedriveJob",
    "ReplayJob",
    "cli_command",
    "redrive_bound",
]

#: Finished jobs kept for the page to show; past this the oldest finished one is forgotten
#: (its session stays in the store and can still be opened there). Running jobs are never
#: dropped.
MAX_JOBS = 32

JobState = Literal["running", "matched", "diverged", "error"]
#: A redrive's end: every entry ``redriven``, some ``failed`` again (themselves or
#: downstream, or skipped: the report says which), or an ``error`` (no report at all).
RedriveState = Literal["running", "redriven", "failed", "error"]


def cli_command(*args: str) -> list[str]:
    """``pantheon ARGS`` with this interpreter, so it works without the script on PATH."""
    return [sys.executable, "-m", "pantheon.cli", *args]


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def _spawn(args: list[str], prefix: str) -> tuple[subprocess.Popen[bytes], Path, Path]:
    """``pantheon ARGS`` in the background, its stdout and stderr going to temporary files:
    a pipe nobody reads while the process runs would fill and stall it."""
    fd_out, out = tempfile.mkstemp(prefix=prefix, suffix=".json")
    fd_err, err = tempfile.mkstemp(prefix=prefix, suffix=".err")
    with os.fdopen(fd_out, "wb") as stdout, os.fdopen(fd_err, "wb") as stderr:
        process = subprocess.Popen(
            cli_command(*args), stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL
        )
    return process, Path(out), Path(err)


def _read_once(out_path: Path, err_path: Path) -> tuple[str, str]:
    """What a finished process wrote; its files are removed."""
    try:
        out = out_path.read_text(encoding="utf-8", errors="replace")
        err = err_path.read_text(encoding="utf-8", errors="replace")
    finally:
        out_path.unlink(missing_ok=True)
        err_path.unlink(missing_ok=True)
    return out, err


def _report(code: int, out: str, err: str, what: str) -> tuple[dict[str, Any] | None, str | None]:
    """(the JSON report, None) of a process that ran, or (None, why there is none). Exit 0
    and 1 both come with the report (a match and a divergence; a redrive where every entry
    was redriven and one where some failed again); 2 is a usage or store error with a
    message on stderr, and anything else a crash or a kill."""
    if code in (0, 1):
        try:
            return json.loads(out), None
        except json.JSONDecodeError:
            pass
    return None, _tail(err or out) or f"{what} exited with code {code}"


@dataclass
class _CliJob:
    """A ``pantheon`` process the page started, where its output goes, and its report once
    it has exited."""

    session_id: str
    store: Path
    started: float
    process: subprocess.Popen[bytes]
    out_path: Path
    err_path: Path
    report: dict[str, Any] | None = None
    error: str | None = None
    returncode: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def _running(self, what: str) -> bool:
        """Whether the process still runs; once it has exited, its report is read (once).
        The caller holds ``_lock``."""
        if self.returncode is not None:
            return False
        code = self.process.poll()
        if code is None:
            return True
        self.returncode = code
        out, err = _read_once(self.out_path, self.err_path)
        self.report, self.error = _report(code, out, err, what)
        return False

    @property
    def new_session_id(self) -> str | None:
        return None if self.report is None else self.report.get("new_session_id")

    def cancel(self) -> None:
        """Kill the process if it still runs (the server is going away), and remove its
        output files, which nobody will read now."""
        with self._lock:
            if self.returncode is not None:
                return  # it ended, and its files were read
            if self.process.poll() is None:
                self.process.kill()
                self.error = "killed: the dashboard that started it stopped"
            self.returncode = self.process.wait()
            self.out_path.unlink(missing_ok=True)
            self.err_path.unlink(missing_ok=True)


@dataclass(kw_only=True)
class ReplayJob(_CliJob):
    """One ``pantheon replay`` process."""

    live_effects: bool

    @classmethod
    def start(cls, store: Path, session_id: str, *, live_effects: bool = False) -> ReplayJob:
        args = ["replay", session_id, "--store", str(store), "--json"]
        if live_effects:
            args.append("--live-effects")
        process, out, err = _spawn(args, "pantheon-replay-")
        return cls(session_id, store, time.time(), process, out, err, live_effects=live_effects)

    @property
    def state(self) -> JobState:
        """Polls the process; once it has exited, reads its report (once)."""
        with self._lock:
            if self._running("pantheon replay"):
                return "running"
            if self.report is None:
                return "error"
            return "matched" if self.report.get("matched") else "diverged"


def redrive_bound(entries: int, approval_wait: float) -> float:
    """Seconds after which a redrive of ``entries`` dead letters can only be hung.

    ``pantheon dlq redrive`` bounds itself: each entry's drain times out after
    :data:`~pantheon.sessions.DEFAULT_REPLAY_TIMEOUT` plus the scenario's approval timeout
    (``approval_wait``: how long a request may wait for a person before its default
    applies). The sum of those, with one more for starting and closing the team, is the
    longest a redrive that still makes its own decisions can take, however long a person
    takes; past it the process is stuck where no timeout of its own reaches (a handler
    that never yields, a store lock), and only then does the page kill it."""
    return (max(entries, 1) + 1) * (DEFAULT_REPLAY_TIMEOUT + approval_wait)


@dataclass(kw_only=True)
class RedriveJob(_CliJob):
    """One ``pantheon dlq redrive`` process: of entry ``entry``, or of every dead letter of
    the session not yet redriven (``entry`` None).

    It runs for as long as the redrive does, waits for people included: it is killed only
    past ``deadline`` (:func:`redrive_bound`), which the CLI's own timeouts never reach,
    and that is said in :attr:`error`. ``started`` is wall-clock time, to find the
    redrive's session in the store (it starts after it)."""

    entry: int | None
    deadline: float

    @classmethod
    def start(
        cls, store: Path, session_id: str, entry: int | None = None, *, bound: float
    ) -> RedriveJob:
        """Start the redrive; ``bound`` seconds (monotonic) after now it counts as hung."""
        args = ["dlq", "redrive", session_id, "--store", str(store), "--json"]
        if entry is not None:
            args.append(str(entry))
        process, out, err = _spawn(args, "pantheon-redrive-")
        deadline = time.monotonic() + bound
        return cls(
            session_id, store, time.time(), process, out, err, entry=entry, deadline=deadline
        )

    @property
    def state(self) -> RedriveState:
        """Polls the process; once it has exited, reads its report (once). A process past
        its deadline is killed here, when a page next looks: nobody waits on it otherwise."""
        with self._lock:
            if self._running("pantheon dlq redrive"):
                if time.monotonic() < self.deadline:
                    return "running"
                self.process.kill()
                self.returncode = self.process.wait()
                _read_once(self.out_path, self.err_path)
                self.error = (
                    "pantheon dlq redrive ran past every timeout of its own (its drains "
                    "and approval waits): it was hung, and was killed"
                )
            if self.report is None:
                return "error"
            return "redriven" if self.report.get("ok") else "failed"


Job = ReplayJob | RedriveJob
_J = TypeVar("_J", ReplayJob, RedriveJob)


class JobRegistry:
    """The replay and redrive jobs of one dashboard server, shared by every browser tab: a
    job started in one tab shows in every tab, and one page's job outlives the page, but
    not the server: :meth:`close` kills what still runs, and runs when the process exits.

    At exit, because that is the one hook a stopping server passes through: Streamlit
    stops its server on SIGINT, SIGTERM and SIGQUIT and returns, and the interpreter runs
    its exit handlers (``pantheon dashboard`` execs Streamlit, so it has no process of its
    own left to do it). Without it a redrive waiting for a person outlived the dashboard
    by up to its approval timeout, and held its session ``running``. A server killed with
    SIGKILL runs nothing; its jobs end at their own timeouts."""

    def __init__(self, max_jobs: int = MAX_JOBS) -> None:
        self._jobs: list[Job] = []
        self._lock = threading.Lock()
        self.max_jobs = max_jobs
        atexit.register(self.close)

    def start(self, store: Path, session_id: str, *, live_effects: bool = False) -> ReplayJob:
        """Start a replay unless one of this session is already running (then return it)."""
        with self._lock:
            running = self._latest(store, session_id, ReplayJob)
            if running is not None and running.process.poll() is None:
                return running
            return self._add(ReplayJob.start(store, session_id, live_effects=live_effects))

    def start_redrive(
        self, store: Path, session_id: str, entry: int | None = None, *, bound: float
    ) -> RedriveJob:
        """Start a redrive unless one of this session is already running (then return it):
        two at once would deliver the same dead letters twice."""
        with self._lock:
            running = self._latest(store, session_id, RedriveJob)
            if running is not None and running.process.poll() is None:
                return running
            return self._add(RedriveJob.start(store, session_id, entry, bound=bound))

    def _add(self, job: _J) -> _J:
        self._jobs.append(job)
        finished = [j for j in self._jobs if j.process.poll() is not None]
        while len(self._jobs) > self.max_jobs and finished:
            self._jobs.remove(finished.pop(0))
        return job

    def latest(self, store: Path, session_id: str) -> ReplayJob | None:
        """The newest replay of ``session_id``, running or finished."""
        with self._lock:
            return self._latest(store, session_id, ReplayJob)

    def latest_redrive(self, store: Path, session_id: str) -> RedriveJob | None:
        """The newest redrive of ``session_id``'s dead letters, running or finished."""
        with self._lock:
            return self._latest(store, session_id, RedriveJob)

    def _latest(self, store: Path, session_id: str, kind: type[_J]) -> _J | None:
        for job in reversed(self._jobs):
            if isinstance(job, kind) and job.store == store and job.session_id == session_id:
                return job
        return None

    def close(self) -> None:
        """Kill what still runs (the server is going away); called at exit (see the class
        docstring). A second call finds nothing left to kill."""
        with self._lock:
            for job in self._jobs:
                job.cancel()
        atexit.unregister(self.close)
