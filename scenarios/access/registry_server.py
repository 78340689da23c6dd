"""``python registry_server.py --seed access_registry.json``: the access desk's registry as an
MCP server, written with the official ``mcp`` SDK over SQLite.

The database is in memory and filled from the seed file at every start, so every run (and
every what-if that calls it live) starts from the same resources and grants, and nothing a
run records ever changes the seed. The reviewer agent reaches it over stdio
(:mod:`access.registry` starts it). Its tools:

``resource_policy(resource)``   owning departments, whether it is restricted, what it
                                conflicts with; an unknown resource is a tool error
``current_grants(employee)``    ``{"employee", "grants": [{"resource", "level"}, ...]}``
``record_decision(...)``        stores the desk's decision (and a granted access as a grant)

It is run by its file path, not as a module of the ``access`` package, so it needs nothing
on the import path but the SDK.
"""

from __future__ import annotations

import argparse
import json
import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

__all__ = ["build_server", "main"]

SERVER_NAME = "access-registry"

_SCHEMA = """
CREATE TABLE resources (
    name TEXT PRIMARY KEY, owners TEXT NOT NULL, restricted INTEGER NOT NULL,
    conflicts TEXT NOT NULL
);
CREATE TABLE grants (employee TEXT NOT NULL, resource TEXT NOT NULL, level TEXT NOT NULL);
CREATE TABLE decisions (
    request_id TEXT PRIMARY KEY, employee TEXT NOT NULL, resource TEXT NOT NULL,
    level TEXT NOT NULL, decision TEXT NOT NULL, reason TEXT NOT NULL
);
"""


def seeded(seed: str | Path) -> sqlite3.Connection:
    """A fresh in-memory database holding the seed file's resources and grants."""
    data = json.loads(Path(seed).read_text(encoding="utf-8"))
    conn = sqlite3.connect(":memory:", isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.executescript(_SCHEMA)
    conn.executemany(
        "INSERT INTO resources VALUES (?, ?, ?, ?)",
        [
            (r["name"], json.dumps(r["owners"]), int(r["restricted"]), json.dumps(r["conflicts"]))
            for r in data["resources"]
        ],
    )
    conn.executemany(
        "INSERT INTO grants VALUES (?, ?, ?)",
        [(g["employee"], g["resource"], g["level"]) for g in data["grants"]],
    )
    return conn


def build_server(seed: str | Path) -> MCPServer[Any]:
    """The registry server over a database seeded from ``seed``."""
    conn = seeded(seed)
    server: MCPServer[Any] = MCPServer(
        SERVER_NAME,
        instructions="The access registry: resource policies, current grants, decisions.",
        log_level="WARNING",
    )

    @server.tool()
    async def resource_policy(resource: str) -> dict[str, Any]:
        """A resource's access policy: the departments that own it, whether it is
        restricted (write needs a change ticket), and the resources it conflicts with."""
        row = conn.execute("SELECT * FROM resources WHERE name = ?", (resource,)).fetchone()
        if row is None:
            raise ToolError(f"no resource named {resource!r} in the registry")
        return {
            "resource": row["name"],
            "owners": json.loads(row["owners"]),
            "restricted": bool(row["restricted"]),
            "conflicts": json.loads(row["conflicts"]),
        }

    @server.tool()
    async def current_grants(employee: str) -> dict[str, Any]:
        """The access an employee holds today, one entry per resource."""
        rows = conn.execute(
            "SELECT resource, level FROM grants WHERE employee = ? ORDER BY resource, level",
            (employee,),
        )
        return {"employee": employee, "grants": [dict(row) for row in rows]}

    @server.tool()
    async def record_decision(
        request_id: str,
        employee: str,
        resource: str,
        level: Literal["read", "write", "admin"],
        decision: Literal["grant", "deny", "escalate"],
        reason: str,
    ) -> dict[str, Any]:
        """Record the desk's decision on a request; a granted one becomes a grant."""
        try:
            conn.execute(
                "INSERT INTO decisions VALUES (?, ?, ?, ?, ?, ?)",
                (request_id, employee, resource, level, decision, reason),
            )
        except sqlite3.IntegrityError:
            raise ToolError(f"request {request_id!r} has a decision already") from None
        if decision == "grant":
            conn.execute("INSERT INTO grants VALUES (?, ?, ?)", (employee, resource, level))
        return {"request_id": request_id, "decision": decision, "recorded": True}

    return server


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", required=True, help="the registry's seed file (JSON)")
    args = parser.parse_args(argv)
    build_server(args.seed).run("stdio")


if __name__ == "__main__":
    main()
