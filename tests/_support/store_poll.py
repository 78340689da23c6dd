"""Waiting on a run from outside, as a user watching its store would: poll a condition, and
read a session store another process is still writing (a store not created yet, or locked
while its driver creates it, reads as empty)."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path


def until(what: str, check: Callable[[], object], timeout: float = 120.0) -> None:
    """Poll ``check`` until it is truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def query(db: Path, sql: str) -> list[tuple[object, ...]]:
    """``sql``'s rows in the store at ``db``; none while the store is not there or not ready."""
    if not db.exists():
        return []
    try:
        with sqlite3.connect(db, timeout=5) as conn:
            return conn.execute(sql).fetchall()
    except sqlite3.OperationalError:  # the driver is still creating it
        return []
