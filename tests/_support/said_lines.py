"""What a ``pantheon`` process says while it runs, line by line, to a test that acts on it
(runs the ``pantheon approve`` commands a waiting run prints, as a person would).

A thread reads the stream into a queue: a pipe or a pty holds a few KiB, so a child that
writes more than that would block unless someone reads while it runs. A pty's output is
read as a terminal shows it: the progress bar's redraws (carriage returns, ANSI codes) are
cut into the lines they draw.

On ``sys.path`` through pytest's ``pythonpath`` (see ``model_session.py`` beside it).
"""

from __future__ import annotations

import os
import queue
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

__all__ = ["Said", "approve_as_printed"]

#: ANSI escape sequences (colours, cursor moves, erasing) as rich writes them to a terminal.
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|\x1b\][^\x07]*\x07")


class Said:
    """The lines a process writes to ``stream`` (a text pipe) or to the pty whose master
    end is ``fd``, in order; :meth:`expect` waits for the next line that matches."""

    def __init__(self, stream: IO[str] | None = None, *, fd: int | None = None) -> None:
        self.lines: list[str] = []
        self._ended = False
        self._queue: queue.Queue[str | None] = queue.Queue()
        target: Callable[[], None]
        if stream is not None:
            target = lambda: self._pipe(stream)  # noqa: E731
        elif fd is not None:
            target = lambda: self._pty(fd)  # noqa: E731
        else:
            raise TypeError("Said needs a stream or a pty's fd")
        threading.Thread(target=target, daemon=True).start()

    def _pipe(self, stream: IO[str]) -> None:
        for line in stream:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def _pty(self, fd: int) -> None:
        rest = ""
        while True:
            try:
                data = os.read(fd, 65536)
            except OSError:  # EIO once the child has exited and closed its end
                break
            if not data:
                break
            rest += ANSI.sub("", data.decode(errors="replace"))
            *lines, rest = re.split(r"\r\n|\r|\n", rest)
            for line in lines:
                if line.strip():
                    self._queue.put(line)
        if rest.strip():
            self._queue.put(rest)
        self._queue.put(None)

    def expect(self, pattern: str, timeout: float) -> re.Match[str]:
        """The next line (after the ones already taken) that ``pattern`` matches from its
        start; fails naming what came instead when the stream ends or ``timeout`` passes."""
        found = self.expect_or_end(pattern, timeout)
        if found is None:
            raise AssertionError(f"no line like {pattern!r} before the end; said: {self.lines}")
        return found

    def until_end(self, timeout: float) -> list[str]:
        """Every line up to the end of the stream (all of :attr:`lines` then)."""
        while self.expect_or_end(r"(?!)", timeout) is not None:  # matches no line
            pass
        return self.lines

    def expect_or_end(self, pattern: str, timeout: float) -> re.Match[str] | None:
        """As :meth:`expect`, but None when the stream ends first."""
        deadline = time.monotonic() + timeout
        while not self._ended:
            try:
                line = self._queue.get(timeout=max(deadline - time.monotonic(), 0.01))
            except queue.Empty:
                raise AssertionError(
                    f"no line like {pattern!r} within {timeout}s; said: {self.lines}"
                ) from None
            if line is None:
                self._ended = True
                break
            self.lines.append(line)
            found = re.match(pattern, line)
            if found is not None:
                return found
        return None


def approve_as_printed(line: str, cwd: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    """Run a ``  pantheon approve ...   # what`` line as a person pastes it into a shell
    (the comment is the shell's to ignore), with ``extra`` arguments after it."""
    argv = shlex.split(line, comments=True)
    assert argv[:2] == ["pantheon", "approve"], line
    return subprocess.run(
        [sys.executable, "-m", "pantheon.cli", *argv[1:], *extra],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
    )
