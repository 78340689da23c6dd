"""The reviewer's tool source: the registry MCP server (:mod:`access.registry_server`),
started over stdio by :class:`agents.MCPServer` when the reviewer first handles a request
live, and stopped with it.

Each start is a new server process, so the same team can run, then be what-if replayed, in
one process (a test's), each time against a freshly seeded server; the source names the
server by its script and seed file (:meth:`Registry.request_identity`)."""

from __future__ import annotations

import sys
from pathlib import Path

from agents import MCPServer, Tool

__all__ = ["REGISTRY", "Registry"]

HERE = Path(__file__).resolve().parent
SEED = HERE.parent / "data" / "access_registry.json"


class Registry:
    """The registry server as a :class:`agents.ToolSource` that can be started again."""

    def __init__(self, seed: Path = SEED, *, timeout: float = 20.0) -> None:
        self.seed = seed
        self.timeout = timeout
        self._server: MCPServer | None = None

    def request_identity(self) -> object:
        """Which server a call asks (:class:`agents.RequestIdentity`): the server's script and
        its seed file, so a what-if serves a registry call asked with the recorded arguments
        instead of starting the server again."""
        return ("access/registry_server.py", str(self.seed))

    def command(self) -> list[str]:
        return [sys.executable, str(HERE / "registry_server.py"), "--seed", str(self.seed)]

    async def start(self) -> None:
        # A Python stdio server importing the SDK takes about 1 s to list its tools on a
        # quiet machine; a loaded one is given a minute.
        server = MCPServer(
            command=self.command(), name="access-registry", timeout=self.timeout, start_timeout=60
        )
        await server.start()
        self._server = server

    def tools(self) -> list[Tool]:
        if self._server is None:
            raise RuntimeError("the access registry has not been started")
        return list(self._server.tools())

    async def aclose(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            await server.aclose()


#: What the scenario gives the reviewer: ``tools: ["access.registry:REGISTRY"]``.
REGISTRY = Registry()
