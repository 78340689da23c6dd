"""The support desk whose every ticket fails and whose Actor's breaker opens at the first
failure: a small run with dead letters, a ``system.breaker.actor`` message and the alert it
causes, for tests of what a session's readers count and show."""

from __future__ import annotations

import json
from pathlib import Path

from cli_run import pantheon

__all__ = ["ACTOR_BREAKER", "TICKETS_FAIL", "run_json", "tripping"]

#: Every ticket the Actor opens fails: its dead letters are the Actor's node's.
TICKETS_FAIL = "\nfaults:\n  agents:\n    actor: {failure_rate: 1.0, tool: ticket}\n"
#: The Actor's breaker line in the reference scenario (the bus's defaults).
ACTOR_BREAKER = (
    "    # breaker: the bus defaults (5 failures in a row, or half of the last 20 calls, "
    ">= 10 calls)\n"
)


def tripping(scenarios: Path, name: str, count: int = 20) -> str:
    """Write ``scenarios/<name>.yaml``: the first ``count`` emails of the support desk in
    ``scenarios`` (an untimed copy), every ticket failing, the Actor's breaker opening at
    the first failure. Returns its path relative to the copy's parent."""
    text = (scenarios / "support_email.yaml").read_text(encoding="utf-8")
    assert "  rate: 1000 " in text and ACTOR_BREAKER in text
    text = text.replace("  rate: 1000 ", f"  count: {count}\n  rate: 1000 ")
    text = text.replace(ACTOR_BREAKER, "    breaker: {consecutive_failures: 1}\n") + TICKETS_FAIL
    (scenarios / f"{name}.yaml").write_text(text, encoding="utf-8")
    return f"{scenarios.name}/{name}.yaml"


def run_json(workdir: Path, scenario: str, store: str = "s.db") -> dict[str, object]:
    """``pantheon run SCENARIO --json --store STORE`` in ``workdir``: its summary."""
    out = pantheon("run", scenario, "--json", "--store", store, cwd=workdir, timeout=300)
    assert out.stdout, out.stderr
    summary: dict[str, object] = json.loads(out.stdout)
    return summary
