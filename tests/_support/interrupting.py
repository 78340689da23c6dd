"""Ctrl-C of a real ``pantheon run``, as a terminal sends it: to the driver alone, once the
run is under way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path


def run_and_interrupt(
    workdir: Path, path: str | Path, ready: Callable[[], bool], what: str, *, times: int = 1
) -> subprocess.CompletedProcess[str]:
    """``pantheon run PATH --store s.db --json`` in ``workdir``, SIGINTed ``times`` times
    (0.3 s apart) once ``ready()`` holds; fails saying ``what`` never came if the run ends
    or 120 s pass first. Returns the finished process."""
    args = [sys.executable, "-m", "pantheon.cli", "run", str(path), "--store", "s.db", "--json"]
    proc = subprocess.Popen(
        args, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=os.environ | {"COLUMNS": "250"},
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 120
        while not ready():
            assert proc.poll() is None and time.monotonic() < deadline, f"{what} never came"
            time.sleep(0.05)
        for _ in range(times):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.3)
        out, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)
