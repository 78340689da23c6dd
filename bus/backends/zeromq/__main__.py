"""``python -m bus.backends.zeromq broker --bind ADDR [--curve-secret FILE --allow DIR]``.

Runs a broker until SIGINT or SIGTERM. Prints one JSON line on stdout when it is listening
(``{"endpoint": ...}``: the real address, so ``tcp://127.0.0.1:0`` is useful) and logs to
stderr. ``keygen PATH`` writes a CURVE key pair (``PATH.key`` and ``PATH.key_secret``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import signal
import sys

from bus.backends.zeromq._broker import Broker
from bus.backends.zeromq._keys import CurveKeys, load_public_keys
from bus.backends.zeromq._wire import DEFAULT_MAX_FRAME


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bus.backends.zeromq")
    commands = parser.add_subparsers(dest="command", required=True)
    broker = commands.add_parser("broker", help="run a broker")
    broker.add_argument("--bind", default="tcp://127.0.0.1:5555")
    broker.add_argument("--curve-secret", help="the broker's .key_secret certificate")
    broker.add_argument("--allow", help="directory (or file) of allowed node public keys")
    broker.add_argument("--heartbeat", type=float, default=1.0)
    broker.add_argument("--liveness", type=int, default=3)
    broker.add_argument("--max-frame", type=int, default=DEFAULT_MAX_FRAME)
    broker.add_argument("--log-level", default="INFO")
    keygen = commands.add_parser("keygen", help="write a CURVE key pair")
    keygen.add_argument("path")
    args = parser.parse_args(argv)
    if args.command == "keygen":
        public, secret = CurveKeys.generate().save(args.path)
        print(json.dumps({"public": str(public), "secret": str(secret)}))
        return 0
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if (args.curve_secret is None) != (args.allow is None):
        parser.error(
            "--curve-secret and --allow go together (a CURVE broker admits only the "
            "node keys in --allow, so without it every node would be refused)"
        )
    try:
        curve = CurveKeys.load(args.curve_secret) if args.curve_secret else None
        allow = load_public_keys(args.allow) if args.allow else []
    except ValueError as exc:
        parser.error(str(exc))
    server = Broker(
        args.bind,
        curve=curve,
        allow=allow,
        heartbeat=args.heartbeat,
        liveness=args.liveness,
        max_frame=args.max_frame,
    )
    try:
        asyncio.run(_serve(server))
    except OSError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


async def _serve(server: Broker) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with server:
        print(json.dumps({"endpoint": server.endpoint, "pid": _pid()}), flush=True)
        await stop.wait()
        logging.getLogger("bus.zeromq.broker").info("stopping: %s", json.dumps(server.stats()))


def _pid() -> int:
    import os

    return os.getpid()


if __name__ == "__main__":
    sys.exit(main())
