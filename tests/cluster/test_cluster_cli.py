"""``pantheon keys | broker | node`` as a user runs them: real processes, real sockets."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from cli_run import pantheon

ROOT = Path(__file__).resolve().parents[2]
THREE_NODE = ROOT / "scenarios" / "support_email_3node.yaml"
ENV = os.environ | {"COLUMNS": "250"}


def spawn(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "pantheon.cli", *args],
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )


def read_line(stream, deadline: float, needle: str = "") -> str:  # type: ignore[no-untyped-def]
    """The first line of ``stream`` containing ``needle`` (blocking reads, with a deadline
    checked between lines; the caller's process timeout bounds a silent child)."""
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            break
        if needle in line:
            return str(line).strip()
    raise AssertionError(f"no line with {needle!r} before the deadline or EOF")


def stop(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[int, str]:
    """SIGINT, as Ctrl-C would; returns (exit code, remaining stderr)."""
    proc.send_signal(signal.SIGINT)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
        raise
    return proc.returncode, err


@contextmanager
def broker(*args: str, cwd: Path) -> Iterator[tuple[str, subprocess.Popen[str]]]:
    """A ``pantheon broker`` on a free port; yields (its endpoint, the process)."""
    proc = spawn("broker", "--bind", "tcp://127.0.0.1:0", *args, cwd=cwd)
    try:
        assert proc.stdout is not None
        endpoint = read_line(proc.stdout, time.monotonic() + 30, "tcp://")
        yield endpoint, proc
    finally:
        if proc.poll() is None:
            code, err = stop(proc)
            assert code == 0, err


def test_keys_writes_a_pair_and_refuses_to_overwrite(tmp_path: Path) -> None:
    proc = pantheon("keys", "keys", "--name", "node1", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    public, secret = tmp_path / "keys" / "node1.key", tmp_path / "keys" / "node1.key_secret"
    assert "public-key" in public.read_text() and "secret-key" not in public.read_text()
    assert "secret-key" in secret.read_text()
    assert secret.stat().st_mode & 0o777 == 0o600
    before = secret.read_text()

    again = pantheon("keys", "keys", "--name", "node1", cwd=tmp_path)
    assert again.returncode == 1
    assert "refusing to overwrite" in again.stderr and "node1.key" in again.stderr
    assert secret.read_text() == before


def test_node_with_a_wrong_key_is_refused_and_the_right_key_joins(tmp_path: Path) -> None:
    for name in ("broker", "good", "bad"):
        assert pantheon("keys", "keys", "--name", name, cwd=tmp_path).returncode == 0
    allowed = tmp_path / "allowed"
    allowed.mkdir()
    (allowed / "good.key").write_text((tmp_path / "keys" / "good.key").read_text())
    curve = ["--curve-secret", "keys/broker.key_secret", "--allow", "allowed"]
    with broker(*curve, cwd=tmp_path) as (endpoint, _):
        refused = pantheon(
            "node", "--connect", endpoint, "--agents", "sensor", "--timeout", "2",
            "--curve-secret", "keys/bad.key_secret", "--server-key", "keys/broker.key",
            cwd=tmp_path,
        )  # fmt: skip
        assert refused.returncode == 2
        assert endpoint in refused.stderr
        assert "CURVE" in refused.stderr
        assert "Traceback" not in refused.stderr

        node = spawn(
            "node", "--connect", endpoint, "--agents", "sensor,reasoner", "--node", "n1",
            "--scenario", str(THREE_NODE), "--status-every", "0.2",
            "--curve-secret", "keys/good.key_secret", "--server-key", "keys/broker.key",
            cwd=tmp_path,
        )  # fmt: skip
        assert node.stderr is not None
        deadline = time.monotonic() + 30
        joined = read_line(node.stderr, deadline, "joined")
        assert f"node n1 joined {endpoint}, hosting sensor, reasoner" in joined
        # It shows its clock offset to the broker: none to estimate on the broker's machine.
        line = read_line(node.stderr, deadline, "clock offset to broker")
        assert line.endswith("clock offset to broker exactly known (same machine)")
        code, err = stop(node)
        assert code == 0, err
        assert "node n1 stopped" in err


def test_broker_refuses_allow_without_curve(tmp_path: Path) -> None:
    (tmp_path / "allowed").mkdir()
    proc = pantheon("broker", "--allow", "allowed", cwd=tmp_path)
    assert proc.returncode == 2
    assert "--allow needs --curve-secret" in proc.stderr


def test_broker_refuses_curve_without_allow_rather_than_refusing_every_node(
    tmp_path: Path,
) -> None:
    # It once started after warning that any node could join, then refused every node.
    assert pantheon("keys", "keys", "--name", "broker", cwd=tmp_path).returncode == 0
    proc = pantheon(
        "broker", "--bind", "tcp://127.0.0.1:0", "--curve-secret", "keys/broker.key_secret",
        cwd=tmp_path, timeout=30,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "--curve-secret needs --allow DIR" in proc.stderr
    assert "warning" not in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""  # never listened: no endpoint printed


@pytest.mark.parametrize(
    "bind", ["tcp://0.0.0.0:0", "tcp://*:0", "tcp://10.1.2.3:5555", "tcp://eth0:5555"]
)
def test_broker_refuses_a_network_address_without_curve(tmp_path: Path, bind: str) -> None:
    # Without CURVE whoever reaches the port joins and every node links to what it claims.
    proc = pantheon("broker", "--bind", bind, cwd=tmp_path, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr == (
        f"error: --bind {bind} is reachable from the network and CURVE is off: pass "
        "--curve-secret and --allow, or --insecure to accept anyone who reaches it\n"
    )
    assert proc.stdout == ""  # never listened


@pytest.mark.parametrize(
    ("bind", "why"),
    [
        # libzmq would bind 4464 (70000 - 65536) and the broker print that endpoint.
        ("tcp://127.0.0.1:70000", "port 70000 is over 65535"),
        ("banana", "'banana' is no ZeroMQ broker address"),
    ],
)
def test_broker_refuses_a_malformed_address(tmp_path: Path, bind: str, why: str) -> None:
    proc = pantheon("broker", "--bind", bind, "--insecure", cwd=tmp_path, timeout=30)
    assert proc.returncode == 2
    assert proc.stderr == (
        f"error: --bind {bind}: {why}: give tcp://HOST:PORT (port 0 to 65535, 0 for any free "
        "port) or ipc://PATH\n"
    )
    assert proc.stdout == ""  # never listened


def test_a_node_refuses_a_malformed_broker_address(tmp_path: Path) -> None:
    """``--connect`` is checked as ``--bind`` is (a NATS URL is the NATS client's to judge)."""
    proc = pantheon(
        "node", "--connect", "tcp://127.0.0.1:70000", "--agents", "sensor", cwd=tmp_path, timeout=30
    )
    assert proc.returncode == 2
    assert proc.stderr == (
        "error: --connect tcp://127.0.0.1:70000: port 70000 is over 65535: give tcp://HOST:PORT "
        "(port 0 to 65535, 0 for any free port) or ipc://PATH\n"
    )


def test_insecure_lifts_the_refusal(tmp_path: Path) -> None:
    # 192.0.2.1 (TEST-NET-1) is no address of this machine: with --insecure the broker gets
    # past the CURVE check and tries to bind it, and never listens on a real network.
    proc = pantheon("broker", "--bind", "tcp://192.0.2.1:5555", "--insecure", cwd=tmp_path)
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: cannot start a broker on tcp://192.0.2.1:5555: ")
    assert "Cannot assign requested address" in proc.stderr
    assert "CURVE is off" not in proc.stderr and "Traceback" not in proc.stderr


def test_unreachable_broker_names_the_endpoint_and_the_timeout(tmp_path: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    endpoint = f"tcp://127.0.0.1:{port}"
    proc = pantheon(
        "node", "--connect", endpoint, "--agents", "sensor", "--timeout", "1", cwd=tmp_path
    )
    assert proc.returncode == 2
    assert endpoint in proc.stderr
    assert "within 1.0s" in proc.stderr
    assert "Traceback" not in proc.stderr


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_broker_and_node_stop_cleanly_on_signals(tmp_path: Path, signum: int) -> None:
    with broker(cwd=tmp_path) as (endpoint, proc):
        node = spawn("node", "--connect", endpoint, "--agents", "guardian", cwd=tmp_path)
        assert node.stderr is not None
        read_line(node.stderr, time.monotonic() + 30, "joined")
        node.send_signal(signum)
        _, err = node.communicate(timeout=30)
        assert node.returncode == 0, err
        assert "stopped" in err
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=30)
        assert proc.returncode == 0, err
        assert "broker stopped" in err
