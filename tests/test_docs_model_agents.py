"""docs/model-agents.md runs as written: its files, written into one folder as the page
names them, and ``python -m pytest`` there passes every test they hold, against the real
stand-in model server (one the test starts, and one its scenario's ``stand_in`` names);
and ``pantheon validate`` accepts both its scenarios."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "model-agents.md"


def _files() -> dict[str, str]:
    text = DOC.read_text()
    found = re.findall(r"^```\w+ (\S+)\n(.*?)^```", text, re.MULTILINE | re.DOTALL)
    return dict(found)


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_model_agents_guide_runs_as_written(tmp_path: Path) -> None:
    files = _files()
    assert set(files) == {
        "refunds.py",
        "refunds.yaml",
        "asks.jsonl",
        "desk.py",
        "tests/test_refunds.py",
        "tests/test_desk.py",
        "scripted.py",
        "refunds_offline.yaml",
        "tests/test_offline.py",
    }
    for name, body in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(body, encoding="utf-8")
    for scenario in ("refunds.yaml", "refunds_offline.yaml"):
        valid = _run(["pantheon", "validate", scenario], tmp_path)
        assert valid.returncode == 0, valid.stdout + valid.stderr
    tests = sorted(n for n in files if n.startswith("tests/"))
    done = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(r"\b3 passed\b", done.stdout), done.stdout
