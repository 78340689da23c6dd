"""What recording a request digest costs per effect call.

Run: ``.venv/bin/python benchmarks/digest_bench.py [CALLS] [REPEATS]``. Times
:func:`pantheon.sessions._digest.request_digest` on the requests the shipped teams make
(best of REPEATS, CALLS each, thread CPU per call), and a recorded effect call
(``RecordingEffects.effect`` on ``time.time``, the loop's whole recording path) with the
digest and with it stubbed out, alternating, so the difference is what the digest adds to
every call.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agents import Agent, OpenAIProvider, tool
from agents._base import _recorded_chat
from pantheon.runner import _build as _team
from pantheon.scenario import parse_scenario
from pantheon.sessions import _effects as effects_module
from pantheon.sessions._digest import request_digest
from pantheon.sessions._effects import RecordingEffects

ROOT = Path(__file__).resolve().parents[1]


def lookup(order_id: str) -> dict[str, Any]:
    """What was paid for an order."""
    return {"order_id": order_id}


def _support_call() -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """The support desk's classification: the rule provider with the shipped rules."""
    text = (ROOT / "scenarios" / "support_email.yaml").read_text()
    scenario = parse_scenario(text, "support_email.yaml", ROOT / "scenarios")
    provider = _team._provider(scenario)
    messages = [
        {"role": "system", "content": "Classify the email as one of the intents."},
        {"role": "user", "content": "Subject: refund\n\nI want my money back for order 123."},
    ]
    return _recorded_chat, (provider, messages, {}, None), {}


def _agent_turn() -> tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]:
    """A model agent's third turn: instructions, the ask, two tool calls and their
    results, the tools' schemas and a JSON-schema answer format (about 2 KB of request)."""
    provider = OpenAIProvider("http://127.0.0.1:1/v1", model="gpt-4o-mini")
    schema = {"type": "object", "properties": {"order_id": {"type": "string"}}}
    tools = [
        {"type": "function", "function": {"name": f"tool{i}", "description": "x" * 80,
                                          "parameters": schema}}
        for i in range(4)
    ]  # fmt: skip
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "You handle refunds for Ada. Use the tools. " * 4},
        {"role": "user", "content": '{"ticket": "T-1", "customer": "Ada", "order": "A-1"}'},
    ]
    for i in range(2):
        messages.append(
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": f"c{i}", "type": "function",
                 "function": {"name": "tool0", "arguments": '{"order_id": "A-1"}'}}]}
        )  # fmt: skip
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": '{"paid": 40.0}'})
    options = {
        "tools": tools,
        "response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": schema}},
    }
    return _recorded_chat, (provider, messages, options, None), {}


class _Reader(Agent):
    def read(self) -> int:
        return 0


CASES: dict[str, tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]] = {
    "clock.now (time.time, no arguments)": (time.time, (), {}),
    "tool call (FunctionTool, one argument)": (tool(lookup), ({"order_id": "A-1"},), {}),
    "support desk model call (rules)": _support_call(),
    "model agent turn 3 (~2 KB request)": _agent_turn(),
    "an agent's own method (no digest)": (_Reader("r").read, (), {}),
}


def per_call(
    fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any], n: int
) -> float:
    started = time.thread_time()
    for _ in range(n):
        request_digest(fn, args, kwargs)
    return (time.thread_time() - started) / n


async def recorded(n: int) -> float:
    runner = RecordingEffects([].append)
    started = time.thread_time()
    for _ in range(n):
        await runner.effect("clock.now", time.time)
    return (time.thread_time() - started) / n


def main() -> None:
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 7
    print(f"calls: {calls}, repeats: {repeats} (best of each, thread CPU per call)")
    for name, (fn, args, kwargs) in CASES.items():
        best = min(per_call(fn, args, kwargs, calls) for _ in range(repeats))
        print(f"  {name:<42} {best * 1e6:6.2f} µs")
    real = effects_module.request_digest
    with_digest, without = [], []
    for _ in range(repeats):
        effects_module.request_digest = real  # type: ignore[attr-defined]
        with_digest.append(asyncio.run(recorded(calls)))
        effects_module.request_digest = lambda fn, args, kwargs: None  # type: ignore[attr-defined]
        without.append(asyncio.run(recorded(calls)))
    effects_module.request_digest = real  # type: ignore[attr-defined]
    a, b = min(without), min(with_digest)
    print(
        f"recorded clock.now: {a * 1e6:.2f} µs without the digest, {b * 1e6:.2f} µs with "
        f"(+{(b - a) * 1e6:.2f} µs)"
    )


if __name__ == "__main__":
    main()
