"""What-if replay of the on-call team judges its custom checks on a run's summary.

The team's checks (``oncall.checks``) read what its Scorer, a Learner, reports (``pages``),
and a run's summary counts the Actor's outbox. A what-if serves the recorded
``learner.observe`` and tool calls, which run nothing: the summary must still hold what a
plain ``pantheon run`` of the changed team reports, or a what-if that changes nothing fails
the checks the original passed (it did: ``raised ValueError: the run reported no pages``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_run import pantheon as cli
from untimed import copy_untimed

from pantheon.rerun import apply_overlay
from pantheon.sessions import SessionStore

#: The on-call team's own checks, which read the Scorer's pages.
CUSTOM = ("custom: oncall.checks:no_missed_pages", "custom: oncall.checks:few_false_pages")

#: Dedup's window at the value it already has: the team does not change.
UNCHANGED = "agents:\n  dedup:\n    settings:\n      window_s: 300\n"

#: Overlays that move decisions: a host's second restart within the hour is paged; every
#: restart needs a person (whom the Guardian pages instead).
CHANGES = {
    "decider_repeats_1": "agents:\n  decider:\n    settings:\n      max_repeats: 1\n",
    "guardian_holds_restarts": (
        "agents:\n  guardian:\n    settings:\n      policy_options:\n        human_only:\n"
        "          - {action: failover_db, role: primary}\n"
        "          - {action: restart_service}\n"
    ),
}


def _checks(expectations: list[dict[str, Any]]) -> list[tuple[str, str, Any]]:
    return [(e["name"], e["state"], e["actual"]) for e in expectations]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, dict[str, Any]]:
    """200 alerts through the on-call team (untimed), recorded: the work folder, the
    scenario and the run's summary."""
    work = tmp_path_factory.mktemp("oncall_whatif")
    scenario = copy_untimed(work) / "oncall.yaml"
    text = scenario.read_text(encoding="utf-8")
    assert "  rate: 2000 " in text
    scenario.write_text(text.replace("  rate: 2000 ", "  count: 200\n  rate: 5000 "))
    proc = cli("run", str(scenario), "--store", "s.db", "--json", cwd=work)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["inputs"] + summary["malformed"] == 200
    passed = [name for name, state, _ in _checks(summary["expectations"]) if state == "passed"]
    assert set(CUSTOM) <= set(passed)
    return work, scenario, summary


def _whatif(work: Path, session: str, overlay: str, name: str) -> tuple[int, dict[str, Any]]:
    """``pantheon replay SESSION --with`` the overlay: its exit code and its JSON report,
    with the new session's stored summary under ``summary``."""
    path = work / f"{name}.yaml"
    path.write_text(overlay, encoding="utf-8")
    proc = cli("replay", session, "--store", "s.db", "--with", str(path), "--json", cwd=work)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    report = json.loads(proc.stdout)
    with SessionStore(work / "s.db") as st:
        report["summary"] = st.session(report["new_session_id"]).summary
    return proc.returncode, report


def test_an_unchanged_overlay_passes_exactly_the_checks_the_run_passed(
    recorded: tuple[Path, Path, dict[str, Any]],
) -> None:
    work, _, run = recorded
    code, report = _whatif(work, run["session_id"], UNCHANGED, "same")
    assert report["effects_called"] == 0 and report["decisions"]["changed"] == 0
    assert code == 0 and report["passed"] is True
    # Every check, its state and what it found, as the run judged them: the pages the
    # Scorer counted although every `learner.observe` was served.
    assert _checks(report["expectations"]) == _checks(run["expectations"])
    summary = report["summary"]
    assert summary["accuracy"]["pages"] == run["accuracy"]["pages"]
    assert summary["accuracy"]["executed"] == run["accuracy"]["executed"]
    assert summary["outbox"] == run["outbox"] and sum(run["outbox"].values()) > 0


@pytest.mark.parametrize("name", sorted(CHANGES))
def test_a_change_is_judged_as_a_run_of_the_changed_team_is(
    recorded: tuple[Path, Path, dict[str, Any]], name: str
) -> None:
    """The what-if's checks find what a plain run of the changed scenario finds: the team
    is deterministic given its inputs, so the two summaries must agree."""
    work, scenario, run = recorded
    code, report = _whatif(work, run["session_id"], CHANGES[name], name)
    assert report["decisions"]["changed"] > 0 and report["effects_called"] > 0

    changed = work / "scenarios" / f"{name}_merged.yaml"
    merged = apply_overlay(scenario.read_text(), CHANGES[name], base_dir=scenario.parent)
    changed.write_text(merged.merged_text, encoding="utf-8")
    proc = cli("run", str(changed), "--no-record", "--json", cwd=work)
    plain = json.loads(proc.stdout)
    assert proc.returncode == (0 if plain["passed"] else 1), proc.stderr

    assert _checks(report["expectations"]) == _checks(plain["expectations"])
    assert code == (0 if plain["passed"] else 1)
    found = {n: actual for n, _, actual in _checks(report["expectations"]) if n in CUSTOM}
    assert found[CUSTOM[1]] == (
        f"{plain['accuracy']['pages']['false']} of {plain['accuracy']['pages']['sent']} "
        "pages were for alerts that needed nobody"
    )
    # Both changes page for alerts that needed nobody: the check fails on a real count.
    assert plain["accuracy"]["pages"]["false"] > 0
    assert report["summary"]["accuracy"]["pages"] == plain["accuracy"]["pages"]
    assert report["summary"]["outbox"] == plain["outbox"]
