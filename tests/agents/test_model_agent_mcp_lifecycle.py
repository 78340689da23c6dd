"""A model agent's MCP servers over its life: a start that fails fails every message with
its real cause (each message tries again), and a stopping agent closes them only once the
handling under way is done with them, then never starts them again. Real things: the notes
server of ``pantheon.testing.mcp_notes`` over stdio, the stand-in model server over HTTP."""

from __future__ import annotations

import asyncio
import json
import sys
import threading
from pathlib import Path
from typing import Any

from test_mcp import notes_command, processes_with

from agents import AgentStopping, MCPServer, ModelAgent, OpenAIProvider
from pantheon.testing import ModelServer, Reply, agent_harness

#: Seconds a message may take: its handling starts the stdio server (the SDK's import alone
#: is about 1 s on a quiet machine), which the harness's default 5 s would not always cover.
START = 60.0


def _tool_results(request: dict[str, Any]) -> list[Any]:
    return [json.loads(m["content"]) for m in request["messages"] if m["role"] == "tool"]


async def test_a_server_that_cannot_start_fails_every_message_with_its_cause(
    tmp_path: Path,
) -> None:
    script = tmp_path / "fleet_servr.py"  # a typo: the server's script is not there
    fleet = MCPServer(command=[sys.executable, str(script)], name="fleet", start_timeout=START)

    def model(request: dict[str, Any]) -> Reply:
        raise AssertionError("the model was asked, though the tools could not be listed")

    cause = (
        "MCP server 'fleet' could not be started: its process closed the connection before it "
        f"listed its tools; it ran {sys.executable} {script} in {Path.cwd()}; its stderr ends:\n"
        f"{sys.executable}: can't open file '{script}': [Errno 2] No such file or directory"
    )
    with ModelServer(model) as server:
        async with (
            OpenAIProvider(server.base_url, model="stand-in", max_retries=0) as provider,
            agent_harness(
                ModelAgent, name="triage", subscribe=["alert"], tools=[fleet], provider=provider
            ) as h,
        ):
            for alert in ("A-1", "A-2", "A-3"):
                await h.send("alert", {"id": alert}, timeout=START, check=False)
    assert len(h.dead_letters) == 3
    # Each message tried the start again and was told why it failed, not "already started".
    assert {(d.error_type, d.error) for d in h.dead_letters} == {("MCPServerUnavailable", cause)}
    listings = h.calls("tools.list")
    assert len(listings) == sum(d.attempts for d in h.dead_letters)  # each one tried afresh
    assert {str(c.error) for c in listings} == {cause}


async def test_stop_leaves_the_server_to_the_handling_under_way_then_never_restarts_it(
    tmp_path: Path,
) -> None:
    """What a node whose driver died does: it stops its agents with a message in flight
    (here: waiting on the model between two tool calls), and one still queued."""
    db = tmp_path / "notes.sqlite"
    notes = MCPServer(command=notes_command(db), timeout=20, start_timeout=START)
    asked_again = threading.Event()
    release = threading.Event()

    def model(request: dict[str, Any]) -> Reply:
        results = _tool_results(request)
        if not results:
            return Reply(
                tool_calls=[{"name": "add_note", "arguments": {"title": "t", "text": "x"}}]
            )
        if len(results) == 1:
            asked_again.set()
            assert release.wait(START), "the test never let the model answer"
            return Reply(tool_calls=[{"name": "find_notes", "arguments": {"query": "x"}}])
        return Reply(f"found {[n['id'] for n in results[1]['notes']]}")

    with ModelServer(model) as server:
        async with (
            OpenAIProvider(server.base_url, model="stand-in", max_retries=0) as provider,
            agent_harness(
                ModelAgent,
                name="desk",
                subscribe=["ask"],
                tools=[notes],
                settings={"output_topic": "answered"},
                provider=provider,
            ) as h,
        ):
            first = asyncio.create_task(h.send("ask", {"q": "1"}, timeout=START))
            await asyncio.to_thread(asked_again.wait, START)
            await h.agent.stop()  # returns: the handling under way keeps the server
            assert len(processes_with(db)) == 1
            release.set()
            await first
            # Its second tool call was answered by the live server, not "server closed",
            # and the handling, the last one, closed the server as it ended.
            assert h.published("answered") == [{"answer": "found [1]"}]
            assert processes_with(db) == []

            # A message after that fails at once, naming the stop; the server is not started.
            await h.send("ask", {"q": "2"}, timeout=START, check=False)
            assert processes_with(db) == []
        asked = len(server.requests)
    assert asked == 3  # the second message never reached the model
    [dead] = h.dead_letters
    assert dead.error_type == "AgentStopping"
    assert dead.error == (
        "model agent 'desk' is stopping: its tool sources are closed and a stopping agent "
        "does not start them again"
    )
    listings = h.calls("tools.list")
    assert [c.error is None for c in listings] == [True] + [False] * dead.attempts
    assert all(isinstance(c.error, AgentStopping) for c in listings[1:])


async def test_a_stopped_agent_started_again_starts_its_server_again(tmp_path: Path) -> None:
    db = tmp_path / "notes.sqlite"
    notes = MCPServer(command=notes_command(db), timeout=20, start_timeout=START)

    def model(request: dict[str, Any]) -> Reply:
        results = _tool_results(request)
        if not results:
            return Reply(tool_calls=[{"name": "find_notes", "arguments": {"query": "x"}}])
        return Reply("done")

    with ModelServer(model) as server:
        async with (
            OpenAIProvider(server.base_url, model="stand-in", max_retries=0) as provider,
            agent_harness(
                ModelAgent, name="desk", subscribe=["ask"], tools=[notes], provider=provider
            ) as h,
        ):
            for _ in range(2):
                assert await h.request("ask", {"q": "x"}, timeout=START) == "done"
                assert len(processes_with(db)) == 1
                await h.agent.stop()  # nothing under way: closed before it returns
                assert processes_with(db) == []
                await h.agent.start()
    assert [c.name for c in h.effects].count("tools.list") == 2
