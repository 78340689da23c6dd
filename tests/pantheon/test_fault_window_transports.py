"""A ``messages`` fault window is a span of the scenario's input order, whatever the
transport: a small ``flaky_actor`` (120 inputs, the Actor failing half its calls for the
first 60 emails, two attempts each) run in one process, on ZeroMQ with the Actor on a node
process, and on NATS JetStream with the Actor on a node process dead-letters the very same
emails, all of them inside the window.

Before, each process counted the inputs it saw published itself: a node never sees the
Observer's publishes, so there every message stood at input 0, inside the window for ever,
and which emails failed depended on the transport."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from cli_run import pantheon
from support import email_problem

from bus.backends.nats import NatsServer
from pantheon.sessions import SessionStore
from pantheon.testing import read_jsonl

ROOT = Path(__file__).resolve().parents[2]
FLAKY = ROOT / "scenarios" / "flaky_actor.yaml"
INPUTS = 120
WINDOW = 60  # emails

INPROCESS = "transport:\n  kind: inprocess\n"
ZMQ = "transport:\n  kind: zmq\n  broker: tcp://127.0.0.1:0\n  nodes:\n    action: [actor]\n"
NATS = "transport:\n  kind: nats\n  url: {url}\n  nodes:\n    action: [actor]\n"


def _variant(tmp_path: Path, name: str, transport: str) -> Path:
    """flaky_actor.yaml, smaller and sharper: fewer inputs, a shorter window, a higher
    failure rate, two attempts, and no breaker (whether it trips depends on how calls
    happen to interleave, which is not what this test is about)."""
    text = FLAKY.read_text(encoding="utf-8")
    breaker = text[text.index("    # Tuned above the noise floor") : text.index("  learner:")]
    edits = {
        INPROCESS: transport,
        # Written elsewhere: the support team's package (scenarios/support/) by its path.
        "name: flaky_actor": f"name: flaky_{name}\npath: [{FLAKY.parent}]",
        "path: data/": f"path: {FLAKY.parent}/data/",
        "  rate: 0 ": f"  count: {INPUTS}\n  rate: 0 ",
        "retry: {attempts: 3, backoff: 0.01}": "retry: {attempts: 2, backoff: 0.001}",
        breaker: "    breaker: null\n",
        "actor: {failure_rate: 0.3, latency_ms: 0.0, until: {messages: 400}}": (
            f"actor: {{failure_rate: 0.5, until: {{messages: {WINDOW}}}}}"
        ),
    }
    for old, new in edits.items():
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    path = tmp_path / f"{name}.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def _dead_lettered(tmp_path: Path, scenario: Path) -> list[str]:
    """The email ids the run dead-lettered, in the order they were listed."""
    proc = pantheon("run", str(scenario), "--json", "--store", "s.db", cwd=tmp_path)
    summary: dict[str, Any] = json.loads(proc.stdout)
    assert summary["inputs"] + summary["malformed"] == INPUTS, proc.stderr
    assert summary["accounting_ok"] is True, proc.stderr
    with SessionStore(tmp_path / "s.db", create=False) as st:
        by_id = {e.id: e for e in st.envelopes(summary["session_id"])}
    letters = summary["dead_letters"]
    assert sum(summary["dlq"].values()) == len(letters) < 100  # every one listed
    assert {d["subscriber"] for d in letters} <= {"actor"}
    assert {d["reason"] for d in letters} <= {"failed"}, letters
    # The Actor's messages come from the Guardian, on the driver: recorded there.
    return [by_id[d["envelope_id"]].payload["email_id"] for d in letters]


@pytest.fixture(scope="module")
def emails() -> list[str]:
    """The input's email ids in input order (its malformed records left out)."""
    lines = list(read_jsonl(FLAKY.parent / "data" / "support_emails.jsonl"))[:INPUTS]
    return [r["id"] for _, r, _ in lines if r is not None and email_problem(r) is None]


def test_every_transport_dead_letters_the_same_emails_inside_the_window(
    tmp_path: Path, emails: list[str]
) -> None:
    alone = _dead_lettered(tmp_path, _variant(tmp_path, "inprocess", INPROCESS))
    inside = set(emails[:WINDOW])
    assert alone, "half the calls fail for 60 emails: some fail twice"
    assert set(alone) <= inside, set(alone) - inside
    assert len(set(alone)) == len(alone)

    on_zmq = _dead_lettered(tmp_path, _variant(tmp_path, "zmq", ZMQ))
    with NatsServer() as server:
        on_nats = _dead_lettered(tmp_path, _variant(tmp_path, "nats", NATS.format(url=server.url)))

    assert sorted(on_zmq) == sorted(alone)
    assert sorted(on_nats) == sorted(alone)
