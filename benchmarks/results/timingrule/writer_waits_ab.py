"""support_email recorded beside N busy loops, the session writer's waits for a CPU counted
(after) or not (before), alternated in one process.

    python writer_waits_ab.py 4 3     # 4 busy loops, 3 pairs
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pantheon.sessions._recorder as rec
from pantheon.testing import run_scenario

SCENARIO = Path(__file__).resolve().parents[3] / "scenarios" / "support_email.yaml"


def main() -> None:
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(int(sys.argv[1]))
    ]
    real = rec.beside_the_loop
    store = Path(tempfile.mkdtemp()) / "ab.db"
    try:
        time.sleep(0.3)
        for _ in range(int(sys.argv[2])):
            for mode in ("before", "after"):
                rec.beside_the_loop = real if mode == "after" else contextlib.nullcontext  # type: ignore[assignment]
                s = run_scenario(SCENARIO, store=store)
                r = s.hops["reasoner"]
                states = [e["state"] for e in s.expectations]
                print(
                    mode,
                    f"load {os.getloadavg()[0]:.1f} share {s.scheduling['share']:.2f}",
                    f"reasoner handle {r['handle_p99_ms']:.1f} own {r['own_p99_ms']:.1f}",
                    f"cpu {r['cpu_p99_ms']:.1f} failed {states.count('failed')}",
                    f"inconclusive {states.count('inconclusive')}",
                    flush=True,
                )
    finally:
        for h in hogs:
            h.kill()


if __name__ == "__main__":
    main()
