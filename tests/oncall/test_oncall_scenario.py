"""The shipped on-call scenario: it passes its expectations, reports the team's accuracy
against the ground truth, is recorded, and replays exactly. Its two timing checks are
judged on the machine's speed, so here they are only required to be there
(tests/_support/untimed.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_run import pantheon as cli
from untimed import assert_passed_but_timing, copy_untimed

import pantheon
from pantheon.sessions import SessionStore

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "oncall.yaml"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """One recorded run of the scenario, from a directory that is not the repository."""
    work = tmp_path_factory.mktemp("oncall")
    proc = cli("run", str(SCENARIO), "--json", cwd=work)
    summary = json.loads(proc.stdout)
    assert proc.returncode == (0 if summary["passed"] else 1), proc.stderr
    return work, summary


def test_the_scenario_passes_and_reports_its_accuracy(
    recorded: tuple[Path, dict[str, Any]],
) -> None:
    _, summary = recorded
    timing = assert_passed_but_timing(summary["expectations"])
    assert {e["name"] for e in summary["expectations"]} >= {
        "zero lost",
        "dead letters other than shed <= 0",
        "accuracy >= 0.93",
        "custom: oncall.checks:no_missed_pages",
        "custom: oncall.checks:few_false_pages",
    }
    assert {e["name"] for e in timing} >= {
        "timing: p99 handling decider <= 25.0 ms",
        "timing: p99 queue wait decider <= 100.0 ms",
    }
    assert (summary["inputs"], summary["malformed"]) == (795, 5)
    acc = summary["accuracy"]
    assert (acc["scored"], acc["unlabelled"]) == (798, 2)
    assert 0.9 <= acc["action_accuracy"] <= acc["decision_accuracy"] < 1.0
    assert acc["dedup_accuracy"] > 0.95
    assert acc["grouping_precision"] > 0.95 and acc["grouping_recall"] > 0.95
    assert acc["pages"]["missed"] == 0
    assert acc["pages"]["sent"] >= acc["pages"]["needed"] > 10
    # What it gets wrong is what no online triage can know at the time: the first
    # flips of a check that turns out to be flapping, a caller's alert seen before its
    # root's, noise that coincides with an outage.
    assert acc["mistakes"]["ignore -> restart_service"] >= 10
    assert set(summary["hops"]) >= {"dedup", "correlator", "decider", "guardian", "actor"}
    assert summary["hops"]["scorer"]["handled"] == 795
    # The Guardian held back failovers of the primary and everything in the freeze.
    assert summary["decisions"]["blocked"] > 0
    assert set(summary["outbox"]) == {
        "page",
        "restart_service",
        "clear_disk",
        "renew_cert",
        "scale_out",
    }


def test_the_actor_wrote_every_page_and_runbook_action_to_the_outbox(
    recorded: tuple[Path, dict[str, Any]],
) -> None:
    work, summary = recorded
    path = work / ".pantheon" / "outbox" / f"{summary['session_id']}.jsonl"
    lines = [json.loads(x) for x in path.read_text(encoding="utf-8").splitlines()]
    assert len(lines) == sum(summary["outbox"].values())
    assert not any(x["tool"] == "failover_db" for x in lines)  # always a human's call
    pages = [x for x in lines if x["tool"] == "page"]
    assert any("needs a human" in x["why"] for x in pages)
    assert any("freeze" in x["why"] for x in pages)
    assert any("already ran 2 times" in x["why"] for x in pages)
    assert all(x["result"]["incident"] == x["incident"] for x in pages)


def test_every_tool_call_is_a_recorded_effect_and_the_replay_matches(
    recorded: tuple[Path, dict[str, Any]], tmp_path: Path
) -> None:
    work, summary = recorded
    store = work / ".pantheon" / "sessions.db"
    sid = summary["session_id"]
    with SessionStore(store) as st:
        names = [e.name for e in st.effects(sid)]
    tools = sum(summary["outbox"].values())
    assert sum(1 for n in names if n.startswith("tool.")) == tools
    assert names.count("learner.observe") == 800
    # From a third place: the recorded scenario folder, not the working one, finds the team.
    proc = cli("replay", sid, "--store", str(store), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{summary['messages']} hops compared, 800 inputs" in proc.stdout
    assert f"effects served {len(names)}, called 0" in proc.stdout
    assert proc.stdout.splitlines()[-1] == "matched"


def test_the_human_summary_shows_the_accuracy_figures(tmp_path: Path) -> None:
    scenario = copy_untimed(tmp_path) / "oncall.yaml"
    proc = cli("run", str(scenario), "--no-record", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    assert "accuracy vs ground truth: action " in text
    assert "decision " in text and "dedup " in text and "over 798 labelled" in text
    assert "all expectations passed" in text


async def test_with_a_policy_that_allows_everything_the_team_fails_its_accuracy() -> None:
    text = SCENARIO.read_text(encoding="utf-8")
    start = text.index("      policy_options:")
    end = text.index("  actor:")
    lenient = text[:start] + "      policy_options: {human_only: [], freezes: []}\n" + text[end:]
    scenario = pantheon.parse_scenario(lenient, base_dir=SCENARIO.parent)
    summary = await pantheon.run(scenario, record=False)
    acc = summary.accuracy
    assert summary.decisions == {"approved": 795}
    assert summary.outbox["failover_db"] > 0
    assert acc["mistakes"]["page -> failover_db"] > 0
    assert acc["mistakes"]["page -> restart_service"] > 0  # the freeze
    assert acc["action_accuracy"] < 0.9
    assert not summary.passed


async def test_a_second_learner_before_the_scorer_keeps_the_scorers_report() -> None:
    """The built-in Learner added to the team ahead of its scorer: the summary holds both
    reports, and the team's custom checks still find the pages the scorer counted."""
    text = SCENARIO.read_text(encoding="utf-8")
    at = text.index("  scorer:")
    both = text[:at] + "  learner: {}\n" + text[at:]
    scenario = pantheon.parse_scenario(both, base_dir=SCENARIO.parent)
    summary = await pantheon.run(scenario, record=False)
    acc = summary.accuracy
    assert acc["pages"]["missed"] == 0 and acc["pages"]["needed"] > 10  # the scorer's
    assert "intent_accuracy" in acc and "thresholds" in acc  # the built-in Learner's
    custom = {e["name"]: e for e in summary.expectations if e["name"].startswith("custom:")}
    assert {e["state"] for e in custom.values()} == {"passed"}, custom


async def test_on_zeromq_the_scorer_on_a_node_and_a_learner_on_the_driver_both_report(
    tmp_path: Path,
) -> None:
    """Across processes too: the scorer runs on a node, the built-in Learner on the driver;
    the summary keeps the report of each (it kept one process's whole and dropped the
    other's), and the team's custom checks find the scorer's pages."""
    copy = copy_untimed(tmp_path) / "oncall.yaml"  # each node loads the file
    text = copy.read_text(encoding="utf-8")
    at = text.index("  scorer:")
    text = text[:at] + "  learner: {}\n" + text[at:]
    nodes = (
        "transport:\n  kind: zmq\n  broker: tcp://127.0.0.1:0\n"
        "  nodes:\n    triage: [dedup, correlator, decider]\n    act: [guardian, actor, scorer]\n"
    )
    copy.write_text(text.replace("\nagents:\n", f"\n{nodes}\nagents:\n", 1), encoding="utf-8")
    summary = await pantheon.run(pantheon.load_scenario(copy), record=False)
    acc = summary.accuracy
    assert acc["pages"]["missed"] == 0 and acc["pages"]["needed"] > 10  # the node's scorer
    assert "intent_accuracy" in acc and "thresholds" in acc  # the driver's Learner
    custom = {e["name"]: e for e in summary.expectations if e["name"].startswith("custom:")}
    assert {e["state"] for e in custom.values()} == {"passed"}, custom
