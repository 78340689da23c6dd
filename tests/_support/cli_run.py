"""``pantheon`` as a user runs it in a terminal: a child process of this interpreter, its
output captured, at a width where no report line or table is cut (rich wraps and squeezes at
the terminal's width, which a test's assertions must not depend on)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["pantheon"]


def pantheon(
    *args: str,
    cwd: Path,
    timeout: float = 180,
    columns: int = 250,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``pantheon ARGS`` in ``cwd``; ``env`` (default: this process's) gets
    ``COLUMNS=columns``."""
    return subprocess.run(
        [sys.executable, "-m", "pantheon.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**(os.environ if env is None else env), "COLUMNS": str(columns)},
    )
