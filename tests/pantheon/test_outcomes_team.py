"""Outcomes in a third domain: an accounts-payable team written in the test's folder (see
tests/_support/ap_team.py) is scored, judged and diffed in its own terms, and a scenario's
``outcome:`` section is checked like any other."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from ap_team import AMOUNTS, FIX, ledger_code, write_team, wrongly_held
from cli_run import pantheon

from pantheon.rerun import diff_outcomes, session_outcomes
from pantheon.scenario import ScenarioError, parse_scenario
from pantheon.sessions import SessionStore
from pantheon.testing import ModelServer


@pytest.fixture
def model() -> Iterator[ModelServer]:
    with ModelServer(ledger_code) as server:
        yield server


def test_a_run_is_scored_and_judged_by_its_own_outcome(tmp_path: Path, model: ModelServer) -> None:
    scenario = write_team(tmp_path / "ap", model.base_url)
    store = tmp_path / "s.db"
    done = pantheon("run", str(scenario), "--store", str(store), "--json", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    summary = json.loads(done.stdout)
    wrong = len(wrongly_held())
    n = len(AMOUNTS)
    assert summary["accuracy"]["scored"] == n
    assert summary["accuracy"]["decision_accuracy"] == pytest.approx((n - wrong) / n)
    checks = {e["name"]: (e["passed"], e["actual"]) for e in summary["expectations"]}
    assert checks["accuracy >= 0.9"] == (False, pytest.approx((n - wrong) / n))
    assert checks["custom: ap_agents:few_holds"] == (
        False,
        f"{wrong + 2} invoices held for review (at most 2)",
    )
    assert checks["dead letters failed <= 0"] == (True, 0)

    text = pantheon("run", str(scenario), "--store", str(store), cwd=tmp_path).stdout
    assert "decision" in text and "email" not in text.lower()

    with SessionStore(store, create=False) as st:
        first = st.sessions()[-1].id
        out = session_outcomes(st, first)
    assert out.spec.noun == "invoice"
    assert {i for i, d in out.decisions.items() if d == {"decision": "hold"}} >= set(wrongly_held())
    # The two runs of one team made the same decisions: nothing to report.
    with SessionStore(store, create=False) as st:
        a, b = (s.id for s in sorted(st.sessions(), key=lambda s: s.started))
        same = diff_outcomes(st, a, b)
    assert same.changes == [] and same.headline() == "no invoice changed decision"


def test_diff_speaks_the_teams_words_for_a_changed_team(tmp_path: Path, model: ModelServer) -> None:
    scenario = write_team(tmp_path / "ap", model.base_url)
    fixed = scenario.with_name("fixed.yaml")
    fixed.write_text(
        scenario.read_text().replace(
            'class: "ap_agents:Approver"',
            'class: "ap_agents:Approver"\n    settings: {auto_limit: 5000}',
        )
    )
    store = tmp_path / "s.db"
    assert pantheon("run", str(scenario), "--store", str(store), cwd=tmp_path).returncode == 1
    assert pantheon("run", str(fixed), "--store", str(store), cwd=tmp_path).returncode == 0
    with SessionStore(store, create=False) as st:
        a, b = (s.id for s in sorted(st.sessions(), key=lambda s: s.started))
    done = pantheon("diff", a, b, "--store", str(store), "--json", cwd=tmp_path)
    decisions = json.loads(done.stdout)["decisions"]
    moved = wrongly_held()
    assert (
        decisions["headline"]
        == f"{len(moved)} invoices changed decision: {len(moved)} hold→approve"
    )
    assert decisions["groups"] == [{"before": "hold", "after": "approve", "items": moved}]
    assert decisions["fixed"] == moved and decisions["broken"] == []
    assert (decisions["accuracy_a"], decisions["accuracy_b"]) == (
        pytest.approx(1 - len(moved) / len(AMOUNTS)),
        1.0,
    )
    text = pantheon("diff", a, b, "--store", str(store), cwd=tmp_path).stdout
    assert f"{len(moved)} invoices changed decision" in text
    assert "email" not in text.lower()
    assert FIX  # the same change as an overlay: tests/pantheon/test_record_any_team.py


HEAD = """\
version: 1
name: t
input: {kind: jsonl, path: x.jsonl, topic: a.b, key: id, label: expected}
"""


def problems(text: str) -> list[tuple[int, str, str]]:
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, source="t.yaml", check_files=False)
    return [(p.line, p.field, p.message) for p in err.value.problems]


def test_outcome_and_per_field_bounds_are_checked_where_they_are_written() -> None:
    assert problems(HEAD + "outcome: {topics: [a.c], label: truth}\n") == [
        (4, "outcome.label", "names label field 'truth', but the input's label is 'expected'")
    ]
    assert problems(
        HEAD + "outcome: {topics: [a.c], fields: [action]}\nexpect:\n  min_accuracy: {acton: 0.5}\n"
    ) == [
        (
            6,
            "expect.min_accuracy.acton",
            "'acton' is not a decision field of the outcome (outcome.fields: action)"
            " (did you mean 'action'?)",
        )
    ]
    assert problems(HEAD + "expect:\n  min_accuracy: {action: 0.5}\n")[0][1:] == (
        "expect.min_accuracy",
        "a bound per field needs outcome.fields to say which fields are decisions",
    )
    assert problems(HEAD + "outcome: {topics: []}\n")[0][1] == "outcome.topics"


def test_an_input_path_the_system_cannot_use_is_a_located_error() -> None:
    text = HEAD.replace("path: x.jsonl", "path: " + "x" * 5000)
    with pytest.raises(ScenarioError) as err:
        parse_scenario(text, source="t.yaml", base_dir=Path("/tmp"))
    (problem,) = err.value.problems
    assert problem.field == "input.path"
    assert problem.message == "input path cannot be used: File name too long"


def test_per_field_bounds_judge_each_field() -> None:
    from pantheon.runner._report import accuracy_bounds

    scenario = parse_scenario(
        HEAD
        + "outcome: {topics: [a.c], fields: [action, queue]}\n"
        + "expect:\n  min_accuracy: 0.8\n",
        check_files=False,
    )
    assert accuracy_bounds(scenario) == [
        ("action accuracy >= 0.8", "action_accuracy", 0.8),
        ("queue accuracy >= 0.8", "queue_accuracy", 0.8),
    ]
    one = parse_scenario(
        HEAD + "outcome: {topics: [a.c], fields: [action]}\nexpect: {min_accuracy: 0.7}\n",
        check_files=False,
    )
    assert accuracy_bounds(one) == [("accuracy >= 0.7", "action_accuracy", 0.7)]
    default = parse_scenario(HEAD + "expect: {min_accuracy: 0.7}\n", check_files=False)
    assert accuracy_bounds(default) == [("accuracy >= 0.7", "accuracy", 0.7)]
