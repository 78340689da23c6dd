"""Session store size per 100,000 messages.

    python benchmarks/store_size.py [N]

Records N messages (default 100,000; a small dict payload like an email observation, one
subscriber, so one envelope row and one delivery row each) into a fresh store, finishes the
session, checkpoints the WAL and reports the database file's size per 100,000 messages.
"""

from __future__ import annotations

import asyncio
import sqlite3
import sys
import tempfile
from pathlib import Path

from bus import Bus
from pantheon.sessions import Recorder, SessionStore


async def record(path: Path, n: int) -> None:
    with SessionStore(path) as store:
        recorder = Recorder(store, scenario="store_size", scenario_text="", seed=0)
        async with Bus(session_id=recorder.session_id) as bus:

            async def handle(env: object) -> None:
                return None

            bus.on("observation.email.received", handle, name="sensor")
            recorder.attach(bus)
            for i in range(n):
                await bus.emit(
                    "observation.email.received",
                    {"id": f"e{i:06d}", "from": "jane@example.com", "subject": "Refund ORD-1"},
                )
            await bus.drain()
        await recorder.finish("completed", {})


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 100_000
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "sessions.db"
        asyncio.run(record(path, n))
        conn = sqlite3.connect(path)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        envelopes = conn.execute("select count(*) from envelopes").fetchone()[0]
        deliveries = conn.execute("select count(*) from deliveries").fetchone()[0]
        conn.close()
        size = path.stat().st_size
    print(f"{n:,} messages: {envelopes:,} envelope rows, {deliveries:,} delivery rows")
    print(f"store: {size / 1e6:.1f} MB, {size / n * 100_000 / 1e6:.1f} MB per 100,000 messages")


if __name__ == "__main__":
    main()
