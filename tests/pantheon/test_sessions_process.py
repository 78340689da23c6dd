"""The store across real processes: a SIGKILLed recorder, and a reader beside a writer."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from pantheon.sessions import DEFAULT_COMMIT_INTERVAL, SessionStore

CHILD = Path(__file__).with_name("sessions_child.py")
#: Slack on top of the commit interval for the loss bound: one ticker period (10 ms), the
#: commit itself, and scheduling noise on a loaded CI machine.
MARGIN = 0.25

pytestmark = pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")


class Child:
    """The recording child process; its stdout lines are timestamped as they arrive."""

    def __init__(self, store: Path, count: int, interval: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(CHILD), str(store), str(count), str(interval)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self.lines: list[str] = []
        self.emitted: list[tuple[int, float]] = []
        self.session_id: str | None = None
        self.stderr = ""
        self._ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            line = line.strip()
            self.lines.append(line)
            if line.startswith("session "):
                self.session_id = line.split()[1]
            elif line and line[0].isdigit():
                env_id, stamp = line.split()
                self.emitted.append((int(env_id), float(stamp)))
                self._ready.set()

    def wait_emitting(self, timeout: float = 30.0) -> None:
        if not self._ready.wait(timeout):
            self.proc.kill()
            self.finish()
            pytest.fail(f"child never emitted: {self.stderr}")

    def finish(self, timeout: float = 60.0) -> int:
        code = self.proc.wait(timeout)
        self._reader.join(timeout)
        assert self.proc.stdout is not None and self.proc.stderr is not None
        self.stderr = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return code


def test_sigkill_loses_at_most_the_last_group_commit(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    child = Child(path, count=0, interval=0.001)
    child.wait_emitting()
    time.sleep(1.5)
    killed_at = time.time()
    os.kill(child.proc.pid, signal.SIGKILL)
    assert child.finish() == -signal.SIGKILL
    assert child.session_id is not None and len(child.emitted) > 100

    with SessionStore(path) as store:  # opening reaps the dead session
        info = store.session(child.session_id)
        assert info.status == "aborted"
        assert info.ended is not None and info.ended <= killed_at
        stored = {e.id for e in store.envelopes(info.id)}
        assert store.counts(info.id)["journal_chunks"] == 0  # materialized on reap
    bound = DEFAULT_COMMIT_INTERVAL + MARGIN
    must_have = [(i, t) for i, t in child.emitted if t < killed_at - bound]
    lost = [(i, t) for i, t in child.emitted if i not in stored]
    assert must_have and not [i for i, _ in must_have if i not in stored]
    # What was lost is only the tail: everything after the first loss is lost too.
    if lost:
        newest_kept = max(t for i, t in child.emitted if i in stored)
        assert min(t for _, t in lost) >= newest_kept - 1e-6
        oldest = killed_at - min(t for _, t in lost)
        print(f"lost {len(lost)} of {len(child.emitted)}, oldest {oldest:.3f}s before the kill")
    else:
        print(f"lost none of {len(child.emitted)}")


def test_a_reader_process_sees_a_run_while_it_writes(tmp_path: Path) -> None:
    path = tmp_path / "sessions.db"
    child = Child(path, count=1500, interval=0.001)
    child.wait_emitting()
    assert child.session_id is not None
    seen: list[int] = []
    statuses: set[str] = set()
    with SessionStore(path) as store:
        while child.proc.poll() is None:
            info = store.session(child.session_id)
            statuses.add(info.status)
            seen.append(len(store.envelopes(info.id)))
            time.sleep(0.1)
        assert child.finish() == 0, child.stderr
        info = store.session(child.session_id)
        assert info.status == "completed" and info.summary == {"emitted": 1500}
        total = store.counts(info.id)
    assert "running" in statuses  # never reaped while its writer was alive
    growing = [b for a, b in itertools.pairwise(seen) if b > a]
    assert len(growing) >= 3, seen  # watched it grow, live
    assert total["envelopes"] == 1500 * 3 and total["deliveries"] == 1500 * 3
