"""``pantheon run scenarios/support_email.yaml --tui`` in a real terminal (tmux), read back
with ``capture-pane`` as a user would see it."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from untimed import copy_untimed

from pantheon.sessions import SessionStore

DEADLINE = 60.0

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="needs tmux")


def _wait(check, what: str):  # type: ignore[no-untyped-def]
    end = time.monotonic() + DEADLINE
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def test_run_with_tui_in_a_real_terminal(tmp_path: Path) -> None:
    sock = f"pantheon-tui-{uuid.uuid4().hex[:8]}"
    store = tmp_path / "sessions.db"
    done = tmp_path / "exit-code"
    copy_untimed(tmp_path)  # its verdict is about the team, not the machine's speed
    cmd = (
        f"cd {shlex.quote(str(tmp_path))} && "
        f"{shlex.quote(sys.executable)} -m pantheon.cli run scenarios/support_email.yaml "
        f"--tui --store {shlex.quote(str(store))} > {shlex.quote(str(tmp_path / 'out'))}; "
        f"echo $? > {shlex.quote(str(done))}; sleep 600"
    )
    tmux = ["tmux", "-L", sock]
    env = {k: v for k, v in os.environ.items() if k != "TMUX"} | {"TERM": "xterm-256color"}

    def screen() -> str:
        return subprocess.run(
            [*tmux, "capture-pane", "-p", "-t", "monitor"],
            capture_output=True,
            text=True,
            check=True,
            env=env,
        ).stdout

    subprocess.run(
        [*tmux, "new-session", "-d", "-s", "monitor", "-x", "100", "-y", "30", cmd],
        check=True,
        env=env,
    )
    try:
        # The run ends in about a second; the monitor stays up on its final numbers.
        pattern = re.compile(
            r"(completed|failed)\s+t=[\d.]+s\s+published ([\d,]+)\s+delivered ([\d,]+)"
        )
        found = _wait(lambda: pattern.search(screen()), "the totals of the finished run")
        status, published = found.group(1), int(found.group(2).replace(",", ""))
        assert status == "completed", screen()
        assert int(found.group(3).replace(",", "")) > 0
        sparkline = re.compile(r"observation\.email\.re\S*\s+[\d,]+\s+[\d.]+k?/s [▁▂▃▄▅▆▇█]+")
        shown = _wait(lambda: (lambda s: sparkline.search(s) and s)(screen()), "a sparkline")
        assert "1 Throughput" in shown and "6 Usage" in shown  # the panel tabs
        subprocess.run([*tmux, "send-keys", "-t", "monitor", "2"], check=True, env=env)
        _wait(lambda: "wait p50" in screen(), "the latency panel")
        assert re.search(r"sensor\s+[\d,]+\s+\d", screen())
        # The Reasoner asks the rule provider: calls, no tokens, and so an exact $0 (a call
        # without tokens costs nothing and leaves the run priced: no "*").
        subprocess.run([*tmux, "send-keys", "-t", "monitor", "6"], check=True, env=env)
        usage = _wait(lambda: "model calls" in screen() and screen(), "the usage panel")
        calls = re.search(r"([\d,]+) model calls  tokens 0 in / 0 out  cost \$0(?!\*)", usage)
        assert calls, usage
        assert re.search(rf"reasoner\s+{calls.group(1)}\s+0\s+0\s+\$0(?!\*)", usage), usage

        subprocess.run([*tmux, "send-keys", "-t", "monitor", "q"], check=True, env=env)
        code = _wait(lambda: done.exists() and done.read_text().strip(), "pantheon to exit")
        # The run's own summary, printed once the monitor let go of the terminal.
        out = (tmp_path / "out").read_text()
        assert "per-hop latency" in out
        assert code == "0", out
    finally:
        subprocess.run([*tmux, "kill-server"], check=False, env=env, capture_output=True)
    with SessionStore(store) as st:
        (info,) = st.sessions()
        assert info.status == status
        assert st.envelope_counts()[info.id] == published
