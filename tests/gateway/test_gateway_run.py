"""``pantheon run`` with a ``gateway:`` section: the gateway lives as long as the run, and an
``http`` input with a ``count`` ends the run by itself."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets
from gateway_server import HERE, PANTHEON, free_port

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning:websockets")

SCENARIO = """
version: 1
name: gwrun
input: {{kind: http, topic: data.in, count: 2}}
gateway: {{port: {port}}}
agents:
  sink: {{handler: "gwteam:sink", subscribe: ["data.*"]}}
"""


async def _feed_and_watch(url: str, proc: subprocess.Popen[str]) -> tuple[Any, ...]:
    """Post the two records with a subscriber connected; wait for the run to end; return
    the run's output and how the subscriber's connection was closed."""
    async with (
        httpx.AsyncClient(base_url=url, timeout=10) as http,
        websockets.connect(f"ws{url[4:]}/v1/subscribe?pattern=data.*") as ws,
    ):
        for n in (1, 2):
            r = await http.post("/v1/inbox", json={"id": n})
            assert r.status_code == 202, r.text
        out, err = await asyncio.to_thread(proc.communicate, timeout=60)
        got = 0
        with pytest.raises(websockets.ConnectionClosed) as caught:
            while True:
                got += len(json.loads(await asyncio.wait_for(ws.recv(), 30))["messages"])
    close = caught.value.rcvd
    assert close is not None
    return out, err, (close.code, close.reason, got)


def test_pantheon_run_serves_the_gateway_until_the_input_ends(tmp_path: Path) -> None:
    port = free_port()
    (tmp_path / "gwteam.py").write_text((HERE / "gwteam.py").read_text())
    (tmp_path / "run.yaml").write_text(SCENARIO.format(port=port))
    env = {**os.environ, "PANTHEON_STORE": str(tmp_path / "s.db")}
    proc = subprocess.Popen(
        [*PANTHEON, "run", "run.yaml", "--json"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        assert time.monotonic() < deadline and proc.poll() is None, "the gateway never came up"
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.1)
    out, err, closed = asyncio.run(_feed_and_watch(url, proc))
    # a subscriber still connected when the run ends is told the gateway is going away
    assert closed == (1001, "the gateway is stopping", 2)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert (summary["inputs"], summary["passed"]) == (2, True)
    assert f"gateway on {url}" in err
    try:  # and the gateway is gone with the run
        httpx.get(f"{url}/healthz", timeout=1)
        raise AssertionError("the gateway outlived its run")
    except httpx.ConnectError:
        pass


def test_a_port_in_use_or_a_missing_token_variable_stops_before_anything_runs(
    tmp_path: Path,
) -> None:
    (tmp_path / "gwteam.py").write_text((HERE / "gwteam.py").read_text())
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        (tmp_path / "run.yaml").write_text(SCENARIO.format(port=port))
        proc = subprocess.run(
            [*PANTHEON, "serve", "run.yaml", "--store", "s.db"],
            cwd=tmp_path, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    assert proc.returncode == 2
    assert (
        f"nothing ran: the gateway cannot listen on 127.0.0.1:{port}: Address already in use"
        in (proc.stderr)
    )
    (tmp_path / "env.yaml").write_text(
        SCENARIO.format(port=0).replace("gateway: {port: 0}", "gateway: {tokens_env: NO_SUCH_VAR}")
    )
    env = {k: v for k, v in os.environ.items() if k != "NO_SUCH_VAR"}
    proc = subprocess.run(
        [*PANTHEON, "run", "env.yaml", "--store", "t.db"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "env.yaml: nothing ran: $NO_SUCH_VAR: the tokens variable is not set" in proc.stderr
    assert not (tmp_path / "t.db").exists()  # no session was started
