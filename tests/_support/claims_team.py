"""An expense-claims team written into a test's folder, as a QA tester built it: an Intake,
an Approver that asks a person above a limit (a scripted one, a fifth of a second later), a
payer whose bank tool fails three times in ten (``faults.agents.payer``), and the built-in
Monitor. Its input is 40 claims, one record ``validate`` refuses and one line that is not
JSON, published on ``claim.rejected_input``.

The same team runs in one process or over ZeroMQ or NATS (:func:`placed`), where the
Approver has a node of its own (``desk``) and the payer another (``bank``), so a test can
kill either mid-run. Its custom check reads ``summary.topics`` and ``summary.inputs``, as a
team's own check would; failing, it says ``actual N decided of M``."""

from __future__ import annotations

import json
import os
import textwrap
from pathlib import Path
from typing import Any

from cli_run import pantheon

__all__ = ["CLAIMS", "PLACEMENT", "placed", "run_killed", "write_team"]

#: Claims in the input: even ones under the Approver's limit (1,000), odd ones over it.
CLAIMS = 40

AGENTS = '''
"""An expense-claims team: intake, approval (a person above the limit), payment."""

from __future__ import annotations

from agents import Agent, AgentSettings


def problem(record):
    """Why the input refuses a record (none for a claim with an amount)."""
    if not isinstance(record.get("amount"), (int, float)):
        return "no amount"
    return None


class Intake(Agent):
    async def handle(self, env):
        await self.emit("claim.checked", dict(env.payload))


class Approver(Agent):
    class Settings(AgentSettings):
        limit: float = 1_000.0

    async def handle(self, env):
        claim = env.payload
        decision = "approve"
        if claim["amount"] > self.settings.limit:
            summary = f"pay {claim['amount']:.2f} EUR ({claim['id']})"
            answer = await self.approve({"summary": summary, "claim_id": claim["id"]})
            decision = "approve" if answer.approved else "reject"
        await self.emit("claim.decided", {**claim, "decision": decision})


def _bank(claim):
    return {"paid": claim["id"]}


async def pay(env, agent):
    claim = env.payload
    if claim["decision"] == "approve":
        await agent.effect("tool.bank", _bank, claim)
        await agent.emit("claim.paid", {"id": claim["id"]})


def all_decided(summary):
    decided = summary.topics.get("claim.decided", 0)
    return decided == summary.inputs or f"actual {decided} decided of {summary.inputs}"
'''

SCENARIO = """\
version: 1
name: claims
seed: 7
input:
  kind: jsonl
  path: claims.jsonl
  topic: claim.received
  key: id
  label: expected
  malformed_topic: claim.rejected_input
  validate: "claims_agents:problem"
{rate}approvals: {{timeout: 120, default: reject, auto: {{approve_after: 0.2}}}}
agents:
  intake:
    class: "claims_agents:Intake"
    subscribe: [claim.received]
  approver:
    class: "claims_agents:Approver"
    subscribe: [claim.checked]
    concurrency: {concurrency}
  payer:
    handler: "claims_agents:pay"
    subscribe: [claim.decided]
    retry: {{attempts: 1}}
    breaker: {{consecutive_failures: 1000, min_calls: 1000, window: 1000}}
{monitor}outcome:
  topics: [claim.decided]
  key: id
  fields: [decision]
faults:
  agents:
    payer: {{failure_rate: 0.3}}
{faults}expect:
  max_dlq: {max_dlq}
  dlq: {{failed: {{max: {max_dlq}}}}}
  topics: {{claim.decided: {{min: 1}}}}
  custom: ["claims_agents:all_decided"]
{transport}"""

#: Where a multi-process run puts the agents (the Observer and the Monitor stay with the
#: driver, which runs the scenario).
PLACEMENT = "nodes: {checks: [intake], desk: [approver], bank: [payer]}"


def placed(kind: str, **extra: object) -> str:
    """The ``transport:`` section running the team over ``kind`` (``zmq`` or ``nats``),
    each agent on its node (:data:`PLACEMENT`), with ``extra`` keys (``ack_wait: 2``)."""
    where = {"zmq": 'broker: "tcp://127.0.0.1:0"', "nats": "server: auto"}[kind]
    more = "".join(f", {k}: {v}" for k, v in extra.items())
    return f"transport: {{kind: {kind}, {where}, {PLACEMENT}{more}}}\n"


def write_team(
    folder: Path,
    *,
    transport: str = "",
    kill: str | None = None,
    monitor: bool = True,
    concurrency: int = 1,
    rate: float | None = None,
    max_dlq: int = 100,
    name: str = "claims.yaml",
) -> Path:
    """The team's folder (agents module, claims, scenario ``name``); returns the scenario's
    path. ``transport``: a :func:`placed` section (none: one process); ``kill``: the node
    ``faults.kill_node`` SIGKILLs, as ``"desk, at: 2"``; ``concurrency``: the Approver's;
    ``rate``: the input's records per second (none: as fast as the bus takes them);
    ``max_dlq``: the bound of ``expect.max_dlq`` and of its ``failed`` dead letters."""
    (folder / "claims_agents.py").write_text(textwrap.dedent(AGENTS).lstrip())
    lines = [
        json.dumps(
            {
                "id": f"C-{i:02d}",
                "amount": 200.0 + 10 * i if i % 2 == 0 else 5_000.0 + 100 * i,
                "expected": {"decision": "approve"},
            }
        )
        for i in range(CLAIMS)
    ]
    lines.insert(10, json.dumps({"id": "C-BAD", "expected": {"decision": "reject"}}))
    lines.insert(20, "this line is not JSON")
    (folder / "claims.jsonl").write_text("\n".join(lines) + "\n")
    path = folder / name
    path.write_text(
        SCENARIO.format(
            concurrency=concurrency,
            max_dlq=max_dlq,
            rate="" if rate is None else f"  rate: {rate}\n",
            monitor="  monitor: {}\n" if monitor else "",
            faults="" if kill is None else f"  kill_node: {{node: {kill}}}\n",
            transport=transport,
        )
    )
    return path


def run_killed(folder: Path, path: Path, node: str) -> tuple[int, dict[str, Any]]:
    """``pantheon run --json`` of the team at ``path``, whose scenario kills ``node``: its
    exit code and summary, checked to say the node was killed. Orphaned processes' logs
    go under ``folder``."""
    proc = pantheon(
        "run", str(path), "--json", "--store", "s.db", cwd=folder,
        env=os.environ | {"TMPDIR": str(folder)},
    )  # fmt: skip
    assert proc.stdout.strip(), proc.stderr
    summary: dict[str, Any] = json.loads(proc.stdout)
    assert summary["nodes"][node]["status"] == "killed", summary["nodes"]
    return proc.returncode, summary
