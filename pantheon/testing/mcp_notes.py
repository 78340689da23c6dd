"""``python -m pantheon.testing.mcp_notes --db notes.sqlite``: a small MCP server of notes kept
in a SQLite file, written with the official ``mcp`` SDK (``pip install 'pantheon[mcp]'``).

It is what :class:`agents.MCPServer` is tested against and what a team's own tests can start
the same way: over stdio by default (``MCPServer(command=[sys.executable, "-m",
"pantheon.testing.mcp_notes", "--db", path])``), or over streamable HTTP on 127.0.0.1 with
``--port N`` (``MCPServer(url="http://127.0.0.1:N/mcp")``). Its tools:

``add_note(title, text)``   stores a note, answers ``{"id": n}``
``find_notes(query)``       ``{"notes": [...]}`` whose title or text contains ``query``
``read_note(id)``           one note; an unknown id is a tool error (an ``isError`` result)

``--delay S`` makes every tool call take S seconds more, as a slow server does (a client's
timeouts are tested with it). It lives in ``pantheon.testing`` rather than a scenario's folder
because it is a shipped test fixture: installed with the package, runnable by ``-m`` from any
directory, with no import of a team's code.
"""

from __future__ import annotations

import argparse
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

try:
    import anyio
    from mcp.server.mcpserver import MCPServer
    from mcp.server.mcpserver.exceptions import ToolError
except ImportError as exc:  # pragma: no cover - the message is the point
    raise ImportError(
        "pantheon.testing.mcp_notes needs the MCP SDK: pip install 'pantheon[mcp]'"
    ) from exc

__all__ = ["build_server", "main"]

#: The server's name as MCP clients see it (``serverInfo.name``).
SERVER_NAME = "notes"

#: ``find_notes`` answers at most this many notes (newest first), so an answer stays small
#: enough to hand to a model whole.
MAX_FOUND = 20

_SCHEMA = """
CREATE TABLE IF NOT EXISTS notes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    text TEXT NOT NULL
)
"""


def build_server(db: str | Path, *, delay: float = 0.0) -> MCPServer[Any]:
    """The notes server over the SQLite file ``db`` (created if missing).

    One connection serves every call: the SDK runs the tools on one event loop, one at a time
    per statement, and each statement is a few microseconds on a small file, so a thread pool
    would cost more than it saves. ``delay`` seconds are slept (without blocking other calls)
    before each tool answers."""
    if delay < 0:
        raise ValueError(f"delay must be >= 0 seconds, got {delay}")
    conn = sqlite3.connect(db, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute(_SCHEMA)
    server: MCPServer[Any] = MCPServer(
        SERVER_NAME,
        instructions="Notes kept in a SQLite file: add, find and read them.",
        log_level="WARNING",
    )

    @server.tool()
    async def add_note(title: str, text: str) -> dict[str, int]:
        """Store a note and answer its id."""
        await anyio.sleep(delay)
        cursor = conn.execute("INSERT INTO notes (title, text) VALUES (?, ?)", (title, text))
        return {"id": int(cursor.lastrowid or 0)}

    @server.tool()
    async def find_notes(query: str) -> dict[str, list[dict[str, Any]]]:
        """The notes whose title or text contains ``query`` (case-insensitive), newest first,
        as ``{"notes": [{"id", "title", "text"}, ...]}``."""
        await anyio.sleep(delay)
        pattern = f"%{query}%"
        rows = conn.execute(
            "SELECT id, title, text FROM notes WHERE title LIKE ? OR text LIKE ?"
            " ORDER BY id DESC LIMIT ?",
            (pattern, pattern, MAX_FOUND),
        )
        return {"notes": [dict(row) for row in rows]}

    @server.tool()
    async def read_note(id: int) -> dict[str, Any]:
        """One note by its id."""
        await anyio.sleep(delay)
        row = conn.execute("SELECT id, title, text FROM notes WHERE id = ?", (id,)).fetchone()
        if row is None:
            raise ToolError(f"no note with id {id}")
        return dict(row)

    return server


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m pantheon.testing.mcp_notes", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--db", required=True, help="the SQLite file of the notes")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds added to every call")
    parser.add_argument(
        "--port", type=int, default=None, help="serve streamable HTTP on 127.0.0.1:PORT/mcp"
    )
    args = parser.parse_args(argv)
    server = build_server(args.db, delay=args.delay)
    if args.port is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.port)


if __name__ == "__main__":
    main()
