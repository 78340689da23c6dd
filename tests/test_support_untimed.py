"""tests/_support/untimed.py takes out exactly the timing bounds of a shipped scenario, and
tells a timing check from the others by the names ``judge`` gives them: if either drifted,
tests that run shipped scenarios would start passing or failing on the machine's speed."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
from untimed import (
    SCENARIOS,
    TIMING_BOUNDS,
    assert_passed_but_timing,
    copy_untimed,
    is_timing,
    load_untimed,
    untimed_text,
)

from pantheon.runner._report import RunSummary, judge
from pantheon.scenario import load_scenario, parse_scenario

SHIPPED = sorted(SCENARIOS.glob("*.yaml"))
TIMED = {"flood", "oncall", "support_email", "support_email_3node", "support_email_nats"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_only_the_timing_bounds_go(path: Path) -> None:
    shipped = load_scenario(path)
    untimed = load_untimed(path)
    assert untimed.model_dump(exclude={"expect"}) == shipped.model_dump(exclude={"expect"})
    kept = shipped.expect.model_dump(exclude=set(TIMING_BOUNDS))
    assert untimed.expect.model_dump(exclude=set(TIMING_BOUNDS)) == kept
    assert all(getattr(untimed.expect, key) is None for key in TIMING_BOUNDS)
    had_timing = any(getattr(shipped.expect, key) is not None for key in TIMING_BOUNDS)
    assert had_timing == (path.stem in TIMED)
    # Only whole lines of the expect section went; the rest reads as written.
    text = path.read_text(encoding="utf-8")
    head = text[: text.index("\nexpect:\n")]
    assert untimed_text(text).startswith(head)
    assert (untimed_text(text) == text) == (not had_timing)


def test_a_bound_written_over_several_lines_goes_whole() -> None:
    text = (
        "version: 1\nname: t\ninput: {kind: stdin, topic: a.b}\n"
        "expect:\n  zero_lost: true\n  p99_queue_wait_ms:\n    actor: 5\n    reasoner: 7\n"
        "  # a comment stays\n  max_dlq: 3\n  min_throughput: 10\nfaults: {}\n"
    )
    assert untimed_text(text) == (
        "version: 1\nname: t\ninput: {kind: stdin, topic: a.b}\n"
        "expect:\n  zero_lost: true\n  # a comment stays\n  max_dlq: 3\nfaults: {}\n"
    )


def test_the_copy_keeps_data_and_teams_beside_the_scenarios(tmp_path: Path) -> None:
    copy = copy_untimed(tmp_path)
    assert sorted(p.name for p in copy.glob("*.yaml")) == [p.name for p in SHIPPED]
    assert (copy / "oncall" / "agents.py").is_file()
    assert load_scenario(copy / "oncall.yaml").expect.p99_queue_wait_ms is None


def test_timing_checks_are_told_apart_by_the_names_judge_gives_them() -> None:
    scenario = parse_scenario(
        "version: 1\nname: t\ninput: {kind: stdin, topic: a.b}\nagents: {actor: {}}\n"
        "expect:\n  max_p99_ms: 1\n  p99_handling_ms: 1\n  p99_queue_wait_ms: 1\n"
        "  min_throughput: 1.0e9\n  zero_lost: true\n  max_dlq: 0\n  min_accuracy: 0.99\n"
        "  max_breaker_trips: 0\n  topics: {a.b: {min: 1}}\n"
    )
    summary = RunSummary(
        scenario="t", session_id=None, seed=0, elapsed_s=1.0, messages=1, throughput=1.0,
        inputs=1, malformed=0, hops={"actor": {"handled": 1, "wait_p99_ms": 9.0,
        "handle_p99_ms": 9.0}}, edges=[], dlq={}, dead_letters=[], breaker_trips=0,
        accuracy={"accuracy": 1.0}, decisions={}, outbox={}, alerts=0,
        accounting_ok=True, topics={"a.b": 1},
    )  # fmt: skip
    checks = judge(scenario, summary)
    timing = {c["name"] for c in checks if is_timing(c["name"])}
    assert timing == {
        "p99 actor <= 1.0 ms",
        "timing: p99 handling actor <= 1.0 ms",
        "timing: p99 queue wait actor <= 1.0 ms",
        "throughput >= 1000000000.0 msg/s",
    }
    assert all(not c["passed"] for c in checks if c["name"] in timing)
    assert {c["name"] for c in assert_passed_but_timing(checks)} == timing
    # A failure of any other kind is still a failure.
    worse = replace(summary, accuracy={"accuracy": 0.5})
    with pytest.raises(AssertionError, match=re.escape("accuracy >= 0.99")):
        assert_passed_but_timing(judge(scenario, worse))
