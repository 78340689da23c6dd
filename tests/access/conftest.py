"""The access desk lives in ``scenarios/access/``, imported as ``access`` the way loading its
scenario makes it importable: with the scenario's folder on the path."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = ROOT / "scenarios"

if str(SCENARIOS) not in sys.path:
    sys.path.insert(0, str(SCENARIOS))
