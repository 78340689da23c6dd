"""An MCP tool's error inside a model agent's loop goes back to the model as the tool's
result, bounded by ``max_tool_errors`` as a Python tool's is; an MCP server that dies fails
the message instead (dead-lettered with ``MCPServerUnavailable`` naming server and tool),
the model never told. Real things: a stdio MCP server on the official SDK, the stand-in model
server over HTTP."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from agents import MCPServer, MCPServerUnavailable, ModelAgent, OpenAIProvider
from pantheon.testing import ModelServer, Reply, agent_harness

SERVER = '''
import os

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("shelf", log_level="WARNING")
BOOKS = {"a": "Dune"}


@server.tool()
async def find(key: str) -> dict:
    """A book by its key."""
    if key not in BOOKS:
        raise ToolError(f"no book {key!r} on the shelf")
    return {"key": key, "title": BOOKS[key]}


@server.tool()
async def crash() -> dict:
    """End the server's process, as a server that dies does."""
    os._exit(3)


server.run("stdio")
'''

#: Seconds a message may take: its handling starts the stdio server (the SDK's import alone
#: is about 1 s on a quiet machine), which the harness's default 5 s would not always cover.
START = 60.0


def _shelf(tmp_path: Path) -> MCPServer:
    script = tmp_path / "shelf_server.py"
    script.write_text(SERVER, encoding="utf-8")
    return MCPServer(command=[sys.executable, str(script)], timeout=20.0, start_timeout=60.0)


def _tool_messages(request: dict[str, Any]) -> list[str]:
    return [str(m["content"]) for m in request["messages"] if m["role"] == "tool"]


def _librarian(tmp_path: Path, **settings: Any) -> dict[str, Any]:
    """``agent_harness`` arguments for a model agent with the shelf server as its tools."""
    return {
        "name": "librarian",
        "subscribe": ["ask"],
        "tools": [_shelf(tmp_path)],
        "settings": {"output_topic": "answered", **settings},
    }


async def test_an_mcp_tool_error_goes_back_to_the_model_which_tries_again(tmp_path: Path) -> None:
    def model(request: dict[str, Any]) -> Reply:
        seen = _tool_messages(request)
        if not seen:
            return Reply(tool_calls=[{"name": "find", "arguments": {"key": "z"}}])
        if len(seen) == 1:
            return Reply(tool_calls=[{"name": "find", "arguments": {"key": "a"}}])
        return Reply(json.loads(seen[1])["title"])

    with ModelServer(model) as server:
        async with (
            OpenAIProvider(server.base_url, model="stand-in", max_retries=0) as provider,
            agent_harness(ModelAgent, provider=provider, **_librarian(tmp_path)) as h,
        ):
            await h.send("ask", {"q": "which book?"}, timeout=START)
            told = _tool_messages(server.requests[1].body)
    assert h.published("answered") == [{"answer": "Dune"}]
    assert told == [
        "Error: MCPToolError: MCP tool 'find' of server 'shelf' failed: "
        "Error executing tool find: no book 'z' on the shelf"
    ]
    assert [c.name for c in h.effects] == [
        "tools.list", "model.openai.chat", "tool.find", "model.openai.chat", "tool.find",
        "model.openai.chat",
    ]  # fmt: skip


async def test_mcp_tool_errors_past_max_tool_errors_fail_the_message(tmp_path: Path) -> None:
    def model(request: dict[str, Any]) -> Reply:
        return Reply(tool_calls=[{"name": "find", "arguments": {"key": "z"}}])

    with ModelServer(model) as server:
        async with (
            OpenAIProvider(server.base_url, model="stand-in", max_retries=0) as provider,
            agent_harness(
                ModelAgent, provider=provider, **_librarian(tmp_path, max_tool_errors=1)
            ) as h,
        ):
            await h.send("ask", {"q": "which book?"}, timeout=START, check=False)
    [dead] = h.dead_letters
    assert dead.error_type is not None and dead.error_type.endswith("TooManyToolErrors")
    assert "2 tool calls failed (max_tool_errors 1)" in (dead.error or "")
    assert "no book 'z' on the shelf" in (dead.error or "")


async def test_a_dead_mcp_server_fails_the_message_instead_of_telling_the_model(
    tmp_path: Path,
) -> None:
    def model(request: dict[str, Any]) -> Reply:
        assert not _tool_messages(request), "the model was handed the dead server's error"
        return Reply(tool_calls=[{"name": "crash", "arguments": {}}])

    with ModelServer(model) as server:
        async with (
            OpenAIProvider(server.base_url, model="stand-in", max_retries=0) as provider,
            agent_harness(ModelAgent, provider=provider, **_librarian(tmp_path)) as h,
        ):
            await h.send("ask", {"q": "which book?"}, timeout=START, check=False)
        asked = len(server.requests)
    [dead] = h.dead_letters
    assert dead.error_type is not None and dead.error_type.endswith("MCPServerUnavailable")
    assert "MCP server 'shelf'" in (dead.error or "") and "'crash'" in (dead.error or "")
    assert h.published("answered") == []
    # One model call per attempt: each failed at its tool call, never asked again.
    assert asked == dead.attempts


def test_a_recorded_dead_server_error_is_rebuilt_as_itself_so_a_replay_fails_alike() -> None:
    from pantheon.sessions._effects import rebuild_error

    message = "MCP server 'shelf' is gone (calling 'crash'): its connection closed"
    exc = rebuild_error("agents._mcp.MCPServerUnavailable", message)
    assert isinstance(exc, MCPServerUnavailable) and str(exc) == message
    assert (exc.server, exc.tool) == (None, None)
