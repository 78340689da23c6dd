"""Generate the alert stream that ``scenarios/oncall.yaml`` feeds the on-call team.

    python scenarios/data/make_oncall_alerts.py --seed 11 --count 800 \\
        -o scenarios/data/oncall_alerts.jsonl

The generator is part of the team's folder (``scenarios/oncall/alerts.py``, where its
docstring says what the stream holds); this script only puts that folder's parent on the
import path, as loading the scenario does, and runs it.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from oncall.alerts import main

if __name__ == "__main__":
    raise SystemExit(main())
