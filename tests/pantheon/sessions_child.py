"""A process that records a session continuously, for the crash and concurrency tests.

``python sessions_child.py STORE COUNT INTERVAL_S`` records a session into STORE, emitting
COUNT inputs (0: forever) one every INTERVAL_S seconds through the test team, and prints
``session <id>`` first, then ``<envelope id> <wall time>`` after each emit (the emit has
returned, so the recorder holds the envelope). It finishes the session normally when COUNT
is reached; the crash test kills it with SIGKILL long before.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from sessions_team import email, make_setup

from bus import Bus
from pantheon.sessions import Recorder, SessionStore


async def main(store_path: str, count: int, interval: float) -> None:
    store = SessionStore(store_path)
    recorder = Recorder(store, scenario="child", scenario_text="fixed", seed=1)
    print(f"session {recorder.session_id}", flush=True)
    async with Bus() as bus:
        recorder.attach(bus)
        await make_setup("fixed")(bus)
        n = 0
        while count == 0 or n < count:
            env = await bus.emit("email.received", email(n))
            print(f"{env.id} {time.time():.6f}", flush=True)
            n += 1
            await asyncio.sleep(interval)
        await bus.drain()
    await recorder.finish("completed", {"emitted": n})
    print("done", flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3])))
