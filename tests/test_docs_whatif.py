"""docs/what-if.md runs as written: every shell command, the overlay examples and the Python
snippet, in a copy of the scenarios (its "keep the fix" step edits a scenario file)."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pantheon

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "what-if.md"


def _blocks(kind: str) -> list[str]:
    return re.findall(rf"^```{kind}\n(.*?)^```", DOC.read_text(), re.MULTILINE | re.DOTALL)


def _sh(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = os.environ | {
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "COLUMNS": "200",
    }
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def test_the_worked_example_runs_as_written(tmp_path: Path) -> None:
    shutil.copytree(ROOT / "scenarios", tmp_path / "scenarios")
    overview, run, whatif, diff, keep = _blocks("sh")

    failed = _sh(run, tmp_path)
    assert failed.returncode == 1, failed.stdout + failed.stderr
    assert "FAIL accuracy >= 0.8" in failed.stdout
    session = re.search(r"session (\S+)", failed.stdout).group(1)  # type: ignore[union-attr]

    tried = _sh(whatif.replace("SESSION", session), tmp_path)
    assert tried.returncode == 0, tried.stdout + tried.stderr
    assert re.search(r"\d+ emails changed action: \d+ escalate→reply\n", tried.stdout)
    assert "PASS accuracy >= 0.8" in tried.stdout and " 0 broken)" in tried.stdout
    new = re.search(r"recorded as (\S+):", tried.stdout).group(1)  # type: ignore[union-attr]

    diffed = _sh(diff.replace("SESSION", session).replace("WHATIF", new), tmp_path)
    assert diffed.returncode == 1, diffed.stdout + diffed.stderr
    assert "escalate→reply" in diffed.stdout and "guardian.decision" in diffed.stdout

    kept = _sh(keep, tmp_path)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    assert "PASS accuracy >= 0.8" in kept.stdout and "all expectations passed" in kept.stdout

    # The overview's commands, with the overlay that shows everything an overlay can do.
    everything = next(b for b in _blocks("yaml") if "add_agents" in b)
    (tmp_path / "changes.yaml").write_text(everything)
    first_line, second_line = overview.splitlines()
    out = _sh(first_line.replace("SESSION", session), tmp_path)
    # That team (narrower spam rules, no Learner, ...) misses the bar: exit 1, said so.
    assert out.returncode == 1, out.stdout + out.stderr
    assert "FAIL accuracy >= 0.8" in out.stdout and "ignore→escalate" in out.stdout
    other = re.search(r"recorded as (\S+):", out.stdout).group(1)  # type: ignore[union-attr]
    out = _sh(second_line.replace("SESSION", session).replace("WHATIF", other), tmp_path)
    assert out.returncode == 1 and "changed action" in out.stdout

    # The Python snippet, with the session it names.
    (snippet,) = _blocks("python")
    body = "\n".join("    " + line for line in snippet.splitlines())
    namespace: dict[str, object] = {"pantheon": pantheon}
    exec(f"async def main(session_id):\n{body}\n    return report", namespace)
    cwd = Path.cwd()
    try:
        os.chdir(tmp_path)
        report = asyncio.run(namespace["main"](session))  # type: ignore[operator]
    finally:
        os.chdir(cwd)
    assert report.decisions.headline().endswith("escalate→reply")
    assert report.decisions.b.accuracy > report.decisions.a.accuracy
