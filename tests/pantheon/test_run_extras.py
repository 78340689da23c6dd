"""Commands that need an optional extra say which one when it is missing, before anything
runs. The dev environment has every extra, so each test hides one from a child process."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Run the CLI as if `module` were not installed: importing it raises ImportError.
CHILD = "import sys; sys.modules[{module!r}] = None; from pantheon.cli import main; main()"


def pantheon_without(module: str, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", CHILD.format(module=module), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_zmq_scenario_without_pyzmq_names_the_extra(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    proc = pantheon_without("zmq", "run", "scenarios/support_email_3node.yaml", cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "needs pyzmq" in proc.stderr and "pantheon[zmq]" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / ".pantheon" / "sessions.db").exists()  # nothing ran


def test_monitor_without_textual_names_the_extra(tmp_path: Path) -> None:
    proc = pantheon_without("textual", "monitor", "--store", str(tmp_path / "s.db"), cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "pantheon[tui]" in proc.stderr
    assert "Traceback" not in proc.stderr
