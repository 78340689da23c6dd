"""What-if replay of the support team: the recorded inputs through a changed team, and
``pantheon diff`` naming the decisions that moved."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

import pantheon
from pantheon.cli._cmd_sessions import register
from pantheon.rerun._overlay import apply_overlay
from pantheon.scenario import ScenarioError
from pantheon.sessions import SessionStore

ROOT = Path(__file__).resolve().parents[2]
SCENARIO = ROOT / "scenarios" / "support_email.yaml"


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """One run of the support team (600 emails), recorded once for the module."""
    store = tmp_path_factory.mktemp("whatif") / "sessions.db"
    summary = asyncio.run(pantheon.run(SCENARIO, store=store))
    # Its timing bounds depend on how busy the machine is; what the tests read does not.
    assert summary.accuracy["scored"] == 598 and summary.dead_letters == []
    return store, summary.session_id


@pytest.fixture
def cli() -> typer.Typer:
    app = typer.Typer()
    register(app)
    return app


def _final_action(plan: dict[str, Any], refund_limit: float, min_confidence: float) -> str:
    """The support desk's Guardian rule as the scenario states it, applied by hand: spam is
    ignored, a low confidence or a refund over the limit goes to a human."""
    if plan["action"] == "ignore":
        return "ignore"
    if plan["confidence"] < min_confidence:
        return "escalate"
    if plan["intent"] == "refund" and plan["amount"] is not None and plan["amount"] > refund_limit:
        return "escalate"
    return str(plan["action"])


def _moved_by_limit(store: Path, session: str, old: float, new: float) -> set[str]:
    """The emails whose decision a refund limit of ``new`` instead of ``old`` changes,
    from the recorded proposals (the Reasoner's intent, confidence and the amount) and the
    rule, independently of the what-if machinery."""
    policy = yaml.safe_load(SCENARIO.read_text())["policy"]
    assert policy["refund_limit"] == old
    with SessionStore(store) as st:
        plans = [e.payload for e in st.envelopes(session) if e.topic == "plan.proposed"]
    assert len(plans) == 591  # 600 emails less the 9 malformed records
    return {
        p["email_id"]
        for p in plans
        if _final_action(p, old, policy["min_confidence"])
        != _final_action(p, new, policy["min_confidence"])
    }


def _refunds_over(store: Path, session: str, limit: float) -> set[str]:
    """Refunds the Guardian escalates for their amount (trusted, over ``limit``)."""
    policy = yaml.safe_load(SCENARIO.read_text())["policy"]
    with SessionStore(store) as st:
        plans = [e.payload for e in st.envelopes(session) if e.topic == "plan.proposed"]
    return {
        p["email_id"]
        for p in plans
        if p["intent"] == "refund"
        and p["action"] not in ("ignore", "escalate")
        and p["confidence"] >= policy["min_confidence"]
        and p["amount"] is not None
        and p["amount"] > limit
    }


def test_a_higher_refund_limit_moves_exactly_the_refunds_between_the_limits(
    recorded: tuple[Path, str], cli: typer.Typer
) -> None:
    store, original = recorded
    expected = _moved_by_limit(store, original, 200.0, 500.0)
    assert 5 <= len(expected) <= 40  # the data has refunds in (200, 500]: the test has teeth

    report = asyncio.run(
        pantheon.replay(original, store=store, with_="policy:\n  refund_limit: 500\n")
    )
    diff = report.decisions
    assert {c.item for c in diff.changes} == expected
    assert [(b, a, set(items)) for b, a, items in diff.groups] == [("escalate", "reply", expected)]
    assert (
        diff.headline() == f"{len(expected)} emails changed action: {len(expected)} escalate→reply"
    )
    assert report.effects_called > 0
    with SessionStore(store) as st:
        original_info, new_info = st.session(original), st.session(report.new_session_id)
        payloads = {e.id: e.payload for e in st.envelopes(report.new_session_id)}
        live = [e for e in st.effects(report.new_session_id) if e.ended_ns > e.started_ns]
        assert len([e for e in st.effects(original) if e.envelope_id]) == (
            report.effects_served + report.effects_called
        )
    # The calls that ran live were made for the emails whose decision message changed:
    # the moved ones (a reply instead of an escalation), and the refunds over 500, still
    # escalated but with a reason that now names the new limit. The Learner scored the
    # moved outcomes outside its effect; what it made of them (no threshold moved, as in
    # the original) is the recorded answer, served.
    by_call: dict[str, set[str]] = {}
    for e in live:
        by_call.setdefault(e.name, set()).add(payloads[e.envelope_id]["email_id"])
    assert by_call == {
        "tool.reply": expected,
        "tool.escalate": _refunds_over(store, original, 500.0),
    }
    assert len(live) == report.effects_called
    # Accuracy before is what the run itself measured (the Learner's), from the record.
    assert diff.a.accuracy == original_info.summary["accuracy"]["action_accuracy"]
    assert diff.b.accuracy is not None and diff.b.accuracy < diff.a.accuracy
    assert new_info.kind == "whatif" and new_info.forked_from == original
    assert new_info.replay_of is None
    assert new_info.summary["whatif"]["overlay"] == "policy:\n  refund_limit: 500\n"
    assert yaml.safe_load(new_info.scenario_text or "")["policy"]["refund_limit"] == 500

    runner = CliRunner()
    out = runner.invoke(cli, ["diff", original, report.new_session_id, "--store", str(store)])
    assert out.exit_code == 1, out.output  # the runs diverge: that is the point
    assert diff.headline() in out.output
    for email_id in expected:
        assert email_id in out.output
    assert f"accuracy {diff.a.accuracy:.3f} -> {diff.b.accuracy:.3f}" in out.output
    out = runner.invoke(
        cli, ["diff", original, report.new_session_id, "--store", str(store), "--json"]
    )
    decisions = json.loads(out.output)["decisions"]
    assert {c["item"] for c in decisions["changes"]} == expected
    assert all(c["before"] == "escalate" and c["after"] == "reply" for c in decisions["changes"])

    listing = json.loads(
        runner.invoke(cli, ["sessions", "list", "--store", str(store), "--json"]).output
    )
    row = next(r for r in listing if r["id"] == report.new_session_id)
    assert row["kind"] == "whatif" and row["forked_from"] == original
    shown = runner.invoke(cli, ["sessions", "show", report.new_session_id, "--store", str(store)])
    assert f"what-if of {original}" in shown.output

    # The what-if session is a session like any other: it replays exactly.
    again = asyncio.run(pantheon.replay(report.new_session_id, store=store))
    assert again.matched and again.effects_called == 0


@pytest.mark.parametrize("overlay", ["{}\n", "policy:\n  refund_limit: 200.0\n"])
def test_an_overlay_that_changes_nothing_makes_no_live_call(
    recorded: tuple[Path, str], overlay: str
) -> None:
    store, original = recorded
    report = asyncio.run(pantheon.replay(original, store=store, with_=overlay))
    assert report.effects_called == 0
    assert report.decisions.changes == []
    assert report.decisions.headline() == "no email changed action"
    assert report.decisions.a.accuracy == report.decisions.b.accuracy
    assert len(report.decisions.b.decisions) == 598  # 591 outcomes and 7 labelled rejects


def test_a_rules_change_calls_the_model_live_and_serves_the_rest(
    recorded: tuple[Path, str],
) -> None:
    """A changed provider makes every model call run live; the Reasoner's Memory lookups
    before it are still the recorded calls, and are served."""
    store, original = recorded
    # Spam is now only what says "unsubscribe".
    rules = "provider:\n  rules:\n    spam: ['(?i)\\bunsubscribe\\b']\n"
    report = asyncio.run(pantheon.replay(original, store=store, with_=rules))
    with SessionStore(store) as st:
        effects = st.effects(report.new_session_id)
    # A served effect is recorded as taking no time (it ran nothing); a live one took some.
    served = {e.name for e in effects if e.started_ns == e.ended_ns}
    live = {e.name for e in effects if e.ended_ns > e.started_ns}
    calls = [e for e in effects if e.name == "model.rules.chat"]
    lookups = [e for e in effects if e.name == "memory.lookup"]
    assert len(calls) == len(lookups) == 591
    assert all(e.ended_ns > e.started_ns for e in calls)
    assert all(e.started_ns == e.ended_ns for e in lookups)
    assert "model.rules.chat" in live and "model.rules.chat" not in served
    assert report.effects_called >= 591
    # Spam the narrower rule misses is no longer ignored, and that is wrong by the labels.
    groups = {(b, a): items for b, a, items in report.decisions.groups}
    assert ("ignore", "escalate") in groups
    assert set(groups[("ignore", "escalate")]) <= set(report.decisions.broken)


def test_an_invalid_overlay_fails_before_anything_runs_naming_file_and_line(
    recorded: tuple[Path, str], cli: typer.Typer, tmp_path: Path
) -> None:
    store, original = recorded
    runner = CliRunner()
    with SessionStore(store) as st:
        before = len(st.sessions())
    bad = tmp_path / "changes.yaml"
    bad.write_text("policy:\n  refund_limit: 500\nagents:\n  guardain:\n    settings: {}\n")
    out = runner.invoke(cli, ["replay", original, "--with", str(bad), "--store", str(store)])
    assert out.exit_code == 2
    assert (
        f"{bad}:4:3: agents.guardain: no agent 'guardain' in the recorded team "
        "(did you mean 'guardian'?)" in out.output
    )
    bad.write_text("policy:\n  refund_limit: lots\n")
    out = runner.invoke(cli, ["replay", original, "--with", str(bad), "--store", str(store)])
    assert out.exit_code == 2
    assert f"{bad}:2:3: policy.refund_limit: Input should be a valid number" in out.output
    with SessionStore(store) as st:
        assert len(st.sessions()) == before


def test_overlay_merge_rules() -> None:
    recorded = SCENARIO.read_text()
    # Mappings merge key by key; a list replaces the recorded one whole.
    merged = apply_overlay(
        recorded,
        "provider:\n  rules:\n    spam: ['(?i)\\bunsubscribe\\b']\n"
        "agents:\n  learner:\n    enabled: false\n"
        "add_agents:\n  audit:\n    class: 'agents:Memory'\n",
    ).scenario
    spam = merged.provider.rules["spam"]  # type: ignore[union-attr]
    assert [p.pattern for p in spam] == ["(?i)\\bunsubscribe\\b"]
    assert len(merged.provider.rules["outage"]) == 5  # type: ignore[union-attr]
    assert not merged.agents["learner"].enabled
    assert merged.agents["actor"].concurrency == 2
    assert "audit" in merged.agents

    def problems(text: str) -> list[str]:
        with pytest.raises(ScenarioError) as caught:
            apply_overlay(recorded, text, source="o.yaml")
        return [str(p) for p in caught.value.problems]

    assert problems("add_agents:\n  actor: {}\n") == [
        "o.yaml:2:3: add_agents.actor: the recorded team already has an agent 'actor'; "
        "change it under agents"
    ]
    assert problems("input:\n  rate: 5\n")[0].startswith(
        "o.yaml:1:1: input: cannot change in a what-if replay"
    )
    assert problems("add_agents:\n  audit:\n    class: 'agents:Memory'\n    concurency: 2\n") == [
        "o.yaml:4:5: agents.audit.concurency: unknown key 'concurency' (did you mean "
        "'concurrency'?); expected one of " + problems_tail()
    ]
    assert problems("") == ["o.yaml:1:1: the overlay is empty (write {} to replay with no change)"]
    assert problems("- policy\n") == [
        "o.yaml:1:1: an overlay is a mapping of scenario keys, not a list"
    ]


def problems_tail() -> str:
    """The key list the scenario loader names for an agent's unknown key."""
    try:
        apply_overlay(SCENARIO.read_text(), "agents:\n  actor:\n    concurency: 2\n")
    except ScenarioError as exc:
        return str(exc).split("expected one of ", 1)[1]
    raise AssertionError("no error")


def test_a_store_made_before_forked_from_gets_the_column_in_place(tmp_path: Path) -> None:
    """An older store (no ``forked_from`` column) opens, keeps its sessions, and records a
    what-if's link from then on; an older Pantheon names its columns and never sees it."""
    path = tmp_path / "sessions.db"
    with SessionStore(path) as st:
        old = st.begin_session(scenario="old", kind="run")
        st.end_session(old, "completed")
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE sessions DROP COLUMN forked_from")
    conn.commit()
    conn.close()
    with SessionStore(path, create=False) as st:
        assert st.session(old).forked_from is None
        new = st.begin_session(scenario="old", kind="whatif", forked_from=old)
        st.end_session(new, "completed")
    with SessionStore(path, create=False) as st:
        assert st.session(new).forked_from == old and st.session(new).kind == "whatif"
    conn = sqlite3.connect(path)
    columns = [row[1] for row in conn.execute("PRAGMA table_info(sessions)")]
    conn.close()
    assert columns[-1] == "forked_from"


def test_an_overlay_is_held_to_the_scenario_loader_s_alias_and_depth_limits() -> None:
    """Aliases of aliases ("billion laughs") and nesting past the loader's depth are the
    loader's own one-line problems in an overlay too; before, they escaped as _TooLarge."""
    laughs = "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    for name, prev in zip("bcdefgh", "abcdefg", strict=True):
        laughs += f"{name}: &{name} [*{prev}, *{prev}, *{prev}, *{prev}, *{prev}, *{prev}]\n"
    laughs += "policy: {refund_limit: *h}\n"
    with pytest.raises(ScenarioError) as caught:
        apply_overlay(SCENARIO.read_text(), laughs, source="o.yaml")
    assert [str(p) for p in caught.value.problems] == [
        "o.yaml:1:1: the overlay expands to over 50000 keys (aliases of aliases?)"
    ]
    deep = "policy:\n  x: " + "[" * 200 + "]" * 200 + "\n"
    with pytest.raises(ScenarioError) as caught:
        apply_overlay(SCENARIO.read_text(), deep, source="o.yaml")
    (problem,) = [str(p) for p in caught.value.problems]
    assert problem.startswith("o.yaml:2:") and "nested deeper than" in problem
