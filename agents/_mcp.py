"""MCP servers as a tool source, through the official ``mcp`` SDK (``pip install 'pantheon[mcp]'``).

The SDK speaks the protocol (the handshake and version negotiation, JSON-RPC framing, stdio
process management, streamable HTTP with its session and SSE streams), so none of it is written
here. :class:`MCPServer` adds what a run needs around it: the server's tools listed once at start
(with the server's own names, filtered by an allow-list), each call bounded by a timeout, and
every way a call can fail turned into one clear error that names the server and the tool, so
the agent that made the call dead-letters it with that reason::

    async with MCPServer(command=[sys.executable, "-m", "pantheon.testing.mcp_notes",
                                  "--db", "notes.sqlite"], allow=["find_notes"]) as notes:
        [find] = notes.tools()
        await find({"query": "refund"})        # {"notes": [...]}

Errors (a branch of :class:`agents.AgentError`)::

    MCPServerError                 an MCP server failed a start or a call
    ├── MCPServerUnavailable       it could not be started or reached, or it died
    ├── MCPToolTimeout             a call had no answer within its timeout
    └── MCPToolError               the tool answered with an error (``isError``) or refused

``import agents`` does not import the SDK: it is imported by :meth:`MCPServer.start`.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import os
import re
import shlex
import sys
import tempfile
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import IO, TYPE_CHECKING, Any, Self, TextIO

from agents._errors import AgentError

if TYPE_CHECKING:
    from mcp import Client

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_START_TIMEOUT",
    "MCPServer",
    "MCPServerError",
    "MCPServerUnavailable",
    "MCPTool",
    "MCPToolError",
    "MCPToolTimeout",
]

#: Seconds a tool call may take before :class:`MCPToolTimeout`: long enough for a tool that
#: queries something remote, short enough that a hung server does not hold an agent for good.
DEFAULT_CALL_TIMEOUT = 30.0

#: Seconds from :meth:`MCPServer.start` to the tool listing (process start, handshake, list).
#: A Python stdio server importing the SDK takes about 1 s of it on a quiet 2-core machine.
DEFAULT_START_TIMEOUT = 30.0

#: Characters of a stdio server's stderr quoted when it fails to start or dies: its last
#: traceback, without the whole log of a long run.
STDERR_TAIL = 2000

#: Pages of ``tools/list`` read at start: a server whose cursor never ends cannot hang a start.
MAX_LIST_PAGES = 100

# A tool name as every model API accepts it (OpenAI's and Anthropic's function names).
_TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")


class MCPServerError(AgentError, RuntimeError):
    """An MCP server failed a start or a call; ``server`` and ``tool`` (or None) say which.
    Both are None in one a replay rebuilt from a session's record (built from its message
    alone, which names them), so it is still this type and is handled as the original was."""

    def __init__(self, message: str, *, server: str | None = None, tool: str | None = None) -> None:
        super().__init__(message)
        self.server = server
        self.tool = tool


class MCPServerUnavailable(MCPServerError):
    """The server could not be started or reached, or its connection ended (it exited, was
    killed, or closed the session); every later call fails the same way, until a new start."""


class MCPToolTimeout(MCPServerError):
    """A call had no answer within the server's ``timeout``. The server is asked to cancel it
    and stays usable for other calls."""


class MCPToolError(MCPServerError):
    """The tool answered with an error result (``isError``), or the server refused the call
    (an unknown tool, arguments its schema rejects)."""


class MCPTool:
    """One tool of an :class:`MCPServer`: the server's name, description and input schema
    (``parameters``), called with a JSON object of arguments."""

    __slots__ = ("description", "name", "parameters", "server")

    def __init__(
        self, server: MCPServer, name: str, description: str, parameters: dict[str, Any]
    ) -> None:
        self.server = server
        self.name = name
        self.description = description
        self.parameters = parameters

    async def __call__(self, arguments: dict[str, Any]) -> Any:
        """The tool's result as JSON-able data (see :meth:`MCPServer.call_tool`)."""
        return await self.server.call_tool(self.name, arguments)

    def __repr__(self) -> str:
        return f"MCPTool({self.name!r}, server={self.server.name!r})"


class MCPServer:
    """An MCP server whose tools an agent can call: a tool source.

    Exactly one of ``command`` (a stdio server the run starts: the program and its arguments,
    run in ``cwd`` with ``env`` added to the SDK's safe default environment of PATH, HOME and a
    few more, so the run's secrets are not handed on) or ``url`` (a streamable-HTTP endpoint,
    ``http://host:port/mcp``). ``headers_env`` gives a ``url`` server HTTP headers sent with
    every request, each value read from the environment variable named (``{"Authorization":
    "MCP_TOKEN"}``, the variable holding ``Bearer ...``) when the server starts: a scenario
    or a record names the variable, never holds the secret; a variable not set fails the
    start, naming it. ``allow`` keeps only the tools named (each must exist: a typo
    fails the start instead of leaving the model without a tool); ``timeout`` bounds every call
    and ``start_timeout`` the start. ``name`` is how errors and records name the server; by
    default the name the server gives itself, else the command or URL. A stdio server's stderr
    goes to an unlinked temporary file (or to ``stderr``) and its last lines are quoted when it
    fails.

    :meth:`start` connects and lists the tools; :meth:`aclose` ends the session (and a stdio
    server's process). The SDK's client lives in anyio task groups that must be entered and
    left by one task, so a task of its own holds the session open from start to close, and any
    task may call tools meanwhile; ``async with MCPServer(...) as server`` does both.

    A server can be started again after :meth:`aclose` or after a failed start: each start
    is a new session (a new process for a stdio server), so a module-level ``MCPServer`` serves
    one run after another in one process, and a failed start is tried again by the next one.
    While a session runs, a start joins it and the server counts the starts: each
    :meth:`aclose` gives one back and the last one ends the session, so two agents can share
    one server and either may stop first. A start made while another is under way waits for
    it and shares its outcome (one process, one error). One event loop at a time: a session
    left running by a loop that has ended is dropped by the next loop's start.
    """

    __slots__ = (
        "_allow",
        "_command",
        "_cwd",
        "_env",
        "_headers_env",
        "_name",
        "_session",
        "_start_timeout",
        "_stderr",
        "_timeout",
        "_url",
    )

    def __init__(
        self,
        *,
        command: Sequence[str] | None = None,
        url: str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        headers_env: Mapping[str, str] | None = None,
        allow: Iterable[str] | None = None,
        timeout: float = DEFAULT_CALL_TIMEOUT,
        start_timeout: float = DEFAULT_START_TIMEOUT,
        name: str | None = None,
        stderr: TextIO | None = None,
    ) -> None:
        if (command is None) == (url is None):
            raise ValueError("MCPServer takes exactly one of command=[...] (stdio) or url=")
        if command is not None:
            if (
                isinstance(command, str)
                or not command
                or not all(isinstance(part, str) for part in command)
            ):
                raise TypeError(
                    f"MCPServer command must be a non-empty list of strings "
                    f"(['python', '-m', 'server']), got {command!r}"
                )
        elif not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise ValueError(f"MCPServer url must be an http:// or https:// URL, got {url!r}")
        if url is not None and (env is not None or cwd is not None or stderr is not None):
            raise ValueError("MCPServer env=, cwd= and stderr= apply to a stdio server only")
        if headers_env is not None:
            if command is not None:
                raise ValueError("MCPServer headers_env= applies to a url= server only")
            if not isinstance(headers_env, Mapping) or not all(
                isinstance(k, str) and k and isinstance(v, str) and v
                for k, v in headers_env.items()
            ):
                raise TypeError(
                    "MCPServer headers_env must map header names to environment variable "
                    f"names ({{'Authorization': 'MCP_TOKEN'}}), got {headers_env!r}"
                )
        for label, seconds in (("timeout", timeout), ("start_timeout", start_timeout)):
            if not seconds > 0:
                raise ValueError(f"MCPServer {label} must be > 0 seconds, got {seconds!r}")
        if isinstance(allow, str):
            raise TypeError(f"MCPServer allow must be a list of tool names, got {allow!r}")
        self._command = list(command) if command is not None else None
        self._url = url
        self._env = dict(env) if env is not None else None
        self._headers_env = dict(headers_env) if headers_env else None
        self._cwd = cwd
        self._allow = frozenset(allow) if allow is not None else None
        self._timeout = float(timeout)
        self._start_timeout = float(start_timeout)
        self._name = name
        self._stderr = stderr
        #: The current (or last) start's session; None before the first start.
        self._session: _Session | None = None

    def request_identity(self) -> Any:
        """Which server: its command or URL, where it runs and the tools allowed (see
        :class:`agents.RequestIdentity`); not ``env``, where its credentials go, and of
        ``headers_env`` only the names (the values are secrets, and change by themselves)."""
        cwd = None if self._cwd is None else os.fspath(self._cwd)
        allow = None if self._allow is None else sorted(self._allow)
        if self._headers_env is None:
            return (self._command, self._url, cwd, allow)
        return (self._command, self._url, cwd, allow, sorted(self._headers_env.items()))

    @property
    def name(self) -> str:
        """How errors name this server (see the class docstring)."""
        if self._name is not None:
            return self._name
        if self._command is not None:
            return " ".join(self._command)
        assert self._url is not None
        return self._url

    @property
    def timeout(self) -> float:
        """Seconds each tool call may take."""
        return self._timeout

    def __repr__(self) -> str:
        where = f"command={self._command!r}" if self._command is not None else f"url={self._url!r}"
        return f"MCPServer({where}, name={self.name!r})"

    # -- the tool source ------------------------------------------------------------------------

    async def start(self) -> None:
        """Start (stdio) or reach (HTTP) the server, and list its tools; or join the session
        already running (see the class docstring).

        Raises :class:`MCPServerUnavailable` if it cannot be started or does not answer within
        ``start_timeout``, :class:`MCPServerError` if ``allow`` names a tool it lacks or a tool's
        name is one a model cannot call. A failed start leaves nothing running: the next start
        tries again."""
        # Importing the SDK costs about 0.6 s of CPU (pydantic models; 580-600 ms measured on a
        # quiet 2-core machine): in a thread, so a team already running on this loop does not
        # stall for it. A missing extra is an ImportError here, not a failed start.
        await asyncio.to_thread(_import_sdk)
        loop = asyncio.get_running_loop()
        while True:
            s = self._session
            if s is None or s.ended or s.loop is not loop:
                # None running here. A session of another event loop (an earlier
                # ``asyncio.run`` that ended without closing it) died with its loop.
                break
            if s.users:
                # Running: joined, even if its server died since (its calls say so).
                s.users += 1
                return
            # Another task's start is under way: its outcome is this one's (one process,
            # and every waiting message told the same cause).
            try:
                await asyncio.shield(s.outcome)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if not s.outcome.cancelled() or (task is not None and task.cancelling()):
                    raise
                continue  # that start was cancelled, not this one: try again
            # It succeeded: the next pass joins it (or starts anew if it was closed since).
        await self._start_session(loop)

    async def _start_session(self, loop: asyncio.AbstractEventLoop) -> None:
        headers = self._headers()
        s = _Session(loop)
        # Set before the first await: a start made meanwhile waits for this one.
        self._session = s
        ready: asyncio.Future[list[MCPTool]] = loop.create_future()
        try:
            s.holder = loop.create_task(self._hold(s, ready, headers), name=f"mcp {self.name}")
            s.tools = await asyncio.wait_for(asyncio.shield(ready), self._start_timeout)
        except BaseException as exc:
            error = await self._start_failed(s, ready, exc)
            if error is exc or error is None:
                raise
            quiet = isinstance(exc, TimeoutError | asyncio.CancelledError)
            raise error from (None if quiet else exc)
        if s.ended:  # aclose() ended it as it listed the tools
            error = await self._start_failed(s, ready, None)
            assert error is not None
            raise error
        s.users = 1
        s.outcome.set_result(None)

    async def _start_failed(
        self, s: _Session, ready: asyncio.Future[list[MCPTool]], exc: BaseException | None
    ) -> BaseException | None:
        """End a start that failed with ``exc`` (None: it was closed meanwhile) and tell the
        starts waiting on it; what it raises (None: ``exc`` goes on, a cancellation)."""
        s.ended = True
        s.tools = None
        # A start that failed or gave up takes the half-open session down with it (the SDK
        # waits on a handshake answer without a bound of its own).
        await self._end(s, cancel=True)
        if ready.done() and not ready.cancelled():
            ready.exception()  # retrieved: the error raised says it
        if s.lost is None:
            s.lost = "its start failed"
        error = self._start_error(s, exc)
        if error is None:
            s.outcome.cancel()  # the starts waiting on it try again
        else:
            s.outcome.set_exception(error)
            s.outcome.exception()  # retrieved: nobody may be waiting on it
        return error

    def _start_error(self, s: _Session, exc: BaseException | None) -> BaseException | None:
        """What a failed start raises; None: ``exc`` goes on (this task is cancelled, or the
        process is being interrupted)."""
        task = asyncio.current_task()
        if isinstance(exc, asyncio.CancelledError) and task is not None and task.cancelling():
            return None
        if exc is None or isinstance(exc, asyncio.CancelledError):
            # aclose() ended the start (the session's task cancelled, not this one).
            return MCPServerUnavailable(
                f"MCP server {self.name!r} was closed while it started", server=self.name
            )
        if isinstance(exc, TimeoutError):
            return MCPServerUnavailable(
                f"MCP server {self.name!r} did not list its tools within "
                f"{self._start_timeout:g} s of starting{self._ran()}{self._stderr_tail(s)}",
                server=self.name,
            )
        if not isinstance(exc, Exception):
            return None
        if isinstance(exc, MCPServerError):
            return exc
        return MCPServerUnavailable(
            f"MCP server {self.name!r} could not be started: {self._why(exc)}"
            f"{self._stderr_tail(s)}",
            server=self.name,
        )

    def _workdir(self) -> str:
        return os.path.abspath(self._cwd) if self._cwd is not None else os.getcwd()

    def _ran(self) -> str:
        """Where a stdio server ran, for an error: its command and working directory, and the
        relative paths of the command that name nothing there (a script path written as if
        it resolved beside the module that defines the server, which it does not)."""
        if self._command is None:
            return ""
        where = self._workdir()
        text = f"; it ran {shlex.join(self._command)} in {where}"
        missing = [
            arg
            for arg in self._command[1:]
            if not arg.startswith("-")
            and not os.path.isabs(arg)
            and ("/" in arg or os.path.splitext(arg)[1] in _SCRIPT_SUFFIXES)
            and not os.path.exists(os.path.join(where, arg))
        ]
        if missing:
            text += (
                f", which has no {', '.join(map(repr, missing))} (a relative path in the "
                "command resolves in the server's working directory, cwd= or else the "
                "process's; give an absolute path, e.g. built from Path(__file__).parent)"
            )
        return text

    def _why(self, exc: BaseException) -> str:
        """Why a stdio server could not be started, as the user would look for it: a program
        not found is named with where it was looked for."""
        if self._command is None:
            return _describe(exc)
        os_error = next((e for e in _leaves(exc) if isinstance(e, OSError)), None)
        program = self._command[0]
        if isinstance(os_error, FileNotFoundError | PermissionError | NotADirectoryError):
            where = self._workdir()
            named = os_error.filename
            if isinstance(named, os.PathLike):
                named = os.fspath(named)  # the SDK is given the cwd as a Path
            if self._cwd is not None and named in (os.fspath(self._cwd), where):
                return f"its working directory {where} cannot be used ({_describe(os_error)})"
            if os.sep in program or (os.altsep and os.altsep in program):
                path = os.path.normpath(os.path.join(where, program))
                if isinstance(os_error, FileNotFoundError):
                    found = f"there is no program {path}"
                else:
                    found = f"the program {path} cannot be run ({_describe(os_error)})"
                if not os.path.isabs(program):
                    found += f" ({program!r} resolved in the working directory {where})"
                return found
            search = (self._env or {}).get("PATH") or os.environ.get("PATH") or os.defpath
            if isinstance(os_error, FileNotFoundError):
                return f"no program {program!r} was found on PATH ({search})"
            return f"the program {program!r} found on PATH cannot be run ({_describe(os_error)})"
        if _connection_closed(exc):
            return f"its process closed the connection before it listed its tools{self._ran()}"
        return f"{_describe(exc)}{self._ran()}"

    def _headers(self) -> dict[str, str] | None:
        """The HTTP headers of ``headers_env``, read from the environment now."""
        if self._headers_env is None:
            return None
        headers: dict[str, str] = {}
        for header, variable in self._headers_env.items():
            value = os.environ.get(variable)
            if value is None:
                raise MCPServerUnavailable(
                    f"MCP server {self.name!r} cannot be started: its header {header!r} takes "
                    f"its value from the environment variable {variable}, which is not set",
                    server=self.name,
                )
            headers[header] = value
        return headers

    def tools(self) -> list[MCPTool]:
        """The server's tools (those ``allow`` keeps), in the server's order."""
        s = self._session
        if s is None or s.tools is None:
            raise RuntimeError(f"{self!r} has no tools before start() (nor after a failed one)")
        return list(s.tools)

    async def aclose(self) -> None:
        """Give back one start (see the class docstring): the last one ends the session and,
        for a stdio server, its process (the SDK closes its stdin, then terminates, then kills
        it, each step bounded). A server not running is left as it is; one whose start is
        under way has that start fail."""
        s = self._session
        if s is None or s.ended:
            return
        if s.users > 1:
            s.users -= 1
            return
        starting = not s.users
        s.users = 0
        s.ended = True
        s.client = None
        if s.lost is None:
            s.lost = "the server was closed"
        if s.loop is asyncio.get_running_loop():
            await self._end(s, cancel=starting)

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    # -- calls --------------------------------------------------------------------------------

    async def call_tool(self, tool: str, arguments: Mapping[str, Any]) -> Any:
        """Call ``tool`` with ``arguments`` within the timeout; its result as JSON-able data.

        The server's structured content when it gives some (a JSON object), else the content
        blocks: a text block as its ``str``, another block as its JSON form, several as a list
        (none: None)."""
        if not isinstance(arguments, Mapping):
            raise TypeError(
                f"arguments of MCP tool {tool!r} must be a JSON object (a dict), "
                f"got {type(arguments).__name__}"
            )
        s = self._session
        client = None if s is None else s.client
        if s is None or client is None or s.lost is not None:
            why = (s.lost if s is not None else None) or "it was not started"
            raise MCPServerUnavailable(
                f"MCP server {self.name!r} cannot call {tool!r}: {why}", server=self.name, tool=tool
            )
        from mcp import MCPError
        from mcp_types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        try:
            result = await client.call_tool(
                tool, dict(arguments), read_timeout_seconds=self._timeout
            )
        except MCPError as exc:
            if exc.code == REQUEST_TIMEOUT:
                raise MCPToolTimeout(
                    f"MCP tool {tool!r} of server {self.name!r} did not answer within "
                    f"{self._timeout:g} s",
                    server=self.name,
                    tool=tool,
                ) from None
            if exc.code == CONNECTION_CLOSED:
                raise self._gone(s, tool, "its connection closed") from None
            raise MCPToolError(
                f"MCP server {self.name!r} refused the call of {tool!r}: {exc.message} "
                f"(code {exc.code})",
                server=self.name,
                tool=tool,
            ) from None
        except Exception as exc:
            # Whatever else the transport raised (an HTTP server gone, a broken stream) ends
            # the session: a half-working connection would fail later calls more obscurely.
            raise self._gone(s, tool, _describe(exc)) from exc
        if result.is_error:
            raise MCPToolError(
                f"MCP tool {tool!r} of server {self.name!r} failed: "
                f"{_text(_content(result.content)) or 'no message'}",
                server=self.name,
                tool=tool,
            )
        if result.structured_content is not None:
            return result.structured_content
        return _content(result.content)

    # -- the session's task ---------------------------------------------------------------------

    def _new_client(self, errlog: TextIO | None, headers: dict[str, str] | None) -> Client:
        from mcp import Client, StdioServerParameters
        from mcp.client.stdio import stdio_client

        if self._command is None:
            assert self._url is not None
            if headers is None:
                return Client(self._url)
            return Client(_http_with_headers(self._url, headers))
        params = StdioServerParameters(
            command=self._command[0],
            args=self._command[1:],
            env=self._env,
            cwd=Path(self._cwd) if self._cwd is not None else None,
        )
        return Client(stdio_client(params, errlog=errlog or sys.stderr))

    async def _hold(
        self, s: _Session, ready: asyncio.Future[list[MCPTool]], headers: dict[str, str] | None
    ) -> None:
        """Enter the client, list the tools, and keep the session open until it is ended."""
        try:
            with self._stderr_log(s) as errlog:
                client = self._new_client(errlog, headers)
                async with client:
                    s.client = client
                    if self._name is None and client.server_info is not None:
                        self._name = client.server_info.name
                    try:
                        tools = await self._list(client)
                    except MCPServerError as exc:
                        # Raised out of the SDK's task groups it would come back wrapped in an
                        # exception group; the session is closed by leaving the block instead.
                        ready.set_exception(exc)
                        return
                    ready.set_result(tools)
                    await s.stop.wait()
        except BaseException as exc:
            if not ready.done():
                if isinstance(exc, asyncio.CancelledError):
                    ready.cancel()
                else:
                    ready.set_exception(exc)
            elif s.lost is None:
                s.lost = f"its session ended: {_describe(exc)}"
            if isinstance(exc, asyncio.CancelledError):
                raise
        finally:
            s.client = None

    async def _list(self, client: Client) -> list[MCPTool]:
        listed: list[Any] = []
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            page = await client.list_tools(cursor=cursor)
            listed.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                break
        offered = [tool.name for tool in listed]
        if self._allow is not None:
            missing = sorted(self._allow.difference(offered))
            if missing:
                raise MCPServerError(
                    f"MCP server {self.name!r} has no tool {', '.join(map(repr, missing))} "
                    f"(named in allow); it offers {', '.join(offered) or 'none'}",
                    server=self.name,
                    tool=missing[0],
                )
            listed = [tool for tool in listed if tool.name in self._allow]
        tools: list[MCPTool] = []
        for tool in listed:
            if not _TOOL_NAME.fullmatch(tool.name):
                raise MCPServerError(
                    f"MCP server {self.name!r} offers a tool named {tool.name!r}, which a model "
                    f"cannot call (a name is 1-64 of A-Z a-z 0-9 _ -); leave it out with allow=",
                    server=self.name,
                    tool=tool.name,
                )
            tools.append(MCPTool(self, tool.name, tool.description or "", dict(tool.input_schema)))
        return tools

    async def _end(self, s: _Session, *, cancel: bool = False) -> None:
        holder = s.holder
        if holder is None or holder.done():
            return
        s.stop.set()
        if cancel:
            holder.cancel()
        # The SDK bounds its own shutdown (stdin closed, then SIGTERM, then SIGKILL, about 6 s
        # at worst); waiting for it here means a closed server leaves no process behind.
        # asyncio.wait neither cancels the holder if this task is cancelled meanwhile nor
        # raises the holder's own cancellation here.
        await asyncio.wait({holder})

    def _gone(self, s: _Session | None, tool: str, why: str) -> MCPServerUnavailable:
        if s is None:
            lost = why
        else:
            if s.lost is None:
                s.lost = f"{why}{self._stderr_tail(s)}"
            lost = s.lost
        return MCPServerUnavailable(
            f"MCP server {self.name!r} is gone (calling {tool!r}): {lost}",
            server=self.name,
            tool=tool,
        )

    @contextlib.contextmanager
    def _stderr_log(self, s: _Session) -> Iterator[TextIO | None]:
        """Where a stdio server's stderr goes: ``stderr=``, else a temporary file whose tail is
        kept when it closes (after the client's exit: the process has ended, its last words
        written)."""
        if self._stderr is not None or self._command is None:
            yield self._stderr
            return
        with tempfile.TemporaryFile("w+", encoding="utf-8") as file:
            s.stderr_file = file
            try:
                yield file
            finally:
                s.stderr_kept = self._stderr_tail(s)
                s.stderr_file = None

    @staticmethod
    def _stderr_tail(s: _Session) -> str:
        file = s.stderr_file
        if file is None:
            return s.stderr_kept
        fd = file.fileno()
        size = os.fstat(fd).st_size
        data = os.pread(fd, STDERR_TAIL, max(0, size - STDERR_TAIL))
        text = data.decode("utf-8", errors="replace").strip()
        return f"; its stderr ends:\n{text}" if text else ""


class _Session:
    """One start of an :class:`MCPServer`: the task holding it open, its client and tools,
    how many starts share it, and why its calls fail once it is gone. A new start makes a
    new one, so nothing of an ended session (its stop event, its event loop) is reused."""

    __slots__ = (
        "client",
        "ended",
        "holder",
        "loop",
        "lost",
        "outcome",
        "stderr_file",
        "stderr_kept",
        "stop",
        "tools",
        "users",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        #: The start's outcome: None once it succeeded, its error if it failed, cancelled if
        #: it was; starts made while it was under way wait on it.
        self.outcome: asyncio.Future[None] = loop.create_future()
        self.stop = asyncio.Event()
        self.holder: asyncio.Task[None] | None = None
        self.client: Client | None = None
        self.tools: list[MCPTool] | None = None
        #: Starts sharing it: 0 while its start is under way and once it has ended.
        self.users = 0
        #: Closed by its last user, or its start failed: a later start makes a new session.
        self.ended = False
        #: Why its calls fail: it died, was closed, or its start failed (None: usable).
        self.lost: str | None = None
        self.stderr_file: IO[str] | None = None
        self.stderr_kept = ""


#: Suffixes of a script an interpreter is given (``python3 server.py``): a relative argument
#: with one that names no file in the working directory is pointed out when a start fails.
_SCRIPT_SUFFIXES = frozenset({".py", ".js", ".mjs", ".cjs", ".ts", ".rb", ".sh", ".jar", ".pl"})


def _leaves(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and, for an exception group (anyio's task groups raise them), its leaves; each
    with the exception it was raised from."""
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _leaves(inner)
        return
    yield exc
    if exc.__cause__ is not None:
        yield from _leaves(exc.__cause__)


def _connection_closed(exc: BaseException) -> bool:
    """Whether ``exc`` is the SDK's "connection closed" (a stdio server that exited, or wrote
    something else than the protocol, before it answered)."""
    from mcp import MCPError
    from mcp_types import CONNECTION_CLOSED

    return any(isinstance(e, MCPError) and e.code == CONNECTION_CLOSED for e in _leaves(exc))


@contextlib.asynccontextmanager
async def _http_with_headers(url: str, headers: dict[str, str]) -> AsyncIterator[Any]:
    """The SDK's streamable-HTTP transport on an HTTP client of the SDK's defaults (its
    timeouts) that sends ``headers`` with every request, closed with the transport."""
    from mcp.client.streamable_http import create_mcp_http_client, streamable_http_client

    async with (
        create_mcp_http_client(headers=headers) as http,
        streamable_http_client(url, http_client=http) as streams,
    ):
        yield streams


def _import_sdk() -> None:
    try:
        importlib.import_module("mcp.client.streamable_http")
        importlib.import_module("mcp.client.stdio")
    except ModuleNotFoundError as exc:
        if exc.name is None or exc.name.split(".")[0] not in ("mcp", "mcp_types"):
            raise
        raise ImportError(
            "agents.MCPServer needs the official MCP SDK: pip install 'pantheon[mcp]'"
        ) from exc


def _describe(exc: BaseException) -> str:
    """One line for ``exc``; an exception group (anyio's task groups raise them) by its leaves."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_describe(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _content(blocks: Sequence[Any]) -> Any:
    """Content blocks as JSON-able data: text as ``str``, others as their JSON form."""
    values = [
        block.text
        if getattr(block, "type", None) == "text"
        else block.model_dump(mode="json", by_alias=True, exclude_none=True)
        for block in blocks
    ]
    if not values:
        return None
    return values[0] if len(values) == 1 else values


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, list):
        return " ".join(_text(item) for item in value)
    return value if isinstance(value, str) else str(value)
