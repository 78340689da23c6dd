"""``python -m pantheon.testing``: a stand-in model server on 127.0.0.1 speaking the OpenAI
chat-completions and the Anthropic Messages protocols, for trying a team's model calls,
tokens and replays with no real model (see docs/tutorial.md).

By default it answers every request in the shape asked for (:func:`schema_reply`); with
``--reply module:function`` it answers with that function of the request body instead (the
one a scenario's ``provider.stand_in`` names, so a team's scripted model can be served on
its own), importing it from ``--path`` folders first. It counts tokens as words; point a
``kind: openai`` scenario's ``provider.base_url`` at the address it prints, a ``kind:
anthropic`` one at the same address without ``/v1``.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import threading

from pantheon.standin import ModelServer, Responder, load_reply, schema_reply


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m pantheon.testing", description=__doc__)
    parser.add_argument("--port", type=int, default=8099, help="port on 127.0.0.1 (0: any)")
    parser.add_argument("--delay", type=float, default=0.005, help="seconds per answer")
    parser.add_argument("--model", default=None, help="model name to answer with")
    parser.add_argument(
        "--reply", default=None, help="answer with this function of the request: module:name"
    )
    parser.add_argument(
        "--path",
        action="append",
        default=[],
        help="a folder to import --reply from (a scenario's folder); may be repeated",
    )
    args = parser.parse_args()
    reply: Responder = schema_reply
    if args.reply is not None:
        sys.path[:0] = args.path
        try:
            reply = load_reply(args.reply)
        except ValueError as exc:
            parser.error(f"--reply: {exc}")
    with ModelServer(reply, delay=args.delay, model=args.model, port=args.port) as server:
        print(f"model server at {server.base_url} (Ctrl-C stops it)", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            threading.Event().wait()


if __name__ == "__main__":
    main()
