"""The dashboard tests' recorded store, as their ``recorded`` fixture hands it over
(``tests/dashboard/conftest.py``). Here rather than in that conftest: a test module that
said ``from conftest import Recorded`` got whichever ``conftest`` module Python had
imported first, ``tests/nats``' when both folders were collected in one run.

On ``sys.path`` through pytest's ``pythonpath`` (see ``model_session.py`` beside it).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Recorded"]


@dataclass(frozen=True)
class Recorded:
    """A store with a failed session (dead letters) and a passed one."""

    path: Path
    failed: str
    passed: str
