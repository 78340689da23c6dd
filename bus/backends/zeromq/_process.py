"""Run a broker in its own process: for tests, benchmarks and ``pantheon run``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator

__all__ = ["run_broker"]


@contextlib.asynccontextmanager
async def run_broker(
    bind: str = "tcp://127.0.0.1:0",
    *,
    curve_secret: str | os.PathLike[str] | None = None,
    allow: str | os.PathLike[str] | None = None,
    heartbeat: float = 1.0,
    liveness: int = 3,
    max_frame: int | None = None,
    start_timeout: float = 20.0,
) -> AsyncIterator[str]:
    """Start ``python -m bus.backends.zeromq broker`` and yield its bound endpoint.

    The child prints one JSON line when it is listening (a ready handshake: no sleeping
    and hoping); the endpoint comes from it, so ``tcp://127.0.0.1:0`` works. On exit the
    broker gets SIGTERM, then SIGKILL if it has not stopped within five seconds.
    """
    args = [sys.executable, "-m", "bus.backends.zeromq", "broker", "--bind", bind]
    args += ["--heartbeat", str(heartbeat), "--liveness", str(liveness)]
    if max_frame is not None:
        args += ["--max-frame", str(max_frame)]
    if curve_secret is not None:
        args += ["--curve-secret", os.fspath(curve_secret)]
    if allow is not None:
        args += ["--allow", os.fspath(allow)]
    proc = await asyncio.create_subprocess_exec(
        *args, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    assert proc.stdout is not None and proc.stderr is not None
    stderr = proc.stderr
    # Keep reading stderr (the broker's log) so a chatty broker never blocks on a full pipe.
    log: list[bytes] = []
    pump = asyncio.get_running_loop().create_task(_pump(stderr, log))
    try:
        try:
            async with asyncio.timeout(start_timeout):
                line = await proc.stdout.readline()
        except TimeoutError:
            line = b""
        if not line:
            await _stop(proc)
            await pump
            raise RuntimeError(
                f"broker did not start on {bind}: {b''.join(log).decode(errors='replace')}"
            )
        endpoint = json.loads(line)["endpoint"]
        yield endpoint
    finally:
        await _stop(proc)
        pump.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pump


async def _pump(stream: asyncio.StreamReader, log: list[bytes]) -> None:
    while line := await stream.readline():
        log.append(line)
        if len(log) > 200:
            del log[:100]


async def _stop(proc: asyncio.subprocess.Process) -> None:
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(5):
                await proc.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
