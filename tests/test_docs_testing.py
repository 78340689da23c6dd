"""docs/testing.md runs as written: its files, in the order the page gives them (blocks
naming the same file are its parts, in order), in a folder made by ``pantheon new``, and
``python -m pytest`` passes every test they hold."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "testing.md"


def _files() -> dict[str, str]:
    files: dict[str, str] = {}
    text = DOC.read_text()
    for name, body in re.findall(r"^```\w+ (\S+)\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
        files[name] = files[name] + "\n\n" + body if name in files else body
    return files


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_the_testing_guide_runs_as_written(tmp_path: Path) -> None:
    made = _run(["pantheon", "new", "desk"], tmp_path)
    assert made.returncode == 0, made.stdout + made.stderr
    team = tmp_path / "desk"
    files = _files()
    assert set(files) == {
        "sorting.py",
        "sorting.yaml",
        "tickets.jsonl",
        "tests/test_sorting_agents.py",
        "tests/test_sorting_team.py",
        "tests/test_sorting_whatif.py",
    }
    for name, body in files.items():
        (team / name).write_text(body, encoding="utf-8")
    tests = [n for n in files if n.startswith("tests/")]
    count = sum(len(re.findall(r"^(?:async )?def test_", files[n], re.MULTILINE)) for n in tests)
    done = _run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *tests], team)
    assert done.returncode == 0, done.stdout + done.stderr
    assert re.search(rf"\b{count} passed\b", done.stdout), done.stdout
    assert count == 6
