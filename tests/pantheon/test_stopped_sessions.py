"""``pantheon sessions show`` of a run that stopped before the end of its input: its
expectations are not judged, whatever checks its summary holds of the part that ran. On
real claims runs, one stopped by Ctrl-C and one killed."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from cli_run import pantheon
from stopped_runs import crashed_run, interrupted_run

from pantheon.cli._summary_text import verdict_line


@pytest.fixture(scope="module")
def interrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, dict[str, Any]]:
    return interrupted_run(tmp_path_factory.mktemp("interrupted"))


def test_an_interrupted_session_says_its_expectations_were_not_judged(
    interrupted: tuple[Path, str, dict[str, Any]],
) -> None:
    """A Ctrl-C'd run judged the part that ran (all four checks passed there), and its
    summary says ``passed``; ``sessions show`` used to head it "4 passed, 0 failed" as if
    the run had passed. It says they were not judged, and of what part the four speak."""
    store, sid, summary = interrupted
    assert summary["passed"] is True
    inputs = summary["inputs"] + summary["malformed"]
    assert 3 <= inputs < 42
    shown = pantheon("sessions", "show", sid, "--store", str(store), cwd=store.parent)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0].split() == [sid, "run", "aborted"]
    heading = [line for line in lines if line.startswith("summary ")]
    assert heading == [
        f"summary   expectations: not judged, interrupted by SIGINT after {inputs} inputs; "
        "on the part that ran: 4 passed, 0 failed"
    ]


def test_a_killed_session_says_its_expectations_were_not_judged(tmp_path: Path) -> None:
    """A run whose process died judged nothing: it said "0 passed, 0 failed"."""
    store, sid = crashed_run(tmp_path)
    shown = pantheon("sessions", "show", sid, "--store", str(store), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    heading = [line for line in shown.stdout.splitlines() if line.startswith("summary ")]
    assert heading == ["summary   expectations: not judged, its process died before the run ended"]


@pytest.mark.parametrize(
    ("passed", "said"),
    [(True, "all expectations passed"), (False, "[red]expectations failed[/red]")],
)
def test_the_interrupted_run_s_last_line_says_they_were_not_judged(passed: bool, said: str) -> None:
    """``pantheon run``'s verdict line of a Ctrl-C'd run said "all expectations passed",
    and only the line after it that the input had been stopped."""
    check = {"name": "zero lost", "passed": passed, "state": "passed" if passed else "failed"}
    run = SimpleNamespace(expectations=[check], passed=passed, interrupted="SIGINT")
    assert verdict_line(run) == (
        f"[yellow]not judged[/yellow] (its input was stopped): on the part that ran, {said}"
    )
    assert verdict_line(SimpleNamespace(expectations=[check], passed=passed, interrupted=None)) == (
        "[green]all expectations passed[/green]" if passed else "[red]expectations failed[/red]"
    )
