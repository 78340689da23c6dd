"""``pantheon run`` with a ``gateway:`` section: the gateway lives as long as the run, and an
``http`` input with a ``count`` ends the run by itself."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import httpx
from conftest import HERE, PANTHEON, free_port

SCENARIO = """
version: 1
name: gwrun
input: {{kind: http, topic: data.in, count: 2}}
gateway: {{port: {port}}}
agents:
  sink: {{handler: "gwteam:sink", subscribe: ["data.*"]}}
"""


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
    for n in (1, 2):
        r = httpx.post(f"{url}/v1/inbox", json={"id": n}, timeout=10)
        assert r.status_code == 202, r.text
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    summary = json.loads(out)
    assert (summary["inputs"], summary["passed"]) == (2, True)
    assert f"gateway on {url}" in err
    try:  # and the gateway is gone with the run
        httpx.get(f"{url}/healthz", timeout=1)
        raise AssertionError("the gateway outlived its run")
    except httpx.ConnectError:
        pass
