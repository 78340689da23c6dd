"""A node in its own process, for the cross-process tests.

    python tests/zmq/zmq_node_child.py ENDPOINT NODE SUBSCRIPTION PATTERN OUTFILE
        [--delay SECONDS] [--heartbeat SECONDS]

Subscribes ``SUBSCRIPTION`` to ``PATTERN``, waits on the subscription barrier, prints
``ready`` on stdout, then appends ``<id> <topic> <trace> <causation>`` to OUTFILE for every
message it handles (flushed per line, so a SIGKILL loses nothing it recorded) and answers a
request with ``{"node": NODE, "doubled": payload * 2}``. Stops cleanly on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bus import Bus, Envelope  # noqa: E402
from bus.backends.zeromq import ZmqTransport  # noqa: E402


async def main() -> None:
    parser = argparse.ArgumentParser()
    for name in ("endpoint", "node", "subscription", "pattern", "outfile"):
        parser.add_argument(name)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--heartbeat", type=float, default=1.0)
    args = parser.parse_args()
    out = open(args.outfile, "a", buffering=1)  # noqa: ASYNC230, SIM115 - line-buffered log
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    transport = ZmqTransport(args.endpoint, node=args.node, heartbeat=args.heartbeat)
    async with Bus(transport=transport) as bus:

        @bus.on(args.pattern, name=args.subscription, concurrency=4)
        async def handle(env: Envelope) -> object:
            if args.delay:
                await asyncio.sleep(args.delay)
            out.write(f"{env.id} {env.topic} {env.trace} {env.causation_id}\n")
            if env.topic.startswith("ask."):
                return {"node": args.node, "doubled": env.payload * 2}
            return None

        await transport.sync()
        print("ready", flush=True)
        await stop.wait()
    out.close()


if __name__ == "__main__":
    asyncio.run(main())
