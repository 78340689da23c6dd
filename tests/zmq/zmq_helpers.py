"""Helpers for the ZeroMQ tests: nodes in child processes, and waiting with deadlines."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

CHILD = Path(__file__).with_name("zmq_node_child.py")


async def eventually(
    predicate: Callable[[], object], timeout: float = 10.0, what: str = ""
) -> None:
    """Poll ``predicate`` until true; fail after ``timeout`` seconds (a deadline, no sleep
    used as synchronisation)."""
    try:
        async with asyncio.timeout(timeout):
            while not predicate():  # noqa: ASYNC110 - polling other processes' state
                await asyncio.sleep(0.005)
    except TimeoutError:
        pytest.fail(f"not within {timeout}s: {what or predicate}")


class ChildNode:
    """A node process running tests/zmq/zmq_node_child.py."""

    def __init__(self, proc: asyncio.subprocess.Process, outfile: Path) -> None:
        self.proc = proc
        self.outfile = outfile

    def handled(self) -> list[int]:
        if not self.outfile.exists():
            return []
        return [int(line.split()[0]) for line in self.outfile.read_text().splitlines() if line]

    def lines(self) -> list[list[str]]:
        return [line.split() for line in self.outfile.read_text().splitlines() if line]

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)


@contextlib.asynccontextmanager
async def child_node(
    endpoint: str,
    node: str,
    subscription: str,
    pattern: str,
    outfile: Path,
    *extra: str,
) -> AsyncIterator[ChildNode]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(CHILD),
        endpoint,
        node,
        subscription,
        pattern,
        str(outfile),
        *extra,
        stdout=asyncio.subprocess.PIPE,
    )
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(20):
            line = await proc.stdout.readline()
        assert line.strip() == b"ready", f"child {node} did not start: {line!r}"
        yield ChildNode(proc, outfile)
    finally:
        if proc.returncode is None:
            proc.send_signal(signal.SIGTERM)
            try:
                async with asyncio.timeout(10):
                    await proc.wait()
            except TimeoutError:
                proc.kill()
                await proc.wait()
