"""A one-agent team under three timing checks, optionally with its run and HOGS spinning
processes pinned to one core; prints the scheduling figure, the hop and each check.

    python starved_team.py block 6 20 0     # 200 ms time.sleep per item, 20 ms bounds, quiet
    python starved_team.py fast 3000 5 3    # no-op handler, 5 ms bounds, 3 hogs on its core
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pantheon.testing import run_scenario

AGENTS = """
import time


async def block(env):
    time.sleep(0.2)


async def fast(env):
    return None
"""


def main() -> None:
    handler, count, bound, hogs = (
        sys.argv[1],
        int(sys.argv[2]),
        float(sys.argv[3]),
        int(sys.argv[4]),
    )
    folder = Path(tempfile.mkdtemp())
    (folder / "agents_x.py").write_text(AGENTS)
    path = folder / "scenario.yaml"
    path.write_text(
        f"""version: 1
name: starved
input: {{kind: generator, topic: item.new, payload: {{n: 1}}, count: {count}}}
agents:
  worker:
    handler: "agents_x:{handler}"
    subscribe: ["item.new"]
expect:
  zero_lost: true
  p99_handling_ms: {bound}
  p99_queue_wait_ms: {bound}
  max_p99_ms: {bound}
"""
    )
    saved = os.sched_getaffinity(0)
    core = min(saved)
    spin = f"import os\nos.sched_setaffinity(0, {{{core}}})\nwhile True: pass"
    procs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(hogs)]
    if hogs:
        os.sched_setaffinity(0, {core})
    time.sleep(0.2)
    try:
        s = run_scenario(path, record=False)
    finally:
        os.sched_setaffinity(0, saved)
        for p in procs:
            p.kill()
            p.wait()
    print(json.dumps(s.scheduling), json.dumps(s.hops["worker"]))
    for e in s.expectations:
        print(e["state"], e["name"], e["actual"], e.get("why", ""))


if __name__ == "__main__":
    main()
