"""The run's summary at 80 columns: lines wrap at words with their continuation indented
(the terminal would fold them mid-word), every agent's full name is in the latency table,
and no number is cut; piped with no terminal nothing wraps at all."""

from __future__ import annotations

import re

import pytest

from pantheon.cli._summary_text import print_summary as _print_summary
from pantheon.runner._report import RunSummary

HOP = {
    "handled": 591,
    **{f"{k}_{q}_ms": 12.345 for k in ("wait", "handle") for q in ("p50", "p95", "p99")},
}
HOPS = {
    name: HOP
    for name in (
        "sensor",
        "reasoner:learner.threshold.updated",
        "learner:observation.email.malformed",
    )
}


def _summary() -> RunSummary:
    return RunSummary(
        scenario="support_email", session_id="20261127-220000-abcd", seed=7, elapsed_s=0.6,
        messages=4380, throughput=7093.0, inputs=591, malformed=9, hops=HOPS, edges=[],
        dlq={"failed": 10}, dead_letters=[
            {"subscriber": "actor", "reason": "failed",
             "error": "actor: injected failure on guardian.decision/e0381 (rate 0.3)"}
        ] * 10, breaker_trips=0,
        accuracy={"scored": 598, "unlabelled": 2, "action_accuracy": 0.816,
                  "intent_accuracy": 0.844},
        decisions={"approved": 500, "escalated": 89, "modified": 2},
        outbox={"reply": 390, "ticket": 179, "escalate": 126}, alerts=0, accounting_ok=True,
        malformed_topic="observation.email.malformed",
    )  # fmt: skip


def _printed(capsys: pytest.CaptureFixture[str]) -> list[str]:
    _print_summary(_summary())
    return capsys.readouterr().out.splitlines()


def test_at_80_columns_lines_wrap_at_words_and_names_stay_whole(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    lines = _printed(capsys)
    assert max(len(line) for line in lines) <= 80
    assert "…" not in "\n".join(lines)
    # A long line goes on below its start, indented, broken between words.
    start = lines.index(
        "inputs 600: 591 published, 9 malformed (on observation.email.malformed, not"
    )
    assert lines[start + 1] == "  dead letters)"
    assert "guardian approved 500, escalated 89, modified 2  outbox reply 390, ticket 179," in lines
    assert "  escalate 126" in lines
    example = lines.index("  10 x actor (failed), e.g. actor: injected failure on")
    assert lines[example + 1] == "    guardian.decision/e0381 (rate 0.3)"  # under its start
    # The table: without its p95 columns, each name whole (folded, never cut).
    table = [line for line in lines if line[:1] in "┃│"]
    header = [cell.strip() for cell in table[0].strip("┃").split("┃")]
    assert header == ["agent", "handled", "wait p50", "p99", "handle p50", "p99"]
    names = "".join(line.split("│")[1].strip() for line in table[1:])
    for name in HOPS:
        assert name in names
    assert all(
        re.fullmatch(r"\s*(12\.345|591|)\s*", c)
        for line in table[1:]
        for c in line.split("│")[2:-1]
    )


def test_piped_without_a_terminal_nothing_wraps(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    monkeypatch.setattr("pantheon.cli._console.terminal_width", lambda: None)
    lines = _printed(capsys)
    assert (
        "inputs 600: 591 published, 9 malformed (on observation.email.malformed, not dead letters)"
        in lines
    )
    outcomes = "guardian approved 500, escalated 89, modified 2  outbox reply 390, ticket 179,"
    assert f"{outcomes} escalate 126" in lines
    header = [
        cell.strip()
        for cell in next(line for line in lines if line.startswith("┃")).strip("┃").split("┃")
    ]
    assert header == ["agent", "handled", "wait p50", "p95", "p99", "handle p50", "p95", "p99"]
    assert any("│ learner:observation.email.malformed │" in line for line in lines)
