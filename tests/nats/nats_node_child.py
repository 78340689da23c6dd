"""A NATS node in its own process, for the fault tests.

    python tests/nats/nats_node_child.py URL TEAM NODE SUBSCRIPTION PATTERN OUTFILE
        [--delay SECONDS] [--ack-wait SECONDS] [--credit N] [--session ID]

Subscribes ``SUBSCRIPTION`` to ``PATTERN``, waits on the subscription barrier, prints
``ready`` on stdout, then appends ``<payload>`` to OUTFILE for every message it handles
(flushed per line, so a SIGKILL loses nothing it recorded). Stops cleanly on SIGTERM and
then prints its transport's stats as one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bus import Bus, Envelope  # noqa: E402
from bus.backends.nats import NatsTransport  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("url", "team", "node", "subscription", "pattern", "outfile"):
        parser.add_argument(name)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--ack-wait", type=float, default=30.0)
    parser.add_argument("--credit", type=int, default=256)
    parser.add_argument("--session", default=None)
    args = parser.parse_args()
    out = open(args.outfile, "a", buffering=1)  # noqa: ASYNC230, SIM115 - line-buffered log
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    transport = NatsTransport(
        args.url, team=args.team, node=args.node, ack_wait=args.ack_wait, credit=args.credit
    )
    async with Bus(transport=transport, session_id=args.session) as bus:

        @bus.on(args.pattern, name=args.subscription, concurrency=4)
        async def handle(env: Envelope) -> None:
            if args.delay:
                await asyncio.sleep(args.delay)
            out.write(f"{env.payload}\n")

        await transport.sync()
        print("ready", flush=True)
        await stop.wait()
    out.close()
    print(json.dumps(transport.stats()), flush=True)


if __name__ == "__main__":
    asyncio.run(main())
