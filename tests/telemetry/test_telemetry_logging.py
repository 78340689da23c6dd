"""structlog through ``pantheon run``: JSON lines off a terminal, a console on one, and every
line bound with session, agent, topic and message id."""

from __future__ import annotations

import json
import os
import pty
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from untimed import copy_untimed

ROOT = Path(__file__).resolve().parents[2]
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture
def scenario(tmp_path: Path) -> Path:
    """The support scenario without its latency bounds: a shared machine's p99 is not what
    these tests are about, and they need the run to pass."""
    return copy_untimed(tmp_path) / "support_email.yaml"


def run_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    env.update(extra)
    return env


def test_json_lines_carry_session_agent_topic_and_message_id(
    tmp_path: Path, scenario: Path
) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pantheon.cli",
            "run",
            str(scenario),
            "--store",
            str(tmp_path / "s.db"),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=run_env(PANTHEON_LOG_LEVEL="info"),
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)  # logging never touches stdout
    lines = [json.loads(line) for line in proc.stderr.splitlines() if line.startswith("{")]
    escalations = [line for line in lines if line["event"] == "escalated to a human"]
    assert len(escalations) == summary["decisions"]["escalated"] > 0
    for line in escalations:
        assert line["session"] == summary["session_id"]
        assert line["agent"] == "guardian"
        assert line["topic"] == "plan.proposed"
        assert isinstance(line["message_id"], int)
        assert line["level"] == "info" and line["logger"] == "agents.guardian"
        assert line["email_id"].startswith("e") and line["reasons"]
        assert "timestamp" in line
    assert len({line["message_id"] for line in escalations}) == len(escalations)


def test_a_terminal_gets_the_console_renderer(tmp_path: Path, scenario: Path) -> None:
    master, slave = pty.openpty()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pantheon.cli",
            "run",
            str(scenario),
            "--no-record",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=slave,
        env=run_env(PANTHEON_LOG_LEVEL="info", COLUMNS="200"),
        cwd=tmp_path,
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:  # a pty holds a few KiB: read while it runs, or it blocks
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO once the child has exited and closed its end
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=120)
    reader.join(timeout=10)
    os.close(master)
    assert proc.returncode == 0
    json.loads(out)
    text = ANSI.sub("", b"".join(chunks).decode(errors="replace"))
    lines = [line for line in text.splitlines() if "escalated to a human" in line]
    assert lines
    assert not any(line.lstrip().startswith("{") for line in lines)
    assert all("agent=guardian" in line and "topic=plan.proposed" in line for line in lines)
    assert all("message_id=" in line for line in lines)


def test_library_logging_stays_off_stdout_until_configured() -> None:
    """A program that uses ``agents`` and never configures logging gets nothing on stdout
    (structlog's own default would print there) and, as with any stdlib library logger,
    nothing below WARNING on stderr."""
    script = (
        "from agents import Guardian\n"
        "g = Guardian()\n"
        "d = g.decide({'email_id': 'e9', 'sender': 's', 'intent': 'refund', 'amount': 999.0,\n"
        "    'confidence': 0.9, 'action': 'reply', 'steps': [{'tool': 'reply', 'text': 'ok'}]})\n"
        "assert d['verdict'] == 'escalated', d\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "" and proc.stderr == ""


def test_a_bad_log_level_is_refused_before_the_run(tmp_path: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "pantheon.cli", "run", str(ROOT / "scenarios" / "flood.yaml")],
        capture_output=True,
        text=True,
        timeout=60,
        env=run_env(PANTHEON_LOG_LEVEL="chatty"),
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    assert "PANTHEON_LOG_LEVEL" in proc.stderr and "chatty" in proc.stderr


@pytest.mark.parametrize("as_json", [True, False])
def test_configure_logging_renders_stdlib_and_structlog_lines_alike(as_json: bool) -> None:
    script = (
        "import asyncio, logging, structlog\n"
        "from bus import Bus\n"
        "from pantheon.telemetry import configure_logging, get_logger\n"
        f"configure_logging(level='info', json={as_json})\n"
        "async def main():\n"
        "    async with Bus(session_id='S1') as bus:\n"
        "        async def handle(env):\n"
        "            get_logger('lib').info('from lib', n=1)\n"
        "            structlog.get_logger('app').warning('from app')\n"
        "            logging.getLogger('plain').error('from stdlib')\n"
        "        bus.on('t.*', handle, name='worker:t.*')\n"
        "        await bus.emit('t.x', None)\n"
        "asyncio.run(main())\n"
        "get_logger('lib').info('outside a handler')\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == ""
    lines = proc.stderr.splitlines()
    assert len(lines) == 4
    if as_json:
        records = [json.loads(line) for line in lines]
        for rec, event in zip(records, ("from lib", "from app", "from stdlib"), strict=False):
            assert rec["event"] == event
            assert (rec["session"], rec["agent"], rec["topic"]) == ("S1", "worker", "t.x")
        assert records[0]["n"] == 1
        assert "session" not in records[3] and records[3]["event"] == "outside a handler"
    else:
        assert all(not line.startswith("{") for line in lines)
        assert "agent=worker" in lines[2] and "session=S1" in lines[2]
