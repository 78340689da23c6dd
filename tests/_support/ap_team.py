"""An accounts-payable team, written into a test's folder as a user would write one: a third
domain (neither the support desk nor on-call) for the record's tests.

Invoices come in from a JSONL file with their ground truth (``expected.decision``). The
``coder`` asks a model (an OpenAI-compatible server; the tests start a
:class:`pantheon.testing.ModelServer`) for the invoice's ledger code; the ``approver``
approves invoices up to ``auto_limit``, holds the ones above it for review, and asks a person
(``approve()``) about any over ``ask_over``. Its outcome is declared (``invoice.decided``,
keyed by ``invoice_id``, deciding ``decision``); a custom check fails when more than two
invoices are held. The scenario as written holds everything over 1,000 EUR, which the labels
say is wrong below 5,000: the run fails ``min_accuracy`` and the custom check, and the
overlay :data:`FIX` (``auto_limit: 5000``) is the change that fixes both.
"""

from __future__ import annotations

import json
import textwrap
from pathlib import Path
from typing import Any

#: The overlay that fixes the team: approve without review up to 5,000.
FIX = "agents:\n  approver:\n    settings: {auto_limit: 5000}\n"

#: (amount, expected decision) per invoice: 10 small, 8 mid-sized (wrongly held as written),
#: 2 large ones the team holds rightly, 2 over the asking bound (a person approves them).
AMOUNTS: list[tuple[float, str]] = (
    [(120.0 + 37 * i, "approve") for i in range(10)]
    + [(1_500.0 + 300 * i, "approve") for i in range(8)]
    + [(12_000.0, "hold"), (31_000.0, "hold")]
    + [(72_000.0, "approve"), (64_500.0, "approve")]
)

AGENTS = '''
"""The accounts-payable team's agents."""

from __future__ import annotations

import json

from agents import Agent, AgentSettings


class Coder(Agent):
    """Asks the model for the invoice's ledger code."""

    async def handle(self, env):
        inv = env.payload
        answer = await self.chat(
            [
                {"role": "system", "content": "Answer with the ledger code as JSON."},
                {"role": "user", "content": f"{inv['vendor']}: {inv['description']}"},
            ],
            response_format={"type": "json_object"},
        )
        gl = json.loads(answer.content)["gl"]
        await self.emit("invoice.coded", {**inv, "gl": gl})


class Approver(Agent):
    """Approves up to auto_limit, holds above it, asks a person above ask_over."""

    class Settings(AgentSettings):
        auto_limit: float = 1_000.0
        ask_over: float = 50_000.0

    async def handle(self, env):
        inv = env.payload
        amount = inv["amount"]
        if amount > self.settings.ask_over:
            summary = f"pay {amount:,.2f} EUR to {inv['vendor']} ({inv['id']})"
            answer = await self.approve({"summary": summary, "invoice_id": inv["id"]})
            decision = "approve" if answer.approved else "reject"
        elif amount > self.settings.auto_limit:
            decision = "hold"
            await self.emit("invoice.held", {"invoice_id": inv["id"], "amount": amount})
        else:
            decision = "approve"
        await self.emit(
            "invoice.decided",
            {"invoice_id": inv["id"], "decision": decision, "gl": inv["gl"]},
        )


def few_holds(summary):
    held = summary.topics.get("invoice.held", 0)
    return held <= 2 or f"{held} invoices held for review (at most 2)"
'''

SCENARIO = """\
version: 1
name: payables
description: Code and approve supplier invoices; a person approves the largest.
seed: 5

provider:
  kind: openai
  base_url: {base_url}
  model: ledger-coder
  api_key_env: ""
  max_retries: 0

approvals:
  timeout: 30
  default: reject
  poll: 0.05
  auto: {{approve_after: 0, by: controller}}

input:
  kind: jsonl
  path: invoices.jsonl
  key: id
  label: expected
  topic: invoice.received

agents:
  coder:
    class: "ap_agents:Coder"
    subscribe: [invoice.received]
  approver:
    class: "ap_agents:Approver"
    subscribe: [invoice.coded]
    concurrency: 4

outcome:
  topics: [invoice.decided]
  key: invoice_id
  fields: [decision]
  label: expected

expect:
  zero_lost: true
  dlq: {{failed: {{max: 0}}}}
  min_accuracy: 0.9
  custom: ["ap_agents:few_holds"]
"""


def ledger_code(body: dict[str, Any]) -> str:
    """The model server's answer: a ledger code by the words of the invoice."""
    text = json.dumps(body.get("messages", []))
    return json.dumps({"gl": "6200" if "licence" in text else "6100"})


def write_team(folder: Path, base_url: str) -> Path:
    """The team's folder (scenario, agents module, invoices); returns the scenario's path."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        {
            "id": f"INV-{n:02d}",
            "vendor": f"vendor-{n % 5}",
            "description": "software licence" if n % 3 == 0 else "office supplies",
            "amount": amount,
            "expected": {"decision": decision},
        }
        for n, (amount, decision) in enumerate(AMOUNTS, start=1)
    ]
    (folder / "invoices.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    (folder / "ap_agents.py").write_text(textwrap.dedent(AGENTS).lstrip())
    path = folder / "payables.yaml"
    path.write_text(SCENARIO.format(base_url=base_url))
    (folder / "changes.yaml").write_text(FIX)
    return path


def wrongly_held() -> list[str]:
    """The invoices the team as written holds and the labels approve (what FIX moves)."""
    return [
        f"INV-{n:02d}"
        for n, (amount, decision) in enumerate(AMOUNTS, start=1)
        if 1_000 < amount <= 5_000 and decision == "approve"
    ]
