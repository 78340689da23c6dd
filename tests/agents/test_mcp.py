"""MCP servers as a tool source: the notes server of ``pantheon.testing.mcp_notes`` started for
real, over stdio by :class:`agents.MCPServer` and over streamable HTTP on a free loopback port;
its tools listed and called, and every way a call fails (a tool error, a timeout, a killed
server, a server that never answers) a clear error naming the server and the tool."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from agents import (
    AgentError,
    MCPServer,
    MCPServerError,
    MCPServerUnavailable,
    MCPToolError,
    MCPToolTimeout,
)

NOTES = [sys.executable, "-m", "pantheon.testing.mcp_notes"]

# A bound on waiting for a subprocess to come up on a loaded machine, not a measurement.
UP_WITHIN = 60.0


def notes_command(db: Path, *extra: str) -> list[str]:
    return [*NOTES, "--db", str(db), *extra]


def processes_with(marker: Path) -> list[int]:
    """Live processes whose command line names ``marker`` (a test's own file: only its server)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue  # it ended while we looked
            if str(marker).encode() in cmdline:
                found.append(int(entry.name))
    return found


def test_importing_agents_does_not_import_the_sdk() -> None:
    code = "import sys, agents; print(sorted(m for m in sys.modules if m.split('.')[0] == 'mcp'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_without_the_sdk_a_start_names_the_extra_to_install() -> None:
    code = (
        "import asyncio, sys\n"
        "class NoSDK:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name.split('.')[0] in ('mcp', 'mcp_types'):\n"
        "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
        "sys.meta_path.insert(0, NoSDK())\n"
        "from agents import MCPServer\n"
        "try:\n"
        "    asyncio.run(MCPServer(command=['x']).start())\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "agents.MCPServer needs the official MCP SDK: pip install 'pantheon[mcp]'"
    )


async def test_a_stdio_server_lists_its_tools_and_answers_calls(tmp_path: Path) -> None:
    db = tmp_path / "notes.sqlite"
    async with MCPServer(command=notes_command(db), timeout=20) as server:
        assert processes_with(db)  # the run started the server
        tools = {tool.name: tool for tool in server.tools()}
        assert list(tools) == ["add_note", "find_notes", "read_note"]
        assert server.name == "notes"  # the name the server gives itself
        add = tools["add_note"]
        assert add.description == "Store a note and answer its id."
        assert add.parameters["type"] == "object"
        assert add.parameters["required"] == ["title", "text"]

        assert await add({"title": "Refunds", "text": "within 30 days"}) == {"id": 1}
        assert await add({"title": "Shipping", "text": "refund the postage"}) == {"id": 2}
        found = await tools["find_notes"]({"query": "refund"})
        assert [note["id"] for note in found["notes"]] == [2, 1]
        assert await tools["read_note"]({"id": 1}) == {
            "id": 1,
            "title": "Refunds",
            "text": "within 30 days",
        }

        with pytest.raises(MCPToolError) as failed:
            await tools["read_note"]({"id": 99})
        assert (failed.value.server, failed.value.tool) == ("notes", "read_note")
        assert "no note with id 99" in str(failed.value)
        assert "'read_note' of server 'notes'" in str(failed.value)
        assert isinstance(failed.value, AgentError)

    # The server wrote to the real SQLite file, and closing ended its process.
    with sqlite3.connect(db) as conn:
        assert conn.execute("SELECT title FROM notes ORDER BY id").fetchall() == [
            ("Refunds",),
            ("Shipping",),
        ]
    assert processes_with(db) == []
    with pytest.raises(MCPServerUnavailable, match=r"'notes' cannot call 'add_note': .*closed"):
        await add({"title": "late", "text": "after close"})


async def test_the_allow_list_keeps_only_the_tools_it_names(tmp_path: Path) -> None:
    db = tmp_path / "notes.sqlite"
    async with MCPServer(command=notes_command(db), allow=["read_note", "find_notes"]) as server:
        # In the server's order, not the allow-list's.
        assert [tool.name for tool in server.tools()] == ["find_notes", "read_note"]
        assert await server.tools()[0]({"query": "x"}) == {"notes": []}


async def test_an_allowed_tool_the_server_lacks_fails_the_start(tmp_path: Path) -> None:
    db = tmp_path / "notes.sqlite"
    server = MCPServer(command=notes_command(db), allow=["find_notes", "delete_note"])
    with pytest.raises(MCPServerError) as failed:
        await server.start()
    assert type(failed.value) is MCPServerError
    assert (failed.value.server, failed.value.tool) == ("notes", "delete_note")
    assert "offers add_note, find_notes, read_note" in str(failed.value)
    assert processes_with(db) == []  # the failed start left no server behind
    with pytest.raises(RuntimeError, match="no tools before start"):
        server.tools()


async def test_a_call_past_its_timeout_is_a_clear_error(tmp_path: Path) -> None:
    db = tmp_path / "notes.sqlite"
    # Every call takes 30 s; the client waits 0.3 s (a gap no loaded machine closes).
    async with MCPServer(command=notes_command(db, "--delay", "30"), timeout=0.3) as server:
        for _ in range(2):  # a timed-out call leaves the session usable for the next one
            with pytest.raises(MCPToolTimeout) as late:
                await server.call_tool("find_notes", {"query": "x"})
            assert (late.value.server, late.value.tool) == ("notes", "find_notes")
            assert "'find_notes' of server 'notes' did not answer within 0.3 s" in str(late.value)


async def test_a_server_killed_mid_run_fails_its_calls_with_the_reason(tmp_path: Path) -> None:
    db = tmp_path / "notes.sqlite"
    async with MCPServer(command=notes_command(db, "--delay", "30"), timeout=60) as server:
        [pid] = processes_with(db)
        call = asyncio.create_task(server.call_tool("find_notes", {"query": "x"}))
        await asyncio.sleep(0.1)  # let the call go out (killed before or after: the same error)
        os.kill(pid, signal.SIGKILL)
        with pytest.raises(MCPServerUnavailable) as died:
            await call
        assert (died.value.server, died.value.tool) == ("notes", "find_notes")
        assert "MCP server 'notes' is gone (calling 'find_notes'): its connection closed" in str(
            died.value
        )
        # Every later call fails at once with the same reason, without waiting on a timeout.
        with pytest.raises(MCPServerUnavailable, match="cannot call 'add_note': its connection"):
            await server.call_tool("add_note", {"title": "t", "text": "x"})


async def test_a_server_that_exits_at_start_is_unavailable_with_its_stderr() -> None:
    crash = "import sys; print('no such database: /nope', file=sys.stderr); sys.exit(3)"
    server = MCPServer(command=[sys.executable, "-c", crash], name="broken")
    with pytest.raises(MCPServerUnavailable) as failed:
        await server.start()
    assert failed.value.server == "broken"
    assert "MCP server 'broken' could not be started" in str(failed.value)
    assert "its stderr ends:\nno such database: /nope" in str(failed.value)


async def test_a_missing_program_is_named_with_where_it_was_looked_for(tmp_path: Path) -> None:
    absolute = MCPServer(command=[str(tmp_path / "no-such-server")], name="fleet")
    with pytest.raises(MCPServerUnavailable) as failed:
        await absolute.start()
    assert str(failed.value) == (
        f"MCP server 'fleet' could not be started: there is no program {tmp_path}/no-such-server"
    )
    # A bare name is looked for on the PATH the server gets (its env's, else the run's).
    bare = MCPServer(command=["no-such-server"], env={"PATH": f"{tmp_path}:/nowhere"}, name="fleet")
    with pytest.raises(MCPServerUnavailable) as failed:
        await bare.start()
    assert str(failed.value) == (
        "MCP server 'fleet' could not be started: no program 'no-such-server' was found on "
        f"PATH ({tmp_path}:/nowhere)"
    )
    # A relative path, in the server's working directory.
    relative = MCPServer(command=["bin/no-such-server"], cwd=tmp_path, name="fleet")
    with pytest.raises(MCPServerUnavailable) as failed:
        await relative.start()
    assert str(failed.value) == (
        f"MCP server 'fleet' could not be started: there is no program "
        f"{tmp_path}/bin/no-such-server ('bin/no-such-server' resolved in the working "
        f"directory {tmp_path})"
    )
    nowhere = tmp_path / "gone"
    no_cwd = MCPServer(command=[sys.executable, "server.py"], cwd=nowhere, name="fleet")
    with pytest.raises(MCPServerUnavailable) as failed:
        await no_cwd.start()
    assert str(failed.value) == (
        f"MCP server 'fleet' could not be started: its working directory {nowhere} cannot be "
        f"used (FileNotFoundError: [Errno 2] No such file or directory: {nowhere!r})"
    )


async def test_a_relative_script_path_that_names_nothing_says_where_it_was_resolved(
    tmp_path: Path,
) -> None:
    """The command is run as written, in ``cwd`` (else the process's own working directory),
    not beside the module that made the server: the error says so and where it looked."""
    server = MCPServer(command=[sys.executable, "fleet_server.py"], cwd=tmp_path, name="fleet")
    with pytest.raises(MCPServerUnavailable) as failed:
        await server.start()
    assert str(failed.value) == (
        "MCP server 'fleet' could not be started: its process closed the connection before it "
        f"listed its tools; it ran {sys.executable} fleet_server.py in {tmp_path}, which has no "
        "'fleet_server.py' (a relative path in the command resolves in the server's working "
        "directory, cwd= or else the process's; give an absolute path, e.g. built from "
        "Path(__file__).parent); its stderr ends:\n"
        f"{sys.executable}: can't open file '{tmp_path}/fleet_server.py': [Errno 2] No such "
        "file or directory"
    )


def notes_script(path: Path) -> None:
    """Write a script at ``path`` that serves the notes server (``--db`` as its argument)."""
    path.write_text("from pantheon.testing.mcp_notes import main\n\nmain()\n", encoding="utf-8")


async def test_a_closed_server_starts_again_as_a_new_process(tmp_path: Path) -> None:
    db = tmp_path / "notes.sqlite"
    server = MCPServer(command=notes_command(db), timeout=20, start_timeout=UP_WITHIN)
    await server.start()
    [first] = processes_with(db)
    [add, find, _] = server.tools()
    assert await add({"title": "Refunds", "text": "within 30 days"}) == {"id": 1}
    await server.aclose()
    assert processes_with(db) == []
    with pytest.raises(MCPServerUnavailable) as closed:
        await find({"query": "refund"})
    assert str(closed.value) == (
        "MCP server 'notes' cannot call 'find_notes': the server was closed"
    )

    await server.start()  # a new session and process; the old tools reach it
    [second] = processes_with(db)
    assert second != first
    assert [n["id"] for n in (await find({"query": "refund"}))["notes"]] == [1]
    await server.aclose()
    await server.aclose()  # closing a closed server does nothing
    assert processes_with(db) == []


async def test_a_failed_start_is_tried_again_by_the_next_start(tmp_path: Path) -> None:
    db = tmp_path / "notes.sqlite"
    script = tmp_path / "notes_server.py"  # not written yet: a typo'd path, as it were
    server = MCPServer(
        command=[sys.executable, str(script), "--db", str(db)], name="notes", start_timeout=60
    )
    expected = (
        "MCP server 'notes' could not be started: its process closed the connection before "
        f"it listed its tools; it ran {sys.executable} {script} --db {db} in {os.getcwd()}; "
        f"its stderr ends:\n{sys.executable}: can't open file '{script}': [Errno 2] No such "
        "file or directory"
    )
    for _ in range(2):  # each start tries again, and says the same real cause
        with pytest.raises(MCPServerUnavailable) as failed:
            await server.start()
        assert str(failed.value) == expected
    with pytest.raises(MCPServerUnavailable) as never:
        await server.call_tool("find_notes", {"query": "x"})
    assert str(never.value) == "MCP server 'notes' cannot call 'find_notes': its start failed"
    notes_script(script)
    async with server:
        assert await server.call_tool("find_notes", {"query": "x"}) == {"notes": []}
    assert processes_with(db) == []


async def test_starts_share_one_session_until_the_last_close(tmp_path: Path) -> None:
    """Two agents may share one server: their starts (racing) make one process, which the
    first agent's close leaves running for the other."""
    db = tmp_path / "notes.sqlite"
    server = MCPServer(command=notes_command(db), timeout=20, start_timeout=UP_WITHIN)
    await asyncio.gather(server.start(), server.start())
    assert len(processes_with(db)) == 1
    await server.start()  # a third, once it runs: joins it
    assert len(processes_with(db)) == 1
    for _ in range(2):
        await server.aclose()
        assert await server.call_tool("add_note", {"title": "t", "text": "x"}) in (
            {"id": 1},
            {"id": 2},
        )
    await server.aclose()
    assert processes_with(db) == []


async def test_racing_starts_of_a_failing_server_share_one_try_and_its_error(
    tmp_path: Path,
) -> None:
    log = tmp_path / "stderr.log"
    missing = tmp_path / "missing_server.py"
    with log.open("w", encoding="utf-8") as stderr:
        server = MCPServer(command=[sys.executable, str(missing)], name="fleet", stderr=stderr)
        both = await asyncio.gather(server.start(), server.start(), return_exceptions=True)
    assert [type(e) for e in both] == [MCPServerUnavailable, MCPServerUnavailable]
    assert str(both[0]) == str(both[1])
    assert str(both[0]).startswith(
        "MCP server 'fleet' could not be started: its process closed the connection"
    )
    # One process was started, which said so once.
    assert log.read_text(encoding="utf-8").count("can't open file") == 1


async def _use_once(server: MCPServer, *, close: bool = True) -> object:
    await server.start()
    answer = await server.call_tool("find_notes", {"query": "x"})
    if close:
        await server.aclose()
    return answer


def test_one_server_object_serves_one_event_loop_after_another(tmp_path: Path) -> None:
    """A module-level server, as a scenario's tools module makes one, in a process that runs
    the team twice (``asyncio.run`` each time), the first run ending without closing it."""
    db = tmp_path / "notes.sqlite"
    server = MCPServer(command=notes_command(db), timeout=20, start_timeout=UP_WITHIN)
    assert asyncio.run(_use_once(server, close=False)) == {"notes": []}
    assert asyncio.run(_use_once(server)) == {"notes": []}
    assert asyncio.run(_use_once(server)) == {"notes": []}
    assert processes_with(db) == []


async def test_a_server_that_never_answers_fails_the_start_within_its_bound(
    tmp_path: Path,
) -> None:
    marker = tmp_path / "silent"
    silent = [sys.executable, "-c", "import time, sys; time.sleep(120)", str(marker)]
    server = MCPServer(command=silent, start_timeout=0.5, name="silent")
    with pytest.raises(
        MCPServerUnavailable, match=r"'silent' did not list its tools within 0\.5 s"
    ):
        await server.start()
    assert processes_with(marker) == []  # stopped, not left running


@pytest.fixture
def http_notes(tmp_path: Path) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """The notes server over streamable HTTP on a free loopback port: (its URL, its process)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "http.log").open("wb")
    proc = subprocess.Popen(
        notes_command(tmp_path / "notes.sqlite", "--port", str(port)), stdout=log, stderr=log
    )
    try:
        deadline = time.monotonic() + UP_WITHIN
        while True:
            assert proc.poll() is None, (tmp_path / "http.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the HTTP notes server did not come up"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp", proc
    finally:
        proc.kill()
        proc.wait()
        log.close()


async def test_a_streamable_http_server_by_url(
    http_notes: tuple[str, subprocess.Popen[bytes]],
) -> None:
    url, proc = http_notes
    async with MCPServer(url=url, allow=["add_note", "find_notes"]) as server:
        assert server.name == "notes"
        add, find = server.tools()
        assert await add({"title": "HTTP", "text": "streamable"}) == {"id": 1}
        assert (await find({"query": "stream"}))["notes"][0]["title"] == "HTTP"

        proc.kill()
        proc.wait()
        with pytest.raises(MCPServerUnavailable, match=r"'notes' is gone \(calling 'find_n"):
            await find({"query": "stream"})


#: The notes server over streamable HTTP behind a check of the Authorization header: a
#: request without the token is answered 401 before it reaches the MCP app.
GUARDED = """\
import sys

import uvicorn

from pantheon.testing.mcp_notes import build_server

db, port, token = sys.argv[1], int(sys.argv[2]), sys.argv[3]
app = build_server(db).streamable_http_app(host="127.0.0.1")


async def guarded(scope, receive, send):
    if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != token.encode():
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b"no token"})
        return
    await app(scope, receive, send)


uvicorn.run(guarded, host="127.0.0.1", port=port, log_level="warning")
"""
TOKEN = "Bearer s3cret-notes"


@pytest.fixture
def guarded_notes(tmp_path: Path) -> Iterator[str]:
    """The notes server over streamable HTTP, answering only requests carrying
    ``Authorization: TOKEN``: its URL."""
    script = tmp_path / "guarded.py"
    script.write_text(GUARDED, encoding="utf-8")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (tmp_path / "guarded.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path / "notes.sqlite"), str(port), TOKEN],
        stdout=log,
        stderr=log,
    )
    try:
        deadline = time.monotonic() + UP_WITHIN
        while True:
            assert proc.poll() is None, (tmp_path / "guarded.log").read_text()
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the guarded notes server did not come up"
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.kill()
        proc.wait()
        log.close()


async def test_a_url_server_gets_its_headers_from_the_environment(
    guarded_notes: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NOTES_TOKEN", TOKEN)
    server = MCPServer(url=guarded_notes, headers_env={"Authorization": "NOTES_TOKEN"})
    async with server:
        add, find, _read = server.tools()
        assert await add({"title": "Auth", "text": "by header"}) == {"id": 1}
        assert (await find({"query": "header"}))["notes"][0]["title"] == "Auth"
    # What a record keeps of the server names the variable, never holds its value.
    identity = repr(server.request_identity())
    assert "NOTES_TOKEN" in identity and "s3cret" not in identity and "s3cret" not in repr(server)

    # The check is real: without the header the server refuses the start.
    with pytest.raises(MCPServerUnavailable, match="could not be started: MCPError"):
        await MCPServer(url=guarded_notes).start()


async def test_a_header_whose_variable_is_not_set_fails_the_start_naming_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("NOTES_TOKEN", raising=False)
    server = MCPServer(url="http://127.0.0.1:1/mcp", headers_env={"Authorization": "NOTES_TOKEN"})
    with pytest.raises(MCPServerUnavailable) as info:
        await server.start()
    assert str(info.value) == (
        "MCP server 'http://127.0.0.1:1/mcp' cannot be started: its header 'Authorization' "
        "takes its value from the environment variable NOTES_TOKEN, which is not set"
    )
    # Nothing was started: setting the variable and starting again is a plain start.
    assert server._session is None


def test_a_server_without_headers_keeps_its_identity() -> None:
    """Sessions recorded before headers_env digest a URL server as they did."""
    server = MCPServer(url="http://h/mcp", allow=["find_notes"])
    assert server.request_identity() == (None, "http://h/mcp", None, ["find_notes"])


async def test_nothing_listens_at_the_url() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = MCPServer(url=f"http://127.0.0.1:{port}/mcp")
    with pytest.raises(MCPServerUnavailable, match="could not be started: ConnectError"):
        await server.start()


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({}, ValueError, "exactly one of command"),
        ({"command": ["x"], "url": "http://h/mcp"}, ValueError, "exactly one of command"),
        ({"command": "python -m server"}, TypeError, "non-empty list of strings"),
        ({"command": []}, TypeError, "non-empty list of strings"),
        ({"url": "localhost:8000/mcp"}, ValueError, "http:// or https:// URL"),
        ({"url": "http://h/mcp", "env": {"A": "1"}}, ValueError, "stdio server only"),
        ({"command": ["x"], "timeout": 0}, ValueError, "timeout must be > 0"),
        ({"command": ["x"], "start_timeout": -1}, ValueError, "start_timeout must be > 0"),
        ({"command": ["x"], "allow": "find_notes"}, TypeError, "list of tool names"),
        ({"command": ["x"], "headers_env": {"A": "B"}}, ValueError, "url= server only"),
        ({"url": "http://h/mcp", "headers_env": {"A": ""}}, TypeError, "environment variable"),
    ],
)
def test_bad_settings_are_refused_when_made(
    kwargs: dict[str, object], error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=message):
        MCPServer(**kwargs)  # type: ignore[arg-type]


async def test_arguments_must_be_a_json_object(tmp_path: Path) -> None:
    server = MCPServer(command=notes_command(tmp_path / "n.sqlite"))
    with pytest.raises(TypeError, match="arguments of MCP tool 'find_notes' must be a JSON obj"):
        await server.call_tool("find_notes", ["x"])  # type: ignore[arg-type]
