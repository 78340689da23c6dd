"""``transport.curve: true``: a run's processes talk over CURVE with keys made for the run."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from untimed import copy_untimed

from bus import Bus
from bus.backends.zeromq import ConnectError, ZmqTransport
from pantheon.runner._multiprocess import _RUNS, cluster_transport
from pantheon.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def curve_scenario(tmp_path: Path) -> Path:
    """The three-node scenario over CURVE, without its timing bounds (not under test)."""
    path = copy_untimed(tmp_path) / "support_email_3node.yaml"
    text = path.read_text()
    assert "  kind: zmq\n" in text
    path.write_text(text.replace("  kind: zmq\n", "  kind: zmq\n  curve: true\n"))
    return path


async def test_the_runs_broker_admits_only_the_runs_keys(curve_scenario: Path) -> None:
    scenario = load_scenario(curve_scenario)
    async with cluster_transport(scenario) as transport:
        assert isinstance(transport, ZmqTransport) and transport.curve is not None
        keys = _RUNS[id(transport)].keys
        assert keys is not None
        assert {p.name for p in keys.iterdir()} >= {"broker.key", "driver.key_secret"}
        assert {p.name for p in (keys / "allowed").iterdir()} == {
            "driver.key", "perception.key", "cognition.key", "action.key"
        }  # fmt: skip
        # A node without the run's keys (here: without CURVE at all) cannot join.
        stranger = ZmqTransport(transport.endpoint, node="stranger", connect_timeout=1.0)
        with pytest.raises(ConnectError):
            await Bus(transport=stranger).start()
        async with Bus(transport=transport):  # the driver's own key gets in
            assert transport.stats()["connected"] is True
    assert not keys.exists()  # made for the run, removed with it


def test_a_three_node_run_over_curve_decides_as_without(curve_scenario: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", str(curve_scenario), "--json", "--no-record"],
        cwd=curve_scenario.parent,
        capture_output=True,
        text=True,
        timeout=180,
        env=os.environ | {"COLUMNS": "250"},
    )
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["nodes"]["driver"]["broker"]["curve"] is True
    assert {n["status"] for n in summary["nodes"].values()} == {"ok"}
    assert summary["accounting_ok"] is True
    assert sum(summary["decisions"].values()) == summary["inputs"] == 591  # each decided once
