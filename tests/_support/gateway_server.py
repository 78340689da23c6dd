"""A real gateway for the tests: ``pantheon serve`` in a subprocess on a free loopback port
(tests/gateway uses it; on the pythonpath, so no test imports another folder's conftest)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "tests" / "gateway"
PANTHEON = [sys.executable, "-m", "pantheon.cli"]

#: Tokens of the test server: one from the file, one from the environment variable.
PUBLISHER = "pub-3f9c2a7d41b84e0f9a6c"
READER = "read-8e1d5b90c2f74a63b1d7"
ADMIN = "admin-b2c94f0e7a1d4c58e6f3"
TOKENS_FILE = f"""
tokens:
  - name: publisher
    token: "{PUBLISHER}"
    publish: ["data.*", "svc.*", "slow.*", "inbox.*"]
    subscribe: ["data.*"]
"""
TOKENS_ENV = json.dumps(
    {
        "tokens": [
            {"name": "reader", "token": READER, "publish": [], "subscribe": [">"]},
            {"name": "admin", "token": ADMIN, "publish": [">"], "subscribe": [">"]},
        ]
    }
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Server:
    url: str
    ws: str
    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path
    store: Path

    def rss_kib(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
        raise AssertionError("no VmRSS")

    def stop(self) -> int:
        """SIGINT (Ctrl-C): the run finishes and is recorded; returns the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise AssertionError("pantheon serve did not stop within 60 s of SIGINT") from None
        return self.proc.returncode

    def logs(self) -> str:
        return self.stdout.read_text(errors="replace") + self.stderr.read_text(errors="replace")


def start_server(
    scenario: Path, tmp: Path, *args: str, env: dict[str, str] | None = None
) -> Server:
    port = free_port()
    stdout, stderr = tmp / "serve.out", tmp / "serve.err"
    store = tmp / "sessions.db"
    full_env = {**os.environ, "PANTHEON_LOG_LEVEL": "DEBUG", **(env or {})}
    full_env.pop("PANTHEON_STORE", None)
    with stdout.open("wb") as out, stderr.open("wb") as err:
        proc = subprocess.Popen(
            [*PANTHEON, "serve", str(scenario), "--port", str(port), "--store", str(store), *args],
            stdout=out,
            stderr=err,
            cwd=tmp,
            env=full_env,
        )
    server = Server(
        f"http://127.0.0.1:{port}", f"ws://127.0.0.1:{port}", proc, stdout, stderr, store
    )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"pantheon serve exited {proc.returncode}:\n{server.logs()}")
        try:
            if httpx.get(f"{server.url}/readyz", timeout=1).status_code == 200:
                return server
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    server.stop()
    raise AssertionError(f"pantheon serve was not ready within 60 s:\n{server.logs()}")


SCENARIO = """
version: 1
name: gwtest
input:
  kind: http
  topic: inbox.received
  buffer: {buffer}
gateway:
  tokens_file: tokens.yaml
  tokens_env: GW_TEST_TOKENS
  max_body: {max_body}
  max_batch: 500
  send_queue: {send_queue}
  max_drops: {max_drops}
  request_timeout: 10
agents:
  echo: {{handler: "gwteam:echo", subscribe: ["svc.echo"]}}
  failing: {{handler: "gwteam:fail", subscribe: ["svc.fail"]}}
  silent: {{handler: "gwteam:silent", subscribe: ["svc.silent"]}}
  slow: {{handler: "gwteam:slow", subscribe: ["slow.*"], max_queue: 1, overflow: reject}}
  sink: {{handler: "gwteam:sink", subscribe: ["data.*", "inbox.*"], max_queue: 1000000}}
"""


def write_scenario(
    tmp: Path,
    *,
    buffer: int = 16,
    send_queue: int = 4096,
    max_drops: int = 100_000,
    max_body: int = 4096,
) -> Path:
    (tmp / "tokens.yaml").write_text(TOKENS_FILE)
    (tmp / "gwteam.py").write_text((HERE / "gwteam.py").read_text())
    path = tmp / "gwtest.yaml"
    path.write_text(
        SCENARIO.format(
            buffer=buffer, send_queue=send_queue, max_drops=max_drops, max_body=max_body
        )
    )
    return path
