"""What the model agent's tool loop costs per turn, beside the model server's own time.

    python benchmarks/model_agent_bench.py [--messages 100] [--repeats 5]

One :class:`agents.ModelAgent` with one Python tool on a bus, against
``pantheon.testing.ModelServer`` (OpenAI protocol, no added delay), answering each message in
three turns: two turns that call the tool, then the structured answer (validated against a
JSON schema). Measured, alternating, ``--repeats`` times each:

- ``chat``: ``OpenAIProvider.chat`` alone with the same tools and response format, per call
  (the HTTP round trip to the stand-in and its JSON, which is the floor a turn cannot beat);
- ``turn``: ``bus.request`` of a message to the agent, divided by its three turns (the
  loop's model calls through the recorded-effect path, two tool calls with argument
  validation, the answer's validation and the bus's own dispatch).

Reported: the best (minimum) of each, and ``turn - chat``, the loop's own cost per turn.
The stand-in runs in a thread of this process, so its request handling shares the GIL with
the loop: the absolute figures are this machine's, the difference is the loop's.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

from agents import ModelAgent, OpenAIProvider
from bus import Bus
from pantheon.testing import ModelServer, Reply

SCHEMA = {"type": "object", "properties": {"sum": {"type": "integer"}}, "required": ["sum"]}


def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def responder(request: dict[str, Any]) -> Reply:
    calls = sum(1 for m in request["messages"] if m["role"] == "tool")
    if calls < 2:
        return Reply(tool_calls=[{"name": "add", "arguments": {"a": calls, "b": 1}}])
    return Reply('{"sum": 3}')


async def measure(messages: int, repeats: int) -> dict[str, float]:
    with ModelServer(responder) as server:
        async with OpenAIProvider(server.base_url, model="stand-in") as provider:
            agent = ModelAgent(
                "adder", subscribe=["q"], tools=[add], output=SCHEMA, provider=provider
            )
            async with Bus() as bus:
                await agent.attach(bus)
                await agent.start()
                prompt = [{"role": "user", "content": "add"}]
                fmt = agent.response_format()
                for _ in range(20):  # warm the connection pool and the loop
                    await provider.chat(prompt)
                    await bus.request("q", {"x": 1}, timeout=30)
                chat, turn = [], []
                for _ in range(repeats):
                    t = time.perf_counter()
                    for _ in range(messages * 3):
                        await provider.chat(prompt, tools=agent._schemas, response_format=fmt)
                    chat.append((time.perf_counter() - t) / (messages * 3))
                    t = time.perf_counter()
                    for _ in range(messages):
                        await bus.request("q", {"x": 1}, timeout=30)
                    turn.append((time.perf_counter() - t) / (messages * 3))
                await agent.stop()
    return {"chat_us": min(chat) * 1e6, "turn_us": min(turn) * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    r = asyncio.run(measure(args.messages, args.repeats))
    print(
        f"chat alone {r['chat_us']:.0f} us/call; agent {r['turn_us']:.0f} us/turn; "
        f"the loop's own cost {r['turn_us'] - r['chat_us']:.0f} us/turn "
        f"({(r['turn_us'] - r['chat_us']) / r['chat_us']:.0%} of a call to the stand-in)"
    )


if __name__ == "__main__":
    main()
